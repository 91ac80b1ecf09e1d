//! The outbox publisher: what reaches the broker, and when. A rolled-back handler publishes
//! nothing, a committed one exactly its messages with their ids; a relay killed before or
//! after the broker's confirm loses nothing, and what it publishes twice applies once
//! downstream; per-partition-key order holds with two relays.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idem::outbox::{Message, OutboxStore, PublishError, Publisher, Relay};
use idem::Outcome;

use crate::broker::child::Spawn;
use crate::broker::harness::{self, Reopen};
use crate::broker::model::{self, Order, Payment, Received};
use crate::broker::{Arrived, Broker, Spec};
use crate::outbox::Watched;
use crate::{Backend, Kit, Ty};

/// Runs relay passes until one publishes nothing; how many it published.
pub async fn relay_until_idle<DB: OutboxStore, P: Publisher>(relay: &mut Relay<DB, P>) -> usize {
    let mut total = 0;
    loop {
        match relay.step().await {
            Ok(0) => return total,
            Ok(n) => total += n,
            Err(err) => panic!("a relay pass failed: {err}"),
        }
    }
}

fn payment(arrived: &Arrived) -> Payment {
    serde_json::from_slice(&arrived.payload)
        .unwrap_or_else(|err| panic!("{arrived:?} is not a payment: {err}"))
}

async fn sent<D: Backend>(k: &Kit<D>) -> i64 {
    k.int(
        "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NOT NULL",
        &[],
    )
    .await
}

/// A handler that publishes and then fails publishes nothing; committed ones (3 orders of one
/// customer, 2 of another) arrive once each, with the ids their handlers got, in order per
/// partition key (on one partition, where the broker has them), with their payload and
/// headers, and their rows are marked sent; a relay with a retention of zero then purges them.
pub async fn a_rolled_back_handler_publishes_nothing_and_committed_ones_arrive_once<
    B: Broker,
    D: Backend,
>()
where
    D::Db: OutboxStore,
{
    harness::with::<B, D>(Spec::new("outbox"), async |b, k| {
        model::schema(k).await;
        let destination = b.destination();
        let failing = Order {
            id: "order-x".into(),
            customer: "ada".into(),
            destination: destination.clone(),
            fail: true,
        };
        assert!(model::on_order(&k.pool, &failing).await.is_err());
        let mut relay = Relay::new(k.pool.clone(), b.publisher().await);
        assert_eq!(relay_until_idle(&mut relay).await, 0);
        assert_eq!(
            model::unsent(k).await,
            0,
            "a rolled-back handler left a row"
        );

        let ada = model::commit_orders(k, &destination, "ada", 3).await;
        let bob = model::commit_orders(k, &destination, "bob", 2).await;
        assert_eq!(relay_until_idle(&mut relay).await, 5);
        let arrived = b.arrived(5).await;
        assert_eq!(
            arrived.len(),
            5,
            "the rolled-back one absent, the others once: {arrived:?}"
        );
        for (customer, ids) in [("ada", &ada), ("bob", &bob)] {
            let of: Vec<&Arrived> = arrived
                .iter()
                .filter(|m| m.partition_key.as_deref() == Some(customer))
                .collect();
            let got: Vec<&str> = of.iter().map(|m| m.id.as_str()).collect();
            assert_eq!(got, *ids, "{customer}'s messages once each, in order");
            assert!(
                of.iter().all(|m| m.partition == of[0].partition),
                "one key, one partition: {of:?}"
            );
            for (i, m) in of.iter().enumerate() {
                assert_eq!(m.headers.get("kind").map(String::as_str), Some("payment"));
                let expected = Payment {
                    order: format!("{customer}-order-{i}"),
                    n: 1,
                };
                assert_eq!(payment(m), expected);
            }
        }
        assert_eq!(model::unsent(k).await, 0, "every row marked sent");
        assert_eq!(sent(k).await, 5);

        // Retention: sent rows older than it are purged by the relay.
        let mut relay = Relay::new(k.pool.clone(), b.publisher().await).retention(Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(5)).await;
        relay.step().await.expect("a relay pass");
        assert_eq!(relay.stats().purged, 5);
        assert_eq!(k.int("SELECT COUNT(*) FROM idem_outbox", &[]).await, 0);
    })
    .await;
}

