//! Poison and undecodable messages are dead-lettered with the reason, and the rest apply.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::broker::fields;
use crate::broker::harness::{self, assert_unsettled, consume_with, consumer, dead_letters};
use crate::broker::model::{self};
use crate::broker::{Broker, Raw, Settings, Spec};
use crate::Backend;

/// Among 20 good credits: 3 the handler always fails on (`max_attempts = 3`), an undecodable
/// payload and a credit with an empty key. Each poison one is tried 3 times, then
/// dead-lettered as `poisoned` with its attempts; the undecodable one as `undecodable` and the
/// empty key as `bad_key`, both at their first delivery. Each dead letter (at least once in
/// general; exactly once here, where nothing crashes) keeps the original's payload and
/// message id and says why (reason, detail) and where from; every good credit applies once,
/// and nothing is left unsettled.
pub async fn poison_undecodable_and_bad_keys_are_dead_lettered_with_the_reason<
    B: Broker,
    D: Backend,
>()
where
    D::Db: idem::store::Attempts,
{
    harness::with::<B, D>(Spec::new("dead"), async |b, k| {
        model::schema(k).await;
        let mut raws = Vec::new();
        let mut good = Vec::new();
        for i in 0..20 {
            let event = model::credit(&format!("ok{i}"), i % 3, i + 1);
            raws.push(event.raw());
            good.push(event);
            if i % 7 == 3 {
                raws.push(model::poison(&format!("poison{i}")).raw());
            }
        }
        raws.push(Raw {
            id: "garbled".into(),
            payload: b"{not json".to_vec(),
        });
        raws.push(Raw {
            id: "empty-key".into(),
            payload: model::credit("", 9, 1).raw().payload,
        });
        let expected: BTreeMap<&str, &str> = [
            ("poison3", "poisoned"),
            ("poison10", "poisoned"),
            ("poison17", "poisoned"),
            ("garbled", "undecodable"),
            ("empty-key", "bad_key"),
        ]
        .into();
        b.publish(&raws).await;

        let dead = expected.len() as u64;
        let (counts, _) = consume_with(
            b,
            ("the consumer", Settings::new(20, "dead")),
            Duration::from_secs(60),
            consumer(k.pool.clone(), 5),
            async |batch, e| model::handle_counted(batch, e, &k.dialect).await,
            move |acked, dead_lettered| acked >= 20 && dead_lettered >= dead,
        )
        .await;
        eprintln!("{}: {counts:?}", B::NAME);
        assert_eq!(counts.applied, 20, "{counts:?}");
        assert_eq!(counts.failed, 3 * 3, "each poison message failed 3 times");
        assert_eq!(counts.dead_lettered, dead, "{counts:?}");
        assert_eq!(counts.settle_failures, 0, "{counts:?}");
        assert_unsettled(b, 0).await;

        let letters = dead_letters(b, expected.len()).await;
        let mut seen = BTreeMap::new();
        for letter in &letters {
            let id = letter.id.clone().unwrap_or_else(|| {
                panic!("a dead letter without its original's message id: {letter:?}")
            });
            let original = raws
                .iter()
                .find(|r| r.id == id)
                .unwrap_or_else(|| panic!("a dead letter of nothing published: {letter:?}"));
            assert_eq!(letter.payload, original.payload, "{letter:?}");
            assert_eq!(
                Some(letter.reason()),
                expected.get(id.as_str()).copied(),
                "{letter:?}"
            );
            assert!(
                letter.field(fields::DETAIL).is_some_and(|d| !d.is_empty()),
                "{letter:?}"
            );
            assert_eq!(
                letter.field(fields::SOURCE),
                Some(&*b.input()),
                "{letter:?}"
            );
            if letter.reason() == "poisoned" {
                assert_eq!(letter.field(fields::ATTEMPTS), Some("3"), "{letter:?}");
            } else {
                // Dead-lettered at its first delivery, before any attempt ran.
                assert_eq!(letter.field(fields::ATTEMPTS), None, "{letter:?}");
                if let Some(deliveries) = letter.field(fields::DELIVERIES) {
                    assert_eq!(deliveries, "1", "{letter:?}");
                }
            }
            *seen.entry(id).or_insert(0) += 1;
        }
        let once: BTreeMap<String, i32> = expected.keys().map(|id| (id.to_string(), 1)).collect();
        assert_eq!(seen, once, "each dead-lettered exactly once");

        // The others: applied once each, nothing of the poison.
        model::verify(k, &model::oracle(&good)).await;
        assert_eq!(model::applied(k).await, 20);
    })
    .await;
}
