//! The queries behind the gauges (`idem::gauges`): the outbox's backlog per destination
//! ([`OutboxAdmin::outbox_backlog`]) and what waits in the recovery tables per consumer
//! ([`DeadLetterAdmin::recovery_counts`]), against rows the rules write and read back.

use std::time::Duration;

use idem::admin::{Admin, DeadCounts, DeadLetterAdmin, OutboxAdmin, ParkedCounts};
use idem::outbox::{NewRow, OutboxStore};
use idem::recover::{Failure, NewDeadLetter, Origin, RecoveryStore};

use crate::backend::Kit;
use crate::backends::unique_name;
use crate::{Backend, Ty, Value};

/// Writes an outbox row to `destination` (committed at once) and returns its `seq`.
pub(crate) async fn outbox_row<B: Backend<Db: OutboxStore>>(
    k: &Kit<B>,
    id: &str,
    destination: &str,
) -> i64 {
    let mut conn = k.conn().await;
    B::Db::insert_outbox(
        &mut conn,
        NewRow {
            id,
            destination,
            partition_key: "",
            partition_no: 7,
            payload: b"{}",
            headers: None,
        },
    )
    .await
    .unwrap();
    drop(conn);
    k.int("SELECT seq FROM idem_outbox WHERE id = $1", &[id.into()])
        .await
}

/// Marks outbox rows sent, as the relay does once the broker confirmed them.
pub(crate) async fn mark_sent<B: Backend<Db: OutboxStore>>(k: &Kit<B>, seqs: &[i64]) {
    let mut conn = k.conn().await;
    assert_eq!(
        B::Db::mark_sent(&mut conn, seqs).await.unwrap(),
        seqs.len() as u64
    );
}

/// When the pending rows of `destination` were written, the oldest, in epoch milliseconds,
/// read from the table.
async fn oldest_pending_ms<B: Backend>(k: &Kit<B>, destination: &str) -> i64 {
    let sql = format!(
        "SELECT MIN({}) FROM idem_outbox WHERE destination = $1 AND sent_at IS NULL",
        k.dialect.ms("created_at")
    );
    k.int(&sql, &[destination.into()]).await
}

/// Lets the database's clock move on, so that rows written after it are younger.
async fn let_time_pass() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// `outbox_backlog` gives, per destination with pending rows and in destination order, how
/// many are pending (failed ones waiting out a backoff among them) and when the oldest was
/// written; sent rows count nowhere (a destination whose rows were all sent is absent, older
/// sent rows do not make its oldest older), and `outbox_stats` agrees on every pending count.
pub async fn outbox_backlog_counts_pending_rows_per_destination<
    B: Backend<Db: OutboxAdmin + OutboxStore>,
>() {
    let k = crate::__open!(B);
    let run = unique_name("backlog");
    let id = |n: &str| format!("{run}-{n}");
    // Older rows first: sent ones of `a` and `c`.
    let sent = vec![
        outbox_row(&k, &id("a0"), "a").await,
        outbox_row(&k, &id("c0"), "c").await,
        outbox_row(&k, &id("c1"), "c").await,
    ];
    mark_sent(&k, &sent).await;
    let_time_pass().await;
    let mut failed = Vec::new();
    for n in 1..=4 {
        let seq = outbox_row(&k, &id(&format!("a{n}")), "a").await;
        if n == 2 {
            failed.push(seq);
        }
        outbox_row(&k, &id(&format!("b{n}")), "b").await;
        let_time_pass().await;
    }
    let b5 = outbox_row(&k, &id("b5"), "b").await;
    mark_sent(&k, &[b5]).await;
    let mut conn = k.conn().await;
    B::Db::mark_failed(&mut conn, &failed, Duration::from_secs(3600), "refused")
        .await
        .unwrap();
    drop(conn);

    let backlog = B::Db::outbox_backlog(&k.pool).await.unwrap();
    let pending: Vec<(&str, u64)> = backlog
        .iter()
        .map(|b| (b.destination.as_str(), b.pending))
        .collect();
    assert_eq!(pending, [("a", 4), ("b", 4)], "{backlog:?}");
    for b in &backlog {
        assert_eq!(
            b.oldest_ms,
            oldest_pending_ms(&k, &b.destination).await,
            "{b:?}"
        );
    }
    let sent_a = k
        .int(
            &format!(
                "SELECT {} FROM idem_outbox WHERE seq = $1",
                k.dialect.ms("created_at")
            ),
            &[sent[0].into()],
        )
        .await;
    assert!(
        backlog[0].oldest_ms > sent_a,
        "the sent row is older: {backlog:?}"
    );
    let now = B::Db::now_ms(&k.pool).await.unwrap();
    assert!(backlog[0].age_ms(now) > 0, "{backlog:?} at {now}");
    assert_eq!(
        backlog[0].age_ms(now),
        u64::try_from(now - backlog[0].oldest_ms).unwrap()
    );
    let stats = B::Db::outbox_stats(&k.pool, None).await.unwrap();
    let stats: Vec<(&str, u64)> = stats
        .iter()
        .filter(|s| s.pending > 0)
        .map(|s| (s.destination.as_str(), s.pending))
        .collect();
    assert_eq!(stats, pending);

    // All sent: nothing is pending anywhere.
    let all: Vec<i64> = k
        .column(
            "SELECT seq FROM idem_outbox WHERE sent_at IS NULL",
            &[],
            Ty::Int,
        )
        .await
        .iter()
        .map(Value::int)
        .collect();
    assert_eq!(all.len(), 8);
    mark_sent(&k, &all).await;
    assert_eq!(B::Db::outbox_backlog(&k.pool).await.unwrap(), vec![]);
    k.close().await;
}

