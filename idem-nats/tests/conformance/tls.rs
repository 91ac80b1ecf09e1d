//! NATS over TLS: a private `nats-server` that speaks TLS only, with a certificate the test
//! generates (`servers::tls::Certs`: an authority, the server's certificate for `localhost`
//! and `127.0.0.1`). The idem consumer and the outbox publisher, trusting that authority, work
//! over `tls://` (every message applies once, poison ones are dead-lettered, every payment
//! arrives once, nothing is left unsettled); a client trusting another authority fails at
//! `connect`, within seconds, with an error that says TLS and certificate.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idem::consume::json;
use idem::nats::async_nats::{self, jetstream, HeaderMap};
use idem::nats::{headers, OutboxPublisher, Source};
use idem::outbox::Relay;
use idem::Outcome;
use idem_testkit::backends::Sqlite;
use idem_testkit::broker::harness;
use idem_testkit::broker::model::{self, Event, Order};
use idem_testkit::servers::tls::Certs;
use idem_testkit::servers::NatsServer;
use idem_testkit::Kit;

const STREAM: &str = "ORDERS";
const CONSUMER: &str = "workers";

/// Connects the consumer and the outbox's publisher to `url` (`tls://host:port`), trusting the
/// authority in the PEM file `ca` (the book's example).
async fn connect(
    url: &str,
    ca: std::path::PathBuf,
) -> Result<(Source, OutboxPublisher), idem::nats::Error> {
    // ANCHOR: tls
    // TLS required, the server's certificate checked against `ca` (a PEM file); add
    // `.add_client_certificate(cert, key)` where the server verifies clients.
    let options = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(ca)
        .connection_timeout(Duration::from_secs(5));
    let source = Source::builder(url, "ORDERS", "workers")
        .options(options.clone())
        .connect()
        .await?;
    let publisher = OutboxPublisher::builder(url)
        .options(options)
        .connect()
        .await?;
    // ANCHOR_END: tls
    Ok((source, publisher))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
}