/// A destination the broker does not take fails the relay's batch: nothing is marked sent,
/// and the rows keep the broker's refusal as their last error.
pub async fn a_refused_destination_fails_the_batch_and_keeps_the_rows<B: Broker, D: Backend>()
where
    D::Db: OutboxStore,
{
    harness::with::<B, D>(Spec::new("refused"), async |b, k| {
        model::schema(k).await;
        let (destination, refusal) = b.refusing_destination().await;
        model::commit_orders(k, &destination, "ada", 2).await;
        let mut relay = Relay::new(k.pool.clone(), b.publisher().await)
            .publish_timeout(Duration::from_secs(20));
        assert_eq!(relay.step().await.expect("a relay pass"), 0);
        assert_eq!(relay.stats().failed_batches, 1);
        assert_eq!(model::unsent(k).await, 2, "nothing marked sent");
        let errors = k
            .rows(
                "SELECT last_error FROM idem_outbox WHERE last_error IS NOT NULL",
                &[],
                &[Ty::Text],
            )
            .await;
        assert_eq!(errors.len(), 2, "{errors:?}");
        for error in errors {
            let error = error[0].text();
            assert!(error.contains(&refusal), "{error:?} should say {refusal:?}");
        }
    })
    .await;
}

/// Two relays on one database (PostgreSQL: each owns the partitions it locked, 4 a turn), 400
/// rows over 20 partition keys (10,000 over 100 with `IDEM_SOAK=1`): both relays publish, every
/// row is published by exactly one of them, no key is in both relays' publishes at once, and
/// every message arrives once, with a distinct id, each key's in order (on one partition, where
/// the broker has them).
pub async fn two_relays_keep_each_partition_keys_order<B: Broker, D: Backend>()
where
    D::Db: OutboxStore,
{
    harness::with::<B, D>(Spec::new("order"), async |b, k| {
        let (rows, keys) = if harness::soak() {
            (10_000, 100)
        } else {
            (400, 20)
        };
        model::seed_outbox(k, &b.destination(), rows, keys).await;
        let publisher = Watched::new(b.publisher().await);
        let relay = |publisher: Watched<B::Publisher>| {
            // A few partitions a turn, so that neither relay takes them all.
            Relay::new(k.pool.clone(), publisher)
                .batch(20)
                .batches_per_turn(2)
                .partitions_per_turn(4)
        };
        // Until the outbox is empty; bounded, so that a relay that stopped publishing ends the
        // rule (in the assertions below) instead of hanging it.
        let done = async || {
            let started = Instant::now();
            while model::unsent(k).await > 0 && started.elapsed() < Duration::from_secs(300) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let (one, two) = tokio::join!(
            relay(publisher.clone()).run(done()),
            relay(publisher.clone()).run(done())
        );
        eprintln!(
            "{}: the relays published {} and {}",
            B::NAME,
            one.published,
            two.published
        );
        assert_eq!(
            one.published + two.published,
            rows as u64,
            "every row published by exactly one relay"
        );
        assert!(
            one.published > 0 && two.published > 0,
            "the two relays shared the outbox"
        );
        assert!(
            !publisher.overlapped(),
            "two relays published one key at the same time"
        );

        let arrived = b.arrived(rows).await;
        assert_eq!(arrived.len(), rows, "every row arrived once");
        let ids: HashSet<&str> = arrived.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids.len(), rows, "distinct ids");
        let mut last: HashMap<String, (i64, Option<i32>)> = HashMap::new();
        for message in &arrived {
            let payment = payment(message);
            assert_eq!(
                message.partition_key.as_deref(),
                Some(payment.order.as_str())
            );
            let (expected, partition) = last
                .get(&payment.order)
                .map_or((0, message.partition), |(n, p)| (n + 1, *p));
            assert_eq!(payment.n, expected, "key {} out of order", payment.order);
            assert_eq!(message.partition, partition, "one key, one partition");
            last.insert(payment.order, (payment.n, message.partition));
        }
        assert_eq!(last.len(), keys);
    })
    .await;
}

/// Runs a relay child in `role` (`relay-before-publish`, `relay-after-confirm`) on the rule's
/// database, and checks that its planned SIGKILL ended it.
async fn relay_child<B: Broker, D: Reopen>(b: &B, k: &Kit<D>, role: &str) {
    let mut child = Spawn::new::<B, D>(role, b, &k.pool).await.spawn();
    let status = child.wait(Duration::from_secs(60)).await;
    child.assert_killed(status);
}

/// A relay SIGKILLed between the commit and its first publish: nothing arrived and nothing is
/// marked sent; after a restart each committed message arrives once, in order.
pub async fn a_relay_killed_before_publishing_publishes_each_once_after_a_restart<
    B: Broker,
    D: Reopen,
>()
where
    D::Db: OutboxStore,
{
    harness::with::<B, D>(Spec::new("relaykill"), async |b, k| {
        model::schema(k).await;
        let ids = model::commit_orders(k, &b.destination(), "ada", 5).await;
        relay_child(b, k, "relay-before-publish").await;
        assert_eq!(
            b.arrived(0).await,
            vec![],
            "the child published before it died"
        );
        assert_eq!(model::unsent(k).await, 5);

        let mut relay = Relay::new(k.pool.clone(), b.publisher().await);
        assert_eq!(relay_until_idle(&mut relay).await, 5);
        let arrived: Vec<String> = b.arrived(5).await.into_iter().map(|m| m.id).collect();
        assert_eq!(arrived, ids, "each committed message once, in order");
        assert_eq!(model::unsent(k).await, 0);
    })
    .await;
}

