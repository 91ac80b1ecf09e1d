//! [`Relay`]: publishes committed outbox rows in order per partition, one owner per
//! partition, and marks them sent only after the broker confirmed them.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use sqlx::{Connection as _, Pool};

use super::message::{decode_headers, Message};
use super::publisher::Publisher;
use super::store::{OutboxStore, PendingRow, PARTITIONS};

/// What a relay did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Messages the broker confirmed and the relay marked sent.
    pub published: u64,
    /// Batches the publisher failed (their rows wait for a backoff, then go again).
    pub failed_batches: u64,
    /// Passes that failed on the database (the relay reconnects after a backoff).
    pub store_errors: u64,
    /// Sent rows deleted after their retention.
    pub purged: u64,
}

/// Publishes the outbox: takes committed rows in order per partition (a hash of destination
/// and partition key), hands them to its [`Publisher`] in batches, and marks them sent once the
/// publisher returned `Ok` (the broker confirmed them). Rows are never marked before that, so
/// a crash anywhere publishes them again later, with the same ids: at least once.
///
/// Several relays on one PostgreSQL or MySQL/MariaDB database share the work: a relay owns a
/// partition (a session lock of its connection) while it publishes from it, and skips the
/// partitions others own, so no two relays ever publish one key's messages at the same time
/// and per-key order holds. On SQLite run one relay per database.
///
/// When there is nothing to publish it polls with a backoff from [`idle`](Relay::idle)'s
/// minimum to its maximum; a failed batch waits [`retry`](Relay::retry)'s backoff, doubled
/// per attempt (its partition waits with it, so later messages of the same keys do not
/// overtake it). Sent rows are deleted after [`retention`](Relay::retention), in bounded batches.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # async fn run<P: idem::outbox::Publisher>(pool: sqlx::PgPool, publisher: P) {
/// let relay = idem::outbox::Relay::new(pool, publisher).batch(100);
/// let stats = relay.run(async { tokio::signal::ctrl_c().await.ok(); }).await;
/// println!("published {}", stats.published);
/// # }
/// ```
pub struct Relay<DB: OutboxStore, P> {
    pool: Pool<DB>,
    publisher: P,
    /// The connection the partitions are owned through, kept between passes.
    conn: Option<DB::Connection>,
    batch: u32,
    batches_per_turn: u32,
    partitions_per_turn: usize,
    idle: (Duration, Duration),
    retry: (Duration, Duration),
    publish_timeout: Duration,
    retention: Duration,
    purge_every: Duration,
    last_purge: Option<Instant>,
    turn: usize,
    stats: RelayStats,
}

impl<DB: OutboxStore, P: Publisher> Relay<DB, P> {
    /// A relay of the outbox in `pool`'s database, publishing through `publisher`.
    pub fn new(pool: Pool<DB>, publisher: P) -> Self {
        Relay {
            pool,
            publisher,
            conn: None,
            batch: 100,
            batches_per_turn: 10,
            partitions_per_turn: 32,
            idle: (Duration::from_millis(10), Duration::from_millis(500)),
            retry: (Duration::from_millis(200), Duration::from_secs(60)),
            publish_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            purge_every: Duration::from_secs(60),
            last_purge: None,
            turn: first_turn(),
            stats: RelayStats::default(),
        }
    }

    /// Messages per batch handed to the publisher (default 100; at least 1).
    pub fn batch(mut self, n: u32) -> Self {
        self.batch = n.max(1);
        self
    }

    /// Batches published from a turn's partitions before the relay gives them up and moves to
    /// the next ones (default 10), so busy partitions do not starve the others.
    pub fn batches_per_turn(mut self, n: u32) -> Self {
        self.batches_per_turn = n.max(1);
        self
    }

    /// Partitions tried at once, in a turn (default 32, at most 256), and owned unless another
    /// relay owns them: each batch takes an equal share from each of them that has rows left,
    /// oldest first, so that few rows per partition still make full batches. Fewer leaves more
    /// partitions to the other relays of the database at a time.
    pub fn partitions_per_turn(mut self, n: u32) -> Self {
        self.partitions_per_turn = (n as usize).clamp(1, PARTITIONS as usize);
        self
    }

    /// The idle poll: after a pass that found nothing, wait `min`, doubling to `max` (default
    /// 10 ms to 500 ms).
    pub fn idle(mut self, min: Duration, max: Duration) -> Self {
        self.idle = (min, max.max(min));
        self
    }

    /// The backoff of a failed batch: `min` doubled per failed attempt, at most `max` (default
    /// 200 ms to 60 s). Also the wait before reconnecting after a database error.
    pub fn retry(mut self, min: Duration, max: Duration) -> Self {
        self.retry = (min, max.max(min));
        self
    }

    /// How long a batch may take to be confirmed before it counts as failed (default 30 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How long sent rows are kept before they are purged (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// What this relay did so far.
    pub fn stats(&self) -> RelayStats {
        self.stats
    }

