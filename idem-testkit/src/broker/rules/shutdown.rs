//! A graceful shutdown drains and settles: nothing lost, nothing applied left in flight.

use std::time::{Duration, Instant};

use crate::broker::harness::{self, assert_unsettled, consume, consume_with, consumer};
use crate::broker::model::{self, Event};
use crate::broker::{Broker, Settings, Spec};
use crate::Backend;

/// 600 credits, slow handlers (2 ms each), deliveries taken ahead (prefetch 60): the shutdown
/// signal comes after 150 acks, mid-stream. `Consumer::run` stops taking, finishes and settles
/// the batches in flight and gives back the rest; `close` leaves. Nothing is lost: every
/// message not applied is still the broker's, and where the broker settles each delivery alone
/// nothing applied is (with offsets, what was settled past the first gap comes back, as
/// duplicates). A second run under the same consumer name finishes soon (not after the
/// broker's redelivery time for dead consumers, here 30 s): every message applied once, nothing
/// left unsettled.
pub async fn mid_stream_drains_settles_and_a_second_run_finishes<B: Broker, D: Backend>() {
    let spec = Spec {
        redelivery: Duration::from_secs(30),
        ..Spec::new("shutdown")
    };
    harness::with::<B, D>(spec, async |b, k| {
        model::schema(k).await;
        let total = 600_u64;
        let events: Vec<Event> = (0..total as i64)
            .map(|i| model::credit(&format!("m{i}"), i % 5, 1))
            .collect();
        b.publish(&model::raws(&events)).await;

        let (first, tally) = consume_with(
            b,
            ("the first run", Settings::new(60, "w1")),
            Duration::from_secs(60),
            consumer(k.pool.clone(), 10),
            async |batch, e| {
                tokio::time::sleep(Duration::from_millis(2)).await;
                model::handle(batch, e, &k.dialect).await
            },
            |acked, _| acked >= 150,
        )
        .await;
        eprintln!("{}: first run: {first:?}", B::NAME);
        let applied = model::applied(k).await;
        assert_eq!(first.applied, applied, "{first:?}");
        assert!((150..total).contains(&applied), "{first:?}");
        assert_eq!(tally.acked(), applied, "every delivery applied was acked");
        assert_eq!(first.settle_failures, 0, "{first:?}");
        let left = if B::SETTLES_EACH {
            assert_unsettled(b, total - applied).await;
            total - applied
        } else {
            b.gone().await;
            let left = b.unsettled().await;
            assert!(
                (total - applied..=total).contains(&left),
                "{left} unsettled of {total}, {applied} applied"
            );
            left
        };

        let started = Instant::now();
        let (second, _) = consume(
            b,
            k,
            ("the second run", Settings::new(60, "w1")),
            consumer(k.pool.clone(), 50),
            move |acked, _| acked >= left,
        )
        .await;
        eprintln!("{}: second run: {second:?}", B::NAME);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "what the first run gave back waited for the redelivery of dead consumers: {:?}",
            started.elapsed()
        );
        assert_eq!(first.applied + second.applied, total, "{second:?}");
        // What comes back applied is exactly what was applied and left unsettled.
        assert_eq!(second.duplicate, left - (total - applied), "{second:?}");
        let ledger = model::ledger(k).await;
        assert_eq!(ledger.len() as u64, total);
        assert!(ledger.values().all(|n| *n == 1));
        model::verify(k, &model::oracle(&events)).await;
        assert_unsettled(b, 0).await;
    })
    .await;
}
