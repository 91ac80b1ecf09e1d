//! The adapter's probe of its broker: `Consumer::health_of(&source)` makes the consumer ready
//! while its run takes work on a connected source.

use std::time::Duration;

use crate::broker::harness::{self, consumer};
use crate::broker::model::{self, Event};
use crate::broker::{Broker, Settings, Spec};
use crate::Backend;

/// 30 credits through a consumer checking every 100 ms with the source's own probe: not ready
/// before the run, ready while it runs (the probe reaches the broker and the database answers;
/// a probe that never did would fail the rule), stopped after it; every message applied once.
pub async fn ready_while_running_with_the_brokers_probe<B: Broker, D: Backend>() {
    harness::with::<B, D>(Spec::new("health"), async |b, k| {
        use idem::consume::NotReady;

        model::schema(k).await;
        let events: Vec<Event> = (0..30)
            .map(|i| model::credit(&format!("h{i}"), i % 3, 1))
            .collect();
        b.publish(&model::raws(&events)).await;
        let source = b.source(Settings::new(10, "w1")).await;
        let consumer = consumer(k.pool.clone(), 10)
            .health_of(&source)
            .health_every(Duration::from_millis(100));
        let health = consumer.health();
        assert_eq!(health.ready(), Err(NotReady::NotStarted));
        let until = async {
            let ready = async {
                while let Err(why) = health.ready() {
                    if matches!(why, NotReady::Unreachable { .. }) {
                        eprintln!("{}: not ready yet: {why}", B::NAME);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            };
            harness::within(Duration::from_secs(30), "readiness", ready).await;
            harness::settled(b).await;
        };
        let d = k.dialect;
        let counts = harness::within(
            Duration::from_secs(60),
            "the run",
            consumer.run(
                idem::consume::Source::deliveries(&source),
                idem::consume::json::<Event>,
                async |batch, e| model::handle(batch, e, &d).await,
                until,
            ),
        )
        .await;
        assert_eq!(health.ready(), Err(NotReady::Stopped));
        idem::consume::Source::close(source).await.unwrap();
        assert_eq!(counts.applied, 30, "{counts:?}");
        model::verify(k, &model::oracle(&events)).await;
    })
    .await;
}