    /// Runs until `shutdown` completes: passes while there is work, idle polls with backoff when
    /// there is none. A pass under way when `shutdown` completes is finished first. Database
    /// errors are logged, counted and retried after a backoff, never returned.
    pub async fn run<F: Future<Output = ()>>(mut self, shutdown: F) -> RelayStats {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut idle = self.idle.0;
        loop {
            if shutdown.as_mut().now_or_never().is_some() {
                break;
            }
            let wait = match self.step().await {
                Ok(0) => {
                    let wait = idle;
                    idle = (idle * 2).min(self.idle.1);
                    wait
                }
                Ok(_) => {
                    idle = self.idle.0;
                    continue;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "outbox relay: database error; reconnecting after a backoff");
                    self.retry.0
                }
            };
            tokio::select! {
                biased;
                () = shutdown.as_mut() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        if let Some(conn) = self.conn.take() {
            let _ = conn.close().await;
        }
        self.stats
    }

    /// One pass: every partition with rows ready that no other relay owns is published from,
    /// [`partitions_per_turn`](Relay::partitions_per_turn) at a time (up to
    /// [`batches_per_turn`](Relay::batches_per_turn) batches each turn), and sent rows past
    /// their retention are purged when due. Returns how many messages were published. On a
    /// database error the connection (and with it every partition it owned) is dropped.
    pub async fn step(&mut self) -> Result<usize, sqlx::Error> {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => self.pool.acquire().await?.detach(),
        };
        match self.pass(&mut conn).await {
            Ok(published) => {
                self.conn = Some(conn);
                Ok(published)
            }
            Err(err) => {
                // Dropped, not returned to a pool: the server ends the session and its locks.
                drop(conn);
                self.stats.store_errors += 1;
                Err(err)
            }
        }
    }

    async fn pass(&mut self, conn: &mut DB::Connection) -> Result<usize, sqlx::Error> {
        let mut partitions = DB::pending_partitions(conn, PARTITIONS as u32).await?;
        let mut published = 0;
        if !partitions.is_empty() {
            // Start where the last pass did not, so relays spread over the partitions.
            self.turn = self.turn.wrapping_add(1);
            let start = self.turn % partitions.len();
            partitions.rotate_left(start);
        }
        for candidates in partitions.chunks(self.partitions_per_turn) {
            let owned = DB::try_own(conn, candidates).await?;
            if !owned.is_empty() {
                published += self.turn_over(conn, &owned).await?;
            }
        }
        self.purge_when_due(conn).await?;
        Ok(published)
    }

    /// Publishes from partitions this relay owns, then gives them up (also after an error).
    async fn turn_over(
        &mut self,
        conn: &mut DB::Connection,
        owned: &[i32],
    ) -> Result<usize, sqlx::Error> {
        let drained = self.drain(conn, owned).await;
        DB::disown(conn, owned).await?;
        drained
    }

    /// Publishes from partitions this relay owns, batch after batch, each batch their oldest
    /// rows in insertion order (an equal share of the batch from each partition still open),
    /// until they are drained or the turn's batches are spent.
    async fn drain(
        &mut self,
        conn: &mut DB::Connection,
        owned: &[i32],
    ) -> Result<usize, sqlx::Error> {
        let mut published = 0;
        let mut batches = 0;
        let mut open = owned.to_vec();
        while batches < self.batches_per_turn && !open.is_empty() {
            let each = share(self.batch, open.len());
            let rows = DB::take_pending(conn, &open, each, self.batch).await?;
            drained(&mut open, &rows, each, self.batch);
            let (rows, waiting) = publishable(rows);
            // A partition whose next row waits out a failed publish is done for this turn.
            open.retain(|partition| !waiting.contains(partition));
            if rows.is_empty() {
                continue; // the partitions it read are out of `open` now
            }
            let seqs: Vec<i64> = rows.iter().map(|row| row.seq).collect();
            let attempts = rows.iter().map(|row| row.attempts).max().unwrap_or(0);
            let messages: Vec<Message> = rows.into_iter().map(message).collect();
            #[cfg(feature = "otel")]
            let spans = crate::otel::SendSpans::open(self.publisher.broker(), &messages);
            let sent =
                tokio::time::timeout(self.publish_timeout, self.publisher.publish(&messages)).await;
            let failure = match sent {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(err.to_string()),
                Err(_) => Some(format!("not confirmed within {:?}", self.publish_timeout)),
            };
            #[cfg(feature = "otel")]
            spans.end(failure.as_deref());
            if let Some(error) = failure {
                let backoff = self.backoff(attempts);
                tracing::warn!(partitions = ?open, messages = messages.len(), error = %error, ?backoff, "outbox relay: publish failed; the batch goes again after a backoff");
                DB::mark_failed(conn, &seqs, backoff, &error).await?;
                self.stats.failed_batches += 1;
                break;
            }
            DB::mark_sent(conn, &seqs).await?;
            published += seqs.len();
            batches += 1;
            self.stats.published += seqs.len() as u64;
        }
        Ok(published)
    }

    /// The wait after a batch whose rows failed `attempts` times before.
    fn backoff(&self, attempts: i64) -> Duration {
        let doublings = u32::try_from(attempts.clamp(0, 20)).unwrap_or(20);
        self.retry
            .0
            .saturating_mul(1 << doublings)
            .min(self.retry.1)
    }