/// A relay SIGKILLed after the broker confirmed its batch, before it marked the rows sent:
/// after a restart the batch is published again with the same ids (the broker keeps both
/// copies, or drops the second where it deduplicates on the id), and service B, keyed on the
/// id, applies each payment once.
pub async fn a_relay_killed_after_the_confirm_publishes_again_and_downstream_applies_once<
    B: Broker,
    D: Reopen,
>()
where
    D::Db: OutboxStore,
{
    harness::with::<B, D>(Spec::new("relaytwice"), async |b, k| {
        model::schema(k).await;
        let ids = model::commit_orders(k, &b.destination(), "ada", 5).await;
        relay_child(b, k, "relay-after-confirm").await;
        assert_eq!(
            model::unsent(k).await,
            5,
            "the child died before marking its rows"
        );

        let mut relay = Relay::new(k.pool.clone(), b.publisher().await);
        assert_eq!(relay_until_idle(&mut relay).await, 5);
        assert_eq!(model::unsent(k).await, 0);
        arrived_twice_and_applied_once(b, k, &ids).await;
    })
    .await;
}

/// What service B sees of 5 orders published twice with the same ids (once where the broker
/// drops a copy it has seen): every copy arrives in order, goes through its idempotent handler,
/// and each payment applies once.
async fn arrived_twice_and_applied_once<B: Broker, D: Backend>(b: &B, k: &Kit<D>, ids: &[String]) {
    let twice: Vec<String> = ids.iter().chain(ids).cloned().collect();
    let expected = if B::DROPS_REPUBLISHED {
        ids
    } else {
        &twice[..]
    };
    let arrived = b.arrived(expected.len()).await;
    let arrived_ids: Vec<String> = arrived.iter().map(|m| m.id.clone()).collect();
    assert_eq!(
        &arrived_ids, expected,
        "published again after the restart, with the same ids"
    );

    // Service B: every copy goes through the idempotent handler; each payment applies once.
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for message in &arrived {
        let received = Received {
            message_id: message.id.clone(),
            payment: payment(message),
        };
        let outcome = model::on_payment(&k.pool, &received, &k.dialect)
            .await
            .expect("service B's handler");
        let name = match outcome {
            Outcome::Applied(()) => "applied",
            Outcome::Duplicate => "duplicate",
            _ => "other",
        };
        *outcomes.entry(name.to_string()).or_default() += 1;
    }
    let mut want = BTreeMap::from([("applied".to_string(), 5)]);
    if !B::DROPS_REPUBLISHED {
        want.insert("duplicate".to_string(), 5);
    }
    assert_eq!(outcomes, want);
    let applied = k
        .text_ints("SELECT order_id, n FROM payments ORDER BY order_id", &[])
        .await;
    let expected: Vec<(String, i64)> = (0..5).map(|i| (format!("ada-order-{i}"), 1)).collect();
    assert_eq!(applied, expected);
}

/// A publisher whose first batch reaches the broker but whose result is lost (the broker
/// confirmed; the relay hears an error): the relay marks the rows failed, publishes them again
/// after its retry delay, and downstream applies each message once.
pub async fn a_publish_whose_result_was_lost_is_published_again_and_applied_once<
    B: Broker,
    D: Backend,
>()
where
    D::Db: OutboxStore,
{
    harness::with::<B, D>(Spec::new("lostresult"), async |b, k| {
        model::schema(k).await;
        let ids = model::commit_orders(k, &b.destination(), "ada", 5).await;
        let publisher = LoseFirstResult {
            inner: b.publisher().await,
            lost: AtomicBool::new(false),
        };
        let delay = Duration::from_millis(50);
        let mut relay = Relay::new(k.pool.clone(), publisher).retry(delay, delay);
        assert_eq!(relay.step().await.expect("a relay pass"), 0);
        assert_eq!(relay.stats().failed_batches, 1);
        assert_eq!(model::unsent(k).await, 5, "nothing marked sent");
        tokio::time::sleep(delay * 2).await;
        assert_eq!(relay_until_idle(&mut relay).await, 5);
        assert_eq!(model::unsent(k).await, 0);
        arrived_twice_and_applied_once(b, k, &ids).await;
    })
    .await;
}

/// Publishes every batch; answers the first with an error, as if its confirm was lost.
struct LoseFirstResult<P> {
    inner: P,
    lost: AtomicBool,
}

impl<P: Publisher> Publisher for LoseFirstResult<P> {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        self.inner.publish(batch).await?;
        if self.lost.swap(true, Ordering::SeqCst) {
            Ok(())
        } else {
            Err("the broker's confirm was lost on the way back".into())
        }
    }
}
