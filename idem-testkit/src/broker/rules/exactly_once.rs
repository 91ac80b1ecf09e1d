//! Exactly once under duplicates and reordering: the broker's consumer applies a stream with
//! copies and swapped neighbours once, in batches and several at a time.

use std::time::Duration;

use idem::consume::Consumer;

use crate::broker::harness::{self, assert_unsettled, consume_with};
use crate::broker::model::{self};
use crate::broker::{Broker, Settings, Spec};
use crate::Backend;

/// A stream of credits (key only) and status changes (key + version + entity) with about 30%
/// copies and swapped neighbours, consumed in batches of 50, 4 at a time: every delivery is
/// acked once, each copy is a duplicate or stale, the database equals the exactly-once oracle,
/// and nothing is left unsettled or dead-lettered. 800 distinct events (14,000 with
/// `IDEM_SOAK=1`).
pub async fn duplicates_and_reordering_apply_once<B: Broker, D: Backend>() {
    harness::with::<B, D>(Spec::new("once"), async |b, k| {
        model::schema(k).await;
        let unique = if harness::soak() { 14_000 } else { 800 };
        let events = model::generate(harness::seed(), unique);
        let oracle = model::oracle(&events);
        let total = events.len() as u64;
        let copies = total - unique as u64;
        b.publish(&model::raws(&events)).await;
        assert_unsettled(b, total).await;

        let limit = Duration::from_secs(if harness::soak() { 900 } else { 180 });
        let (counts, tally) = consume_with(
            b,
            ("the consumer", Settings::new(200, "once")),
            limit,
            Consumer::new(k.pool.clone()).batch(50).concurrency(4),
            async |batch, e| model::handle(batch, e, &k.dialect).await,
            move |acked, _| acked >= total,
        )
        .await;
        eprintln!("{}: {total} messages: {counts:?}", B::NAME);

        // A copy of a stale version is stale again (stale writes no record); every other copy
        // is a duplicate.
        assert_eq!(
            counts.applied + counts.duplicate + counts.stale,
            total,
            "{counts:?}"
        );
        assert!(
            counts.duplicate <= copies && counts.applied <= unique as u64,
            "{counts:?}"
        );
        assert_eq!(model::applied(k).await, counts.applied, "{counts:?}");
        assert_eq!(
            (counts.dead_lettered, counts.failed, counts.settle_failures),
            (0, 0, 0),
            "{counts:?}"
        );
        assert_eq!(tally.acked(), total);
        assert_unsettled(b, 0).await;
        assert_eq!(b.dead_letters().await, vec![]);
        model::verify(k, &oracle).await;
    })
    .await;
}
