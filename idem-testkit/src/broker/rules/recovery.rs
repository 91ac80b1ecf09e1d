//! Recovery: a failing delivery waits in the database (`idem_parked`) while the input keeps
//! flowing, survives a restart, and applies exactly once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt as _;
use idem::consume::{Recovery, Source as _};
use idem::recover::RecoveryStore;

use crate::broker::harness::{self, consumer, eventually, soak, track, Tally};
use crate::broker::model::{self, Event};
use crate::broker::{Broker, Settings, Spec};
use crate::{Backend, Kit};

/// The handler's runs of the failing event: it fails every run until the restart, then its
/// first [`Runs::AFTER_RESTART`] runs more.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<(bool, u32)>>);

impl Runs {
    /// Failing runs after the restart (a run in a batch that fails is run again alone: two
    /// runs can be one failed retry).
    const AFTER_RESTART: u32 = 2;

    /// Counts a run of the failing event; true while it fails.
    fn fails(&self) -> bool {
        let mut runs = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (restarted, n) = &mut *runs;
        if !*restarted {
            return true;
        }
        *n += 1;
        *n <= Self::AFTER_RESTART
    }

    /// From now on, the failing event fails [`Runs::AFTER_RESTART`] runs more.
    fn restart(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).0 = true;
    }

    /// Its runs since the restart.
    fn since_restart(&self) -> u32 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}

/// Parked rows of the consumer `name`.
async fn parked<D: Backend>(k: &Kit<D>, name: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM idem_parked WHERE consumer = $1";
    k.int(sql, &[name.into()]).await
}

/// Failed runs recorded on the parked rows of the consumer `name` (a park records one, a
/// failed retry one more). `attempts * COUNT(*)` per value reads as a 64-bit integer on every
/// database.
async fn parked_failures<D: Backend>(k: &Kit<D>, name: &str) -> i64 {
    let sql = "SELECT attempts * COUNT(*) FROM idem_parked WHERE consumer = $1 GROUP BY attempts";
    let rows = k.column(sql, &[name.into()], crate::Ty::Int).await;
    rows.iter().map(|v| v.int()).sum()
}

/// 41 credits with the 11th (Kafka: offset 10 of its partition) failing every run of a first
/// consumer, durable retries on (1 s doubling to 4 s; to 16 s with `IDEM_SOAK=1`): the other
/// 40 apply and the broker has nothing left unsettled while the failing one waits in
/// `idem_parked` (the queue, stream or partition flows past it: Kafka's committed offset
/// passes it), each of its failures recorded there. The consumer then stops, and a new one (a
/// restart) takes the parked row when it is due, fails it again, and applies it on a later
/// retry: every credit applied exactly once, no parked row and no dead letter left.
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
            .durable_retries(30, Duration::from_secs(1), Duration::from_secs(max))
            .poll(Duration::from_millis(50));
        let runs = Runs::default();
        let handler = async |batch: &mut idem::Batch<D::Db>, e: &Event| {
            if e.id() == "slow" && runs.fails() {
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
        assert_eq!(first.dead_letters_stored, 0, "{first:?}");
        // Every failure is on a parked row, none requeued in place: a broker delivery's park
        // records one, a retry that came due in this run and failed again one more (a slow
        // start, as a Kafka rebalance, can let the first retry come before the others apply;
        // a broker that delivers the message again parks each copy).
        assert_eq!(
            parked_failures(k, &name).await,
            first.failed as i64,
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
        runs.restart();
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
        assert!(counts.failed >= 1, "a retry failed again: {counts:?}");
        assert!(
            runs.since_restart() > Runs::AFTER_RESTART,
            "the handler ran it after its failures"
        );
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