    /// Deletes sent rows past the retention, a bounded batch at a time, once per interval.
    async fn purge_when_due(&mut self, conn: &mut DB::Connection) -> Result<(), sqlx::Error> {
        if self
            .last_purge
            .is_some_and(|at| at.elapsed() < self.purge_every)
        {
            return Ok(());
        }
        self.last_purge = Some(Instant::now());
        const PURGE_BATCH: u64 = 1_000;
        for _ in 0..100 {
            let purged = DB::purge_sent(conn, self.retention, PURGE_BATCH).await?;
            self.stats.purged += purged;
            if purged < PURGE_BATCH {
                break;
            }
        }
        Ok(())
    }
}

/// Where a new relay starts its passes: different for relays of one process and of others, so
/// that they do not all try the same partitions first.
fn first_turn() -> usize {
    static RELAYS: AtomicUsize = AtomicUsize::new(0);
    let n = RELAYS.fetch_add(1, Ordering::Relaxed);
    (std::process::id() as usize)
        .wrapping_mul(31)
        .wrapping_add(n.wrapping_mul(97))
}

/// How many rows a batch of `batch` takes from each of `open` partitions: an equal share, at
/// least one.
fn share(batch: u32, open: usize) -> u32 {
    u32::try_from(batch as usize / open.max(1))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Drops from `open` the partitions that `rows` (taken with `each` per partition and `limit` in
/// all) shows to be drained: those that gave fewer than `each` rows. When `limit` cut the
/// result, a partition may have given fewer only because of the cut, so none is dropped.
fn drained(open: &mut Vec<i32>, rows: &[PendingRow], each: u32, limit: u32) {
    if rows.len() >= limit as usize {
        // Cut or exactly full: partitions that gave fewer than `each` may have more. Only when
        // every share fits the limit is a short partition surely drained.
        if (each as usize).saturating_mul(open.len()) > limit as usize {
            return;
        }
    }
    open.retain(|&partition| {
        let given = rows.iter().filter(|r| r.partition_no == partition).count();
        given >= each as usize
    });
}

/// The rows that may go now, in order, and the partitions that wait: a row that is not ready
/// (it waits out a failed publish) holds back every later row of its partition.
fn publishable(rows: Vec<PendingRow>) -> (Vec<PendingRow>, Vec<i32>) {
    let mut waiting = Vec::new();
    let mut ready = Vec::with_capacity(rows.len());
    for row in rows {
        if waiting.contains(&row.partition_no) {
            continue;
        }
        if row.ready {
            ready.push(row);
        } else {
            waiting.push(row.partition_no);
        }
    }
    (ready, waiting)
}

fn message(row: PendingRow) -> Message {
    Message {
        headers: decode_headers(row.headers.as_deref()),
        id: row.id,
        destination: row.destination,
        partition_key: row.partition_key,
        payload: row.payload,
        attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, partition_no: i32, ready: bool) -> PendingRow {
        PendingRow {
            seq,
            partition_no,
            id: format!("id-{seq}"),
            destination: "d".into(),
            partition_key: String::new(),
            payload: Vec::new(),
            headers: None,
            attempts: i64::from(!ready),
            ready,
        }
    }

    #[test]
    fn each_partition_gets_an_equal_share_of_a_batch() {
        assert_eq!(share(100, 32), 3);
        assert_eq!(share(100, 1), 100);
        assert_eq!(share(10, 32), 1, "at least one");
        assert_eq!(share(100, 0), 100);
    }

    #[test]
    fn partitions_that_gave_less_than_their_share_are_drained() {
        let rows = vec![row(1, 7, true), row(2, 8, true), row(3, 7, true)];
        let mut open = vec![7, 8, 9];
        drained(&mut open, &rows, 2, 10);
        assert_eq!(open, [7], "8 gave one of two, 9 none");
        // Cut by the limit (four partitions, one each, three in all): nothing can be told.
        let mut open = vec![7, 8, 9, 10];
        drained(&mut open, &rows, 1, 3);
        assert_eq!(open, [7, 8, 9, 10]);
        // Exactly full with every share fitting: whoever gave its share stays.
        let mut open = vec![7, 8];
        let full = vec![
            row(1, 7, true),
            row(2, 8, true),
            row(3, 7, true),
            row(4, 8, true),
        ];
        drained(&mut open, &full, 2, 4);
        assert_eq!(open, [7, 8]);
    }

    #[test]
    fn a_waiting_row_holds_back_the_rest_of_its_partition_only() {
        let rows = vec![
            row(1, 7, true),
            row(2, 8, false),
            row(3, 7, true),
            row(4, 8, true),
            row(5, 9, true),
            row(6, 7, false),
            row(7, 7, true),
        ];
        let (ready, waiting) = publishable(rows);
        let seqs: Vec<i64> = ready.iter().map(|r| r.seq).collect();
        assert_eq!(
            seqs,
            [1, 3, 5],
            "in insertion order, none after a waiting row of its partition"
        );
        assert_eq!(waiting, [8, 7]);
    }
}