/// The messages of `stream`: headers.
async fn stored(js: &jetstream::Context, stream: &str) -> Vec<HeaderMap> {
    let mut stream = js.get_stream(stream).await.unwrap();
    let last = stream.info().await.unwrap().state.last_sequence;
    let mut all = Vec::new();
    for seq in 1..=last {
        if let Ok(message) = stream.get_raw_message(seq).await {
            all.push(message.headers);
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn over_tls_the_consumer_and_outbox_work_and_a_wrong_ca_fails_quickly_naming_tls() {
    let began = Instant::now();
    let dir = std::env::temp_dir().join(harness::unique_name("idem_nats_certs"));
    let certs = Certs::generate(&dir);
    let Some(server) = NatsServer::start_tls("idem_nats_tls", "NATS TLS test", &certs) else {
        return;
    };
    assert!(server.url().starts_with("tls://"), "{}", server.url());
    let Some(kit) = Kit::<Sqlite>::open().await else {
        return;
    };
    model::schema(&kit).await;

    // A client that trusts another authority: an error naming TLS and the certificate, at
    // once (the handshake fails; nothing to wait for).
    for what in ["consumer", "outbox publisher"] {
        let wrong = async_nats::ConnectOptions::new()
            .require_tls(true)
            .add_root_certificates(certs.other_ca())
            .connection_timeout(Duration::from_secs(5));
        let started = Instant::now();
        let limit = Duration::from_secs(10);
        let err = if what == "consumer" {
            let connect = Source::builder(server.url(), STREAM, CONSUMER)
                .options(wrong)
                .connect();
            harness::within(limit, "a connect trusting the wrong CA", connect)
                .await
                .expect_err("a server whose CA the client does not trust")
        } else {
            let connect = OutboxPublisher::builder(server.url())
                .options(wrong)
                .connect();
            harness::within(limit, "a connect trusting the wrong CA", connect)
                .await
                .expect_err("a server whose CA the client does not trust")
        };
        let took = started.elapsed();
        let text = err.to_string();
        eprintln!("{what} trusting the wrong CA: failed after {took:?}: {text}");
        assert!(matches!(err, idem::nats::Error::Tls { .. }), "{err:?}");
        assert!(text.contains("TLS"), "the error names TLS: {text}");
        assert!(
            text.to_lowercase().contains("certificate"),
            "the error names the certificate: {text}"
        );
        assert!(
            text.contains(&server.url()),
            "the error names the URL: {text}"
        );
        assert!(took < Duration::from_secs(3), "failed only after {took:?}");
    }
    // A client without the server's CA (the system's roots) fails the same way.
    let plain = Source::builder(server.url(), STREAM, CONSUMER)
        .options(async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(5)))
        .connect();
    let err = harness::within(Duration::from_secs(10), "a connect without the CA", plain)
        .await
        .expect_err("a server whose CA the client does not trust");
    assert!(err.to_string().contains("TLS"), "{err}");

    // The streams, over TLS.
    let admin = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(certs.ca())
        .connect(server.url())
        .await
        .unwrap();
    let js = jetstream::new(admin);
    for (name, subject) in [
        (STREAM.to_string(), "orders.>".to_string()),
        (
            "ORDERS_DLQ".to_string(),
            Source::default_dead_letter_subject(STREAM, CONSUMER),
        ),
        ("PAYMENTS".to_string(), "pay.>".to_string()),
    ] {
        js.create_stream(jetstream::stream::Config {
            name,
            subjects: vec![subject],
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let config = jetstream::consumer::pull::Config {
        durable_name: Some(CONSUMER.into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(5),
        ..Default::default()
    };
    js.create_consumer_on_stream(config, STREAM).await.unwrap();

    let (source, publisher) = connect(&server.url(), certs.ca()).await.unwrap();
    assert_eq!(source.dead_letter_stream(), Some("ORDERS_DLQ"));

    // 60 distinct events (and copies) with 2 poison ones; 20 orders through the outbox.
    let mut events = model::generate(harness::seed(), 60);
    events.insert(10, model::poison("poison-a"));
    events.insert(40, model::poison("poison-b"));
    for (i, event) in events.iter().enumerate() {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("in-{i}").as_str());
        headers.insert(headers::MESSAGE_ID, event.id());
        let payload = event.raw().payload;
        js.publish_with_headers("orders.in", headers, payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let mut payment_ids = Vec::new();
    for i in 0..20 {
        let order = Order {
            id: format!("order-{i}"),
            customer: format!("customer-{}", i % 3),
            destination: "pay.orders".into(),
            fail: false,
        };
        match model::on_order(&kit.pool, &order).await {
            Ok(Outcome::Applied(id)) => payment_ids.push(id),
            other => panic!("{order:?}: {other:?}"),
        }
    }
    let mut relay = Relay::new(kit.pool.clone(), publisher);
    let mut published = 0;
    loop {
        match relay.step().await {
            Ok(0) => break,
            Ok(n) => published += n,
            Err(err) => panic!("a relay pass failed: {err}"),
        }
    }
    assert_eq!(published, 20);
    assert_eq!(model::unsent(&kit).await, 0);

    let d = kit.dialect;
    let js_done = js.clone();
    let counts = harness::within(
        Duration::from_secs(60),
        "the consumer over TLS",
        harness::consumer(kit.pool.clone(), 10).run(
            source.deliveries(),
            json::<Event>,
            async move |b, e| model::handle_counted(b, e, &d).await,
            async move {
                loop {
                    let mut consumer: jetstream::consumer::PullConsumer = js_done
                        .get_consumer_from_stream(CONSUMER, STREAM)
                        .await
                        .unwrap();
                    let info = consumer.info().await.unwrap();
                    if info.num_pending == 0 && info.num_ack_pending == 0 {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        ),
    )
    .await;
    source.close().await.unwrap();

    model::verify(&kit, &model::oracle(&events)).await;
    assert_eq!(counts.dead_lettered, 2, "{counts:?}");
    assert_eq!(counts.settle_failures, 0, "{counts:?}");
    let mut dead: Vec<String> = stored(&js, "ORDERS_DLQ")
        .await
        .iter()
        .map(|h| {
            assert_eq!(header(h, headers::REASON), Some("poisoned"));
            header(h, headers::MESSAGE_ID)
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    dead.sort();
    assert_eq!(dead, ["poison-a", "poison-b"]);
    let mut arrived: BTreeMap<String, usize> = BTreeMap::new();
    for h in stored(&js, "PAYMENTS").await {
        let id = header(&h, "Nats-Msg-Id").unwrap_or_default().to_string();
        *arrived.entry(id).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = payment_ids.into_iter().map(|id| (id, 1)).collect();
    assert_eq!(arrived, expected, "each payment once");
    let mut consumer: jetstream::consumer::PullConsumer =
        js.get_consumer_from_stream(CONSUMER, STREAM).await.unwrap();
    let info = consumer.info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
    eprintln!(
        "NATS over TLS: {} input messages, 20 payments; counts {counts:?}; whole test {:?}",
        events.len(),
        began.elapsed()
    );
    kit.close().await;
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
