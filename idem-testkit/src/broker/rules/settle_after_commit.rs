//! Settle only after commit: a consumer killed between its commit and its settle leaves its
//! messages unsettled, and their redelivery is a duplicate.

use std::time::Duration;

use crate::broker::child::{Spawn, BATCH, CONSUMER, KILL_AT_ACK};
use crate::broker::harness::{self, assert_unsettled, consume, consumer, Reopen};
use crate::broker::model::{self, Event};
use crate::broker::{Broker, Settings, Spec};

/// A consumer process (batches of 4) SIGKILLs itself at its first ack: its batch committed,
/// the broker heard nothing. Nothing is settled: every message is still the broker's; a second
/// consumer (another name: it takes over what the dead one held) gets the committed ones again
/// as duplicates and applies the others, each once, and nothing is left unsettled.
pub async fn a_kill_between_commit_and_settle_redelivers_a_duplicate<B: Broker, D: Reopen>() {
    harness::with::<B, D>(Spec::new("ack"), async |b, k| {
        model::schema(k).await;
        let events: Vec<Event> = (0..12)
            .map(|i| model::credit(&format!("a{i}"), i % 3, i + 1))
            .collect();
        let total = events.len() as u64;
        b.publish(&model::raws(&events)).await;

        let mut child = Spawn::new::<B, D>("consumer", b, &k.pool)
            .await
            .env(CONSUMER, "doomed")
            .env(BATCH, 4)
            .env(KILL_AT_ACK, 1)
            .spawn();
        let status = child.wait(Duration::from_secs(60)).await;
        child.assert_killed(status);
        let committed = model::applied(k).await;
        assert!(committed >= 1, "the child committed before its ack");
        assert_unsettled(b, total).await;

        let (counts, _) = consume(
            b,
            k,
            ("the second consumer", Settings::new(10, "heir")),
            consumer(k.pool.clone(), 4),
            move |acked, _| acked >= total,
        )
        .await;
        // The redeliveries of the committed messages are duplicates, acked.
        assert_eq!(counts.duplicate, committed, "{counts:?}");
        assert_eq!(counts.applied, total - committed, "{counts:?}");
        assert_eq!(counts.settle_failures, 0, "{counts:?}");
        let ledger = model::ledger(k).await;
        assert_eq!(ledger.len() as u64, total, "{ledger:?}");
        assert!(ledger.values().all(|n| *n == 1), "{ledger:?}");
        model::verify(k, &model::oracle(&events)).await;
        assert_unsettled(b, 0).await;
    })
    .await;
}
