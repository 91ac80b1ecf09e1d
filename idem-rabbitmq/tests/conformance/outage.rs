//! The database stops answering mid-stream while a RabbitMQ consumer runs.
//!
//! A private PostgreSQL cluster of the test's own (initdb into a temporary folder, its own port;
//! the machine's shared server is never touched) is stopped dead (`pg_ctl stop -m immediate`:
//! no checkpoint, WAL recovery on restart) once a quarter of the messages are acked, left down
//! for a few seconds, and started again. The loop must wait the outage out in place: no message
//! is dead-lettered or counted as an attempt for it, and once the database is back every
//! message applies exactly once (the database equals the oracle, the queue is drained, the
//! dead-letter queue is empty). A batch whose COMMIT reached the disk as the server died, but
//! whose reply never came, runs again and finds its records: the loop counts those as
//! duplicates, and the test bounds them (at most one batch per slot). Skipped, saying why, where
//! no PostgreSQL server binaries are installed (CI must have them) or no broker answers.

use std::time::{Duration, Instant};

use idem::consume::{json, Consumer};
use idem_testkit::backends::Postgres;
use idem_testkit::broker::harness::{self, track, within, Tally};
use idem_testkit::broker::model::{self, Event};
use idem_testkit::broker::{Broker, Spec};
use idem_testkit::servers::PostgresServer;
use idem_testkit::{Dialect, Kit};
use sqlx::postgres::PgPoolOptions;

use crate::Rabbit;

/// Distinct events; with 30% duplicates, about 2,900 messages.
const UNIQUE: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn a_database_outage_mid_stream_dead_letters_nothing_and_everything_applies_once_it_is_back()
{
    let spec = Spec {
        counted: true,
        ..Spec::new("outage")
    };
    // A quorum queue counts deliveries: `max_deliveries(2)` dead-letters any message the loop
    // put back even once, so a requeue for the outage would show as a dead letter.
    let Some(b) = Rabbit::create(spec).await else {
        return;
    };
    let Some(cluster) = PostgresServer::start("idem_rmq_outage", "database outage test") else {
        b.teardown().await;
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(cluster.options())
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    // The kit's business tables and queries, on the private cluster's database.
    let kit = Kit::<Postgres> {
        pool: pool.clone(),
        dialect: Dialect::postgres(),
    };
    model::schema(&kit).await;

    let events = model::generate(harness::seed(), UNIQUE);
    let oracle = model::oracle(&events);
    let total = events.len() as u64;
    b.publish(&model::raws(&events)).await;

    let tally = Tally::new();
    let deliveries = b
        .builder()
        .prefetch(80)
        .connect()
        .await
        .unwrap()
        .deliveries();
    let d = kit.dialect;
    let run = Consumer::new(pool.clone())
        .batch(20)
        .concurrency(2)
        .max_deliveries(2)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(500))
        .run(
            track(deliveries, &tally),
            json::<Event>,
            async |batch, e| model::handle(batch, e, &d).await,
            tally
                .clone()
                .until(move |acked, dead| acked + dead >= total),
        );
    let outage = {
        let tally = tally.clone();
        let cluster = &cluster;
        async move {
            tally
                .clone()
                .until(move |acked, _| acked >= total / 4)
                .await;
            let stopped = Instant::now();
            tokio::task::block_in_place(|| cluster.crash());
            let acked_at_stop = tally.acked();
            tokio::time::sleep(Duration::from_secs(3)).await;
            let acked_while_down = tally.acked() - acked_at_stop;
            tokio::task::block_in_place(|| cluster.restart());
            eprintln!(
                "database down for {:?} at {acked_at_stop} acked; {acked_while_down} acked while down",
                stopped.elapsed()
            );
            acked_while_down
        }
    };
    let (counts, acked_while_down) = within(Duration::from_secs(240), "the consumer", async {
        tokio::join!(run, outage)
    })
    .await;
    eprintln!("{total} messages: {counts:?}");

    // The loop saw the outage and waited it out in place (acks right after the stop belong to
    // commits made before it)...
    eprintln!("acked while the database was down: {acked_while_down}");
    assert!(counts.store_pauses >= 1, "{counts:?}");
    // ...so nothing was dead-lettered for it, and every message applied once it was back.
    assert_eq!(counts.dead_lettered, 0, "{counts:?}");
    assert_eq!(tally.dead_lettered(), 0);
    assert_eq!(tally.acked(), total);
    assert_eq!(counts.applied + counts.duplicate + counts.stale, total);
    model::verify(&kit, &oracle).await;
    // Each message applied once (`verify`); the loop reports as applied all of them but those
    // of a batch whose COMMIT went through as the server stopped and whose reply never came:
    // run again once it was back, that batch found its records (`Duplicate`). At most one
    // batch per slot (2 × 20) can be caught so.
    let in_database = model::applied(&kit).await;
    let ambiguous = in_database.checked_sub(counts.applied).unwrap_or_else(|| {
        panic!(
            "the loop counted {} applied, the database holds {in_database}",
            counts.applied
        )
    });
    eprintln!(
        "{ambiguous} applications committed as the server stopped, then reported as duplicates"
    );
    assert!(
        ambiguous <= counts.duplicate && ambiguous <= 2 * 20,
        "{ambiguous} applications the loop did not count: {counts:?}"
    );
    b.settles_at(&b.queue, 0).await;
    assert_eq!(b.depth(&b.dlq()).await, (0, 0));

    b.teardown().await;
    pool.close().await;
    drop(cluster);
}