/// One consumer's failure, for the recovery rows of these rules.
pub(crate) fn failure<'a>(consumer: &'a str, origin: &'a Origin, error: &'a str) -> Failure<'a> {
    Failure {
        consumer,
        payload: b"{}",
        headers: &[],
        origin,
        attempts: 1,
        error,
        first_failed_ms: None,
    }
}

/// A dead letter of `failure`: its scope (if known) and reason.
pub(crate) fn dead<'a>(
    failure: Failure<'a>,
    scope: Option<&'a str>,
    reason: &'a str,
) -> NewDeadLetter<'a> {
    NewDeadLetter {
        failure,
        reason,
        scope,
        key: scope.map(|_| &b"k"[..]),
        shape: "boom",
        group: "0011223344556677",
    }
}

/// An origin of the recovery rows of these rules.
pub(crate) fn origin() -> Origin {
    Origin {
        broker: "nats".into(),
        source: "orders".into(),
        coordinates: "stream sequence 4".into(),
        destination: "orders".into(),
    }
}

/// `recovery_counts` gives the parked retries per consumer, and the open dead letters per
/// consumer, scope and reason, each sorted (an unknown scope first); a discarded dead letter
/// is not counted, nor is a parked retry once it became a dead letter.
pub async fn recovery_counts_count_parked_and_open_dead_letters_per_consumer<
    B: Backend<Db: DeadLetterAdmin + RecoveryStore>,
>() {
    let k = crate::__open!(B);
    let (one, two) = (unique_name("gauges-1"), unique_name("gauges-2"));
    let origin = origin();
    let mut parked_one = Vec::new();
    for _ in 0..3 {
        let f = failure(&one, &origin, "e");
        parked_one.push(B::Db::park(&k.pool, &f, Duration::ZERO).await.unwrap());
    }
    B::Db::park(&k.pool, &failure(&two, &origin, "e"), Duration::ZERO)
        .await
        .unwrap();
    let bury = async |consumer: &str, scope: Option<&str>, reason: &str| {
        let letter = dead(failure(consumer, &origin, "boom"), scope, reason);
        B::Db::bury(&k.pool, &letter, None).await.unwrap().unwrap()
    };
    let discarded = bury(&one, Some("billing"), "poisoned").await;
    bury(&one, Some("billing"), "poisoned").await;
    bury(&one, Some("billing"), "poisoned").await;
    bury(&one, None, "undecodable").await;
    bury(&two, Some("billing"), "poisoned").await;
    assert_eq!(B::Db::discard(&k.pool, &[discarded]).await.unwrap(), 1);
    // A parked retry of `one` gives up: taken, then moved to the dead letters.
    let taken = B::Db::take_due(&k.pool, &one, 1, Duration::from_secs(60), 7)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    let letter = dead(
        failure(&one, &origin, "boom"),
        Some("billing"),
        "retries_exhausted",
    );
    assert!(B::Db::bury(&k.pool, &letter, Some((taken[0].id, 7)))
        .await
        .unwrap()
        .is_some());

    let counts = B::Db::recovery_counts(&k.pool).await.unwrap();
    let parked: Vec<(&str, u64)> = counts
        .parked
        .iter()
        .map(|p: &ParkedCounts| (p.consumer.as_str(), p.parked))
        .collect();
    assert_eq!(parked, [(one.as_str(), 2), (two.as_str(), 1)], "{counts:?}");
    let dead: Vec<(&str, Option<&str>, &str, u64)> = counts
        .dead
        .iter()
        .map(|d: &DeadCounts| {
            (
                d.consumer.as_str(),
                d.scope.as_deref(),
                d.reason.as_str(),
                d.dead,
            )
        })
        .collect();
    assert_eq!(
        dead,
        [
            (one.as_str(), None, "undecodable", 1),
            (one.as_str(), Some("billing"), "poisoned", 2),
            (one.as_str(), Some("billing"), "retries_exhausted", 1),
            (two.as_str(), Some("billing"), "poisoned", 1),
        ],
        "{counts:?}"
    );
    k.close().await;
}
