//! Lag: the broker tells how far a source is behind ([`Source::lag`]): what was published and
//! not consumed, then nothing once it was.

use std::time::Duration;

use idem::consume::{Lag, Source};

use crate::broker::harness::{self, assert_unsettled, consume_with, consumer, within};
use crate::broker::model::{self};
use crate::broker::{Broker, Settings, Spec};
use crate::Backend;

/// How many messages the rule publishes.
const N: u64 = 12;

/// The prefetch of the source that reads the lag before consuming: RabbitMQ pushes up to that
/// many messages to a consumer as soon as it is connected, and counts them as unacknowledged,
/// which it does not tell, rather than ready.
const PREFETCH: usize = 1;

/// The lag of a connected source of `b`, then the source closed.
async fn lag_now<B: Broker>(b: &B, consumer: &str) -> Vec<Lag> {
    let source = b.source(Settings::new(PREFETCH, consumer)).await;
    let lag = within(Duration::from_secs(30), "reading the lag", source.lag())
        .await
        .unwrap_or_else(|err| panic!("{}: reading the lag failed: {err}", B::NAME));
    within(Duration::from_secs(40), "close", source.close())
        .await
        .expect("the source closes cleanly");
    lag
}

/// Every entry is of the rule's input, partitions (if any) each once.
fn check_shape<B: Broker>(b: &B, lag: &[Lag]) {
    assert!(!lag.is_empty(), "{}: no lag at all", B::NAME);
    let mut partitions: Vec<Option<i32>> = lag.iter().map(|l| l.partition).collect();
    partitions.sort_unstable();
    partitions.dedup();
    assert_eq!(partitions.len(), lag.len(), "{}: {lag:?}", B::NAME);
    for one in lag {
        assert_eq!(one.source, b.input(), "{}: {lag:?}", B::NAME);
        assert!(
            one.undelivered.is_some(),
            "{}: the broker could not tell: {lag:?}",
            B::NAME
        );
    }
}

/// Sums of the undelivered and of the unacked messages (`None` when the broker tells no
/// unacked count).
fn sums(lag: &[Lag]) -> (u64, Option<u64>) {
    let undelivered = lag.iter().filter_map(|l| l.undelivered).sum();
    let unacked = lag.iter().map(|l| l.unacked).sum::<Option<u64>>();
    (undelivered, unacked)
}

/// 12 messages published to a fresh input: a source connected to it reads them all as behind
/// (not delivered yet, or where the broker pushed some ahead at connect, delivered and not
/// acked: together 12; RabbitMQ, which tells only the ready ones, at least 12 minus the
/// prefetch of 1). Once a consumer applied and settled all 12, a source reads 0 undelivered
/// and 0 unacked (where told); per partition on Kafka, each partition once.
pub async fn reads_what_waits_then_nothing_once_consumed<B: Broker, D: Backend>() {
    harness::with::<B, D>(Spec::new("lag"), async |b, k| {
        model::schema(k).await;
        let events: Vec<_> = (0..N as i64)
            .map(|i| model::credit(&format!("lag{i}"), i % 3, i + 1))
            .collect();
        b.publish(&model::raws(&events)).await;
        assert_unsettled(b, N).await;

        let before = lag_now(b, "lag").await;
        eprintln!("{}: before: {before:?}", B::NAME);
        check_shape(b, &before);
        match sums(&before) {
            (undelivered, Some(unacked)) => {
                assert_eq!(undelivered + unacked, N, "{}: {before:?}", B::NAME)
            }
            (undelivered, None) => assert!(
                (N - PREFETCH as u64..=N).contains(&undelivered),
                "{}: {before:?}",
                B::NAME
            ),
        }

        let (counts, _) = consume_with(
            b,
            ("the consumer", Settings::new(20, "lag")),
            Duration::from_secs(60),
            consumer(k.pool.clone(), 4),
            async |batch, e| model::handle(batch, e, &k.dialect).await,
            move |acked, _| acked >= N,
        )
        .await;
        assert_eq!(counts.applied, N, "{counts:?}");
        assert_eq!(model::applied(k).await, N);
        assert_unsettled(b, 0).await;

        let after = lag_now(b, "lag").await;
        eprintln!("{}: after: {after:?}", B::NAME);
        check_shape(b, &after);
        let (undelivered, unacked) = sums(&after);
        assert_eq!(undelivered, 0, "{}: {after:?}", B::NAME);
        assert!(unacked.is_none_or(|n| n == 0), "{}: {after:?}", B::NAME);
        let partitions = |lag: &[Lag]| lag.iter().map(|l| l.partition).collect::<Vec<_>>();
        assert_eq!(partitions(&after), partitions(&before), "{}", B::NAME);
    })
    .await;
}
