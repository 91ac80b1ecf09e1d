//! `max_deliveries`: a delivery the broker delivered too often is dead-lettered without
//! running, where the broker counts deliveries.

use crate::broker::fields;
use crate::broker::harness::{self, assert_unsettled, consume, consumer, dead_letters};
use crate::broker::model::{self, Event};
use crate::broker::{Broker, Settings, Spec};
use crate::Backend;

/// A message the handler always fails on (no `max_attempts`) beside 5 good ones, under
/// `max_deliveries(3)`: it runs on its first 3 deliveries, and its 4th is dead-lettered as
/// `too_many_deliveries` with the broker's count (4) and its message id, without running; the
/// good ones apply once, and nothing is left unsettled.
pub async fn over_the_limit_is_dead_lettered_without_running<B: Broker, D: Backend>() {
    assert!(
        B::COUNTS_DELIVERIES,
        "{} does not count deliveries: invoke the suite without(max_deliveries = \"…\")",
        B::NAME
    );
    let spec = Spec {
        counted: true,
        ..Spec::new("maxdel")
    };
    harness::with::<B, D>(spec, async |b, k| {
        model::schema(k).await;
        let mut events: Vec<Event> = (0..5)
            .map(|i| model::credit(&format!("ok{i}"), i % 2, i + 1))
            .collect();
        events.insert(2, model::poison("doomed"));
        b.publish(&model::raws(&events)).await;

        let (counts, _) = consume(
            b,
            k,
            ("the consumer", Settings::new(10, "maxdel")),
            consumer(k.pool.clone(), 4).max_deliveries(3),
            |acked, dead_lettered| acked >= 5 && dead_lettered >= 1,
        )
        .await;
        assert_eq!(
            (counts.applied, counts.failed, counts.dead_lettered),
            (5, 3, 1),
            "{counts:?}"
        );
        assert_eq!(counts.settle_failures, 0, "{counts:?}");
        assert_unsettled(b, 0).await;
        let letters = dead_letters(b, 1).await;
        assert_eq!(letters.len(), 1, "{letters:?}");
        let letter = &letters[0];
        assert_eq!(letter.id.as_deref(), Some("doomed"), "{letter:?}");
        assert_eq!(letter.reason(), "too_many_deliveries", "{letter:?}");
        assert_eq!(letter.field(fields::DELIVERIES), Some("4"), "{letter:?}");
        assert_eq!(letter.payload, model::poison("doomed").raw().payload);
        model::verify(k, &model::oracle(&events)).await;
    })
    .await;
}
