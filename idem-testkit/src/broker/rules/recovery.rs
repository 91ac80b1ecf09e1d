//! Recovery: a failing delivery waits in the database (`idem_parked`) while the input keeps
//! flowing, survives a restart, and applies exactly once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use idem::consume::{Recovery, Source as _};
use idem::recover::RecoveryStore;

use crate::broker::harness::{self, consumer, eventually, soak, track, Tally};
use crate::broker::model::{self, Event};
use crate::broker::{Broker, Settings, Spec};
use crate::{Backend, Kit};

/// How many times each event ran, and which fail their first runs.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<String, u32>>>);

impl Runs {
    /// Counts a run of `id`; true while it is one of its first `failing` runs.
    fn fails(&self, id: &str, failing: u32) -> bool {
        let mut runs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = runs.entry(id.to_string()).or_default();
        *n += 1;
        *n <= failing
    }

    fn of(&self, id: &str) -> u32 {
        let runs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        runs.get(id).copied().unwrap_or(0)
    }
}

/// Parked rows of the consumer `name`.
async fn parked<D: Backend>(k: &Kit<D>, name: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM idem_parked WHERE consumer = $1";
    k.int(sql, &[name.into()]).await
}

/// 41 credits with the 11th (Kafka: offset 10 of its partition) failing its first four runs,
/// durable retries on (1 s doubling to 4 s; to 16 s with `IDEM_SOAK=1`): the other 40 apply
/// and the broker has nothing left unsettled while the failing one waits in `idem_parked` (the
/// queue, stream or partition flows past it: Kafka's committed offset passes it). The consumer
/// then stops during the backoff, and a new one (a restart) takes the parked row when it is due
/// and applies it: every credit applied exactly once, the failing one after five runs, no
/// parked row and no dead letter left.
pub async fn a_failing_delivery_waits_in_the_database_while_the_input_flows<B: Broker, D: Backend>()
where
    D::Db: RecoveryStore,
{
    harness::with::<B, D>(Spec::new("park"), async |b, k| {
        model::schema(k).await;
        let mut events: Vec<Event> = (0..40)
            .map(|i| model::credit(&format!("ok{i}"), i % 4, 1))
            .collect();
        events.insert(10, model::credit("slow", 9, 100));
        b.publish(&model::raws(&events)).await;

        let max = if soak() { 16 } else { 4 };
        let name = format!("kit-park-{}", b.input());
        let recovery = Recovery::new(&name)
            .durable_retries(8, Duration::from_secs(1), Duration::from_secs(max))
            .poll(Duration::from_millis(50));
        let runs = Runs::default();
        let handler = async |batch: &mut idem::Batch<D::Db>, e: &Event| {
            if runs.fails(e.id(), if e.id() == "slow" { 8 } else { 0 }) {
                return Err(idem::Error::Handler(format!("{} is not ready", e.id())));
            }
            model::handle(batch, e, &k.dialect).await
        };

        // The first run: the other 40 apply while the failing one waits for its first retry, a
        // second away. (A broker that delivers a message again, as Kafka after a rebalance,
        // may fail and park a copy more: every failure is parked, none is lost or doubled.)
        let first = {
            let consumer_one = consumer(k.pool.clone(), 5).recovery(recovery.clone());
            let source = b.source(Settings::new(20, "park")).await;
            let tally = Tally::new();
            let done = async {
                eventually(
                    "the other 40 applied",
                    Duration::from_secs(60),
                    async || model::applied(k).await >= 40,
                )
                .await
            };
            let run = consumer_one.run(
                track(source.deliveries(), &tally),
                idem::consume::json::<Event>,
                &handler,
                done.map(drop),
            );
            let counts = harness::within(Duration::from_secs(90), "the first consumer", run).await;
            harness::within(Duration::from_secs(40), "close", source.close())
                .await
                .expect("the source closes cleanly");
            counts
        };
        eprintln!("{}: first run {first:?}", B::NAME);
        assert!(first.parked >= 1, "{first:?}");
        assert_eq!(
            first.parked, first.failed,
            "every failure parked: {first:?}"
        );
        let ledger = model::ledger(k).await;
        assert!(!ledger.contains_key("slow"), "the failing one still waits");
        assert!(
            ledger.values().all(|n| *n == 1),
            "none applied twice: {ledger:?}"
        );
        assert!(
            parked(k, &name).await >= 1,
            "the failing one waits in the database"
        );
        harness::assert_unsettled(b, 0).await;

        // A restart during the backoff: a new consumer takes the row when it is due.
        let again = consumer(k.pool.clone(), 5).recovery(recovery);
        let source = b.source(Settings::new(20, "park")).await;
        let tally = Tally::new();
        let done = async {
            eventually(
                "the parked credit applied",
                Duration::from_secs(90),
                async || model::applied(k).await >= 41 && parked(k, &name).await == 0,
            )
            .await
        };
        let run = again.run(
            track(source.deliveries(), &tally),
            idem::consume::json::<Event>,
            &handler,
            done.map(drop),
        );
        let counts = harness::within(Duration::from_secs(120), "the second consumer", run).await;
        harness::within(Duration::from_secs(40), "close", source.close())
            .await
            .expect("the source closes cleanly");
        eprintln!("{}: second run {counts:?}", B::NAME);
        assert!(
            first.failed + counts.failed >= 4,
            "four failed deliveries at least, then the one that applied"
        );
        assert!(runs.of("slow") > 8, "the handler ran it after its failures");
        model::verify(k, &model::oracle(&events)).await;
        assert_eq!(model::applied(k).await, 41);
        assert_eq!(parked(k, &name).await, 0);
        let dead = "SELECT COUNT(*) FROM idem_dead_letters WHERE consumer = $1";
        assert_eq!(k.int(dead, &[name.as_str().into()]).await, 0);
        assert!(b.dead_letters().await.is_empty());
        harness::assert_unsettled(b, 0).await;
    })
    .await;
}
