//! Readiness through an outage of the consumer's broker: a private `nats-server` with
//! JetStream (its own port and store), killed and started again, never the shared server. The
//! consumer checks every 500 ms; its readiness turns false within two check rounds of the kill
//! and true within two rounds of the restart, and every message, published before the outage
//! and after it (with copies), is applied once.

use std::time::Duration;

use idem::consume::{json, Health, NotReady};
use idem::nats::async_nats::{self, jetstream};
use idem::nats::Source;
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness;
use idem_testkit::broker::model::{self, Event};
use idem_testkit::servers::NatsServer;
use idem_testkit::Kit;

const STREAM: &str = "OUTAGE";
const CONSUMER: &str = "workers";
const EVERY: Duration = Duration::from_millis(500);

/// Waits until `ready()` is `Ok` (`want`) or `Err` (`!want`), and returns the number of the
/// check round whose result it read, with that result (read between two equal round counts).
async fn round_when(health: &Health, want: bool) -> (u64, Result<(), NotReady>) {
    let what = format!("readiness turning {want}");
    harness::within(Duration::from_secs(60), &what, async {
        loop {
            let before = health.checks();
            let ready = health.ready();
            if health.checks() == before && ready.is_ok() == want {
                return (before, ready);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// A JetStream context on the private server.
async fn jetstream(server: &NatsServer) -> jetstream::Context {
    jetstream::new(async_nats::connect(server.url()).await.unwrap())
}

async fn publish(js: &jetstream::Context, events: &[Event]) {
    for event in events {
        js.publish(format!("outage.{}", event.id()), event.raw().payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// The JetStream consumer's messages not yet delivered plus those delivered and not acked.
async fn unsettled(js: &jetstream::Context) -> u64 {
    let mut consumer: jetstream::consumer::PullConsumer =
        js.get_consumer_from_stream(CONSUMER, STREAM).await.unwrap();
    let info = consumer.info().await.unwrap();
    info.num_pending + info.num_ack_pending as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn ready_follows_a_broker_outage_within_two_checks_and_every_message_applies_once() {
    let Some(server) = NatsServer::start("idem_nats_outage", "NATS outage test") else {
        return;
    };
    let Some(kit) = Kit::<Sqlite>::open().await else {
        return;
    };
    model::schema(&kit).await;
    let js = jetstream(&server).await;
    js.create_stream(jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["outage.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let config = jetstream::consumer::pull::Config {
        durable_name: Some(CONSUMER.into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(5),
        ..Default::default()
    };
    js.create_consumer_on_stream(config, STREAM).await.unwrap();
    let before: Vec<Event> = (0..30)
        .map(|i| model::credit(&format!("before-{i}"), i % 4, 1 + i))
        .collect();
    publish(&js, &before).await;

    // The client tries to reconnect every 100 ms: readiness follows its connection.
    let options =
        async_nats::ConnectOptions::new().reconnect_delay_callback(|_| Duration::from_millis(100));
    let source = Source::builder(server.url(), STREAM, CONSUMER)
        .options(options)
        .prefetch(10)
        .expires(Duration::from_secs(1))
        .request_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let consumer = harness::consumer(kit.pool.clone(), 10)
        .health_of(&source)
        .health_every(EVERY);
    let health = consumer.health();
    assert_eq!(health.ready(), Err(NotReady::NotStarted));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let d = kit.dialect;
    let run = tokio::spawn(consumer.run(
        source.deliveries(),
        json::<Event>,
        async move |b, e| model::handle(b, e, &d).await,
        async {
            let _ = stopped.await;
        },
    ));
    let (_, ready) = round_when(&health, true).await;
    assert_eq!(ready, Ok(()));
    harness::eventually(
        "the first 30 applied",
        Duration::from_secs(60),
        async || model::applied(&kit).await == 30,
    )
    .await;

    let killed_at = health.checks();
    server.kill();
    let (round, why) = round_when(&health, false).await;
    assert!(
        round <= killed_at + 2,
        "not ready only at check round {round}, {} after the kill",
        round - killed_at
    );
    assert!(
        matches!(
            &why,
            Err(NotReady::Unreachable {
                database: None,
                broker: Some(_)
            })
        ),
        "{why:?}"
    );
    assert!(health.live().is_ok(), "an outage is not a stuck loop");

    server.restart();
    let back_at = health.checks();
    let (round, _) = round_when(&health, true).await;
    assert!(
        round <= back_at + 2,
        "ready again only at check round {round}, {} after the restart",
        round - back_at
    );

    // After the outage: 30 new messages and copies of 10 old ones.
    let js = jetstream(&server).await;
    let mut after: Vec<Event> = (0..30)
        .map(|i| model::credit(&format!("after-{i}"), i % 4, 100 + i))
        .collect();
    after.extend(before[..10].iter().cloned());
    publish(&js, &after).await;
    harness::eventually(
        "every message settled",
        Duration::from_secs(60),
        async || unsettled(&js).await == 0,
    )
    .await;
    let _ = stop.send(());
    let counts = run.await.unwrap();
    source.close().await.unwrap();
    assert_eq!(health.ready(), Err(NotReady::Stopped));

    let all: Vec<Event> = before.iter().chain(&after).cloned().collect();
    model::verify(&kit, &model::oracle(&all)).await;
    assert_eq!(model::applied(&kit).await, 60, "{counts:?}");
    assert!(
        counts.duplicate >= 10,
        "the copies are duplicates: {counts:?}"
    );
    kit.close().await;
}
