// The rules, generic over the backend of the module that includes this file (`Db`).

use idem::{idempotent, Outcome, Tx};
use sqlx::Pool;


/// How many rows `table` has.
async fn count(pool: &Pool<Db>, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn effects_table(pool: &Pool<Db>) {
    sqlx::query("CREATE TABLE effects (msg TEXT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// Key only, no option: what idem 0.1 wrote.
#[idempotent(key = "id", scope = "features::plain")]
async fn plain(tx: &mut Tx<'_, Db>, id: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (msg) VALUES ($1)")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Migration 0002 applies to a database created by 0001, and the records it holds still dedupe.
pub async fn an_old_schema_migrates_and_its_records_still_dedupe(_: &Pool<Db>) {
    let pool = old_database().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(MIGRATION_0001))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE idem_migrations (version BIGINT PRIMARY KEY); \
         INSERT INTO idem_migrations (version) VALUES (1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    effects_table(&pool).await;
    // Live records, written by the old schema's statements.
    assert_eq!(plain(&pool, "m1").await.unwrap(), Outcome::Applied(()));
    assert_eq!(plain(&pool, "m2").await.unwrap(), Outcome::Applied(()));

    idem::migrate(&pool).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idem_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(versions, [1, 2, 3]); // 0003: the outbox
    assert_eq!(count(&pool, "idem_attempts").await, 0);
    let stamped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE fingerprint IS NULL AND result IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stamped, 2, "old records keep their rows, new columns empty");

    assert_eq!(plain(&pool, "m1").await.unwrap(), Outcome::Duplicate);
    assert_eq!(plain(&pool, "m2").await.unwrap(), Outcome::Duplicate);
    assert_eq!(plain(&pool, "m3").await.unwrap(), Outcome::Applied(()));
    assert_eq!(count(&pool, "effects").await, 3);
    assert_eq!(count(&pool, "idem_records").await, 3);
    pool.close().await;
}

// ---------------------------------------------------------------------------------------------
// Messages and handlers.

#[derive(Clone, Debug)]
pub struct Msg {
    id: String,
    body: String,
    version: i64,
    fail: bool,
    panic: bool,
}

fn msg(id: &str, body: &str) -> Msg {
    Msg {
        id: id.into(),
        body: body.into(),
        version: 1,
        fail: false,
        panic: false,
    }
}

/// What a `replay = true` handler returns.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    id: String,
    body: String,
    seq: i64,
}

/// The body every handler below shares: one row in `effects`, then fails or panics if told.
async fn effect(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    sqlx::query("INSERT INTO effects (msg) VALUES ($1)")
        .bind(format!("{}:{}", msg.id, msg.body))
        .execute(&mut **tx)
        .await?;
    if msg.panic {
        panic!("handler panicked after its write");
    }
    if msg.fail {
        return Err(sqlx::Error::Protocol("handler failed after its write".into()));
    }
    let seq: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(&mut **tx)
        .await?;
    Ok(Receipt {
        id: msg.id.clone(),
        body: msg.body.clone(),
        seq,
    })
}

#[idempotent(key = "msg.id", fingerprint = "msg.body", scope = "features::fingerprinted")]
async fn fingerprinted(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    effect(tx, msg).await
}

#[idempotent(key = "msg.id", replay = true, scope = "features::replayed")]
async fn replayed(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    effect(tx, msg).await
}

#[idempotent(
    key = "msg.id",
    version = "msg.version",
    fingerprint = "msg.body",
    replay = true,
    scope = "features::versioned"
)]
async fn versioned(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    effect(tx, msg).await
}

#[idempotent(
    key = "msg.id",
    mode = "lease",
    fingerprint = "msg.body",
    replay = true,
    scope = "features::leased"
)]
async fn leased(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    effect(tx, msg).await
}

/// Returns a value of `len` bytes as JSON (a string of `len - 2` characters).
#[idempotent(key = "id", replay = true, scope = "features::large")]
async fn large(tx: &mut Tx<'_, Db>, id: &str, len: usize) -> Result<String, sqlx::Error> {
    effect(tx, &msg(id, "large")).await?;
    Ok("x".repeat(len - 2))
}

static COUNTED_RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[idempotent(key = "msg.id", max_attempts = 3, scope = "features::counted")]
async fn counted(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    COUNTED_RUNS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    effect(tx, msg).await
}

/// `counted` without the run counter, for the tests that do not count runs.
#[idempotent(key = "msg.id", max_attempts = 3, scope = "features::flaky")]
async fn flaky(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    effect(tx, msg).await
}

#[idempotent(key = "msg.id", max_attempts = 2, scope = "features::counted_in_batch")]
async fn counted_in_batch(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<Receipt, sqlx::Error> {
    effect(tx, msg).await
}

// ---------------------------------------------------------------------------------------------
// Helpers that read the database.

async fn scalar<T>(pool: &Pool<Db>, sql: &'static str) -> T
where
    T: Send + Unpin + for<'r> sqlx::Decode<'r, Db> + sqlx::Type<Db>,
{
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn conflict<T: std::fmt::Debug>(
    result: Result<Outcome<T>, idem::Error<sqlx::Error>>,
) -> (&'static str, String, String) {
    match result {
        Err(idem::Error::Conflict {
            scope,
            stored,
            given,
        }) => (scope, stored, given),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

/// How many failed attempts `idem_attempts` holds (0 without a row).
async fn attempts(pool: &Pool<Db>) -> i64 {
    sqlx::query_scalar::<_, i64>("SELECT CAST(COALESCE(SUM(attempts), 0) AS BIGINT) FROM idem_attempts")
        .fetch_one(pool)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// fingerprint

/// Same key, same payload: a duplicate; same key, another payload: a conflict, nothing runs;
/// the record keeps the first payload's SHA-256.
pub async fn fingerprint_refuses_another_payload(pool: &Pool<Db>) {
    effects_table(pool).await;
    assert!(fingerprinted(pool, &msg("k", "a")).await.unwrap().is_applied());
    assert_eq!(fingerprinted(pool, &msg("k", "a")).await.unwrap(), Outcome::Duplicate);
    let (scope, stored, given) = conflict(fingerprinted(pool, &msg("k", "b")).await);
    assert_eq!(scope, "features::fingerprinted");
    assert_ne!(stored, given);
    let kept: Vec<u8> = scalar(pool, "SELECT fingerprint FROM idem_records").await;
    assert_eq!(kept.len(), 32);
    assert_eq!(hex(&kept), stored);
    assert_eq!(count(pool, "effects").await, 1);
    assert_eq!(count(pool, "idem_records").await, 1);
}

/// Inside a caller's transaction (a savepoint), a reused key with another payload is a conflict.
pub async fn fingerprint_is_checked_in_a_savepoint(pool: &Pool<Db>) {
    effects_table(pool).await;
    let mut tx = pool.begin().await.unwrap();
    assert!(fingerprinted(&mut tx, &msg("k", "a")).await.unwrap().is_applied());
    conflict(fingerprinted(&mut tx, &msg("k", "b")).await);
    assert_eq!(fingerprinted(&mut tx, &msg("k", "a")).await.unwrap(), Outcome::Duplicate);
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    conflict(fingerprinted(&mut tx, &msg("k", "c")).await);
    tx.commit().await.unwrap();
    assert_eq!(count(pool, "effects").await, 1);
}

/// In a batch: a key stored before and a key repeated within the batch are both checked.
pub async fn fingerprint_is_checked_in_a_batch(pool: &Pool<Db>) {
    effects_table(pool).await;
    assert!(fingerprinted(pool, &msg("old", "a")).await.unwrap().is_applied());
    let messages = [
        msg("old", "b"),
        msg("old", "a"),
        msg("new", "x"),
        msg("new", "y"),
        msg("new", "x"),
    ];
    let results = idem::batch(pool, &messages, async |b, m| fingerprinted(b, m).await)
        .await
        .unwrap();
    let mut results = results.into_iter();
    conflict(results.next().unwrap());
    assert_eq!(results.next().unwrap().unwrap(), Outcome::Duplicate);
    assert!(results.next().unwrap().unwrap().is_applied());
    conflict(results.next().unwrap());
    assert_eq!(results.next().unwrap().unwrap(), Outcome::Duplicate);
    assert_eq!(count(pool, "effects").await, 2);
    assert_eq!(count(pool, "idem_records").await, 2);
}

/// Lease mode: a done message and one in progress are both checked against the fingerprint.
pub async fn fingerprint_is_checked_in_lease_mode(pool: &Pool<Db>) {
    effects_table(pool).await;
    assert!(leased(pool, &msg("k", "a")).await.unwrap().is_applied());
    conflict(leased(pool, &msg("k", "b")).await);
    assert!(matches!(leased(pool, &msg("k", "a")).await.unwrap(), Outcome::Replayed(_)));
    // In progress elsewhere: the lease row already carries the fingerprint.
    sqlx::query(
        "INSERT INTO idem_records (scope, msg_key, expires_at, lease_until, lease_token, fingerprint) \
         SELECT scope, $1, expires_at, expires_at, 7, fingerprint FROM idem_records",
    )
    .bind(b"busy".as_slice())
    .execute(pool)
    .await
    .unwrap();
    conflict(leased(pool, &msg("busy", "b")).await);
    assert_eq!(leased(pool, &msg("busy", "a")).await.unwrap(), Outcome::InProgress);
    assert_eq!(count(pool, "effects").await, 1);
}

/// Key + version: the fingerprint is kept on the version row; an equal version with another
/// payload is a conflict, an older one stale.
pub async fn fingerprint_works_with_version(pool: &Pool<Db>) {
    effects_table(pool).await;
    let v = |body: &str, version| Msg {
        version,
        ..msg("k", body)
    };
    assert!(versioned(pool, &v("a", 2)).await.unwrap().is_applied());
    conflict(versioned(pool, &v("b", 2)).await);
    assert!(matches!(versioned(pool, &v("a", 2)).await.unwrap(), Outcome::Replayed(_)));
    assert_eq!(versioned(pool, &v("b", 1)).await.unwrap(), Outcome::Stale { latest: 2 });
    let kept: Vec<u8> = scalar(pool, "SELECT fingerprint FROM idem_versions").await;
    assert_eq!(kept.len(), 32);
    assert!(versioned(pool, &v("b", 3)).await.unwrap().is_applied());
    conflict(versioned(pool, &v("a", 3)).await);
    assert_eq!(count(pool, "effects").await, 2);
    assert_eq!(count(pool, "idem_records").await, 0);
}

/// Two payloads with one key delivered at once: exactly one applies, the other is a conflict.
pub async fn concurrent_payloads_one_applies_one_conflicts(pool: &Pool<Db>) {
    effects_table(pool).await;
    for round in 0..5 {
        let id = format!("race{round}");
        let (a, b) = (msg(&id, "a"), msg(&id, "b"));
        let (ra, rb) = tokio::join!(fingerprinted(pool, &a), fingerprinted(pool, &b));
        let applied = [&ra, &rb]
            .iter()
            .filter(|r| matches!(r, Ok(Outcome::Applied(_))))
            .count();
        let conflicts = [&ra, &rb]
            .iter()
            .filter(|r| matches!(r, Err(idem::Error::Conflict { .. })))
            .count();
        assert_eq!((applied, conflicts), (1, 1), "{ra:?} {rb:?}");
    }
    assert_eq!(count(pool, "effects").await, 5);
}

// ---------------------------------------------------------------------------------------------
// replay

/// A duplicate returns the first delivery's value, stored as JSON with the record; the body
/// does not run again.
pub async fn replay_returns_the_first_value(pool: &Pool<Db>) {
    effects_table(pool).await;
    let first = replayed(pool, &msg("k", "a")).await.unwrap().applied().unwrap();
    assert_eq!(first.seq, 1);
    let again = replayed(pool, &msg("k", "a")).await.unwrap();
    assert_eq!(again, Outcome::Replayed(first.clone()));
    let json: Vec<u8> = scalar(pool, "SELECT result FROM idem_records").await;
    assert_eq!(serde_json::from_slice::<Receipt>(&json).unwrap(), first);
    // Inside a caller's transaction too.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        replayed(&mut tx, &msg("k", "a")).await.unwrap(),
        Outcome::Replayed(first)
    );
    tx.commit().await.unwrap();
    assert_eq!(count(pool, "effects").await, 1);
}

/// In a batch: a key stored before and a key repeated within the batch are both replayed.
pub async fn replay_in_a_batch(pool: &Pool<Db>) {
    effects_table(pool).await;
    let old = replayed(pool, &msg("old", "a")).await.unwrap().applied().unwrap();
    let messages = [msg("old", "a"), msg("new", "b"), msg("new", "b")];
    let results = idem::batch(pool, &messages, async |b, m| replayed(b, m).await)
        .await
        .unwrap();
    let results: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(results[0], Outcome::Replayed(old));
    let new = results[1].clone().applied().unwrap();
    assert_eq!(results[2], Outcome::Replayed(new));
    assert_eq!(count(pool, "effects").await, 2);
}

/// Lease mode and key + version mode replay too.
pub async fn replay_in_lease_and_version_modes(pool: &Pool<Db>) {
    effects_table(pool).await;
    let first = leased(pool, &msg("k", "a")).await.unwrap().applied().unwrap();
    assert_eq!(leased(pool, &msg("k", "a")).await.unwrap(), Outcome::Replayed(first));
    let first = versioned(pool, &msg("k", "a")).await.unwrap().applied().unwrap();
    assert_eq!(versioned(pool, &msg("k", "a")).await.unwrap(), Outcome::Replayed(first));
    assert_eq!(count(pool, "effects").await, 2);
}

/// A value over the cap fails the delivery with `Error::Replay`, and nothing is written; one
/// at the cap is kept.
pub async fn replay_over_the_cap_writes_nothing(pool: &Pool<Db>) {
    effects_table(pool).await;
    match large(pool, "big", idem::MAX_REPLAY_LEN + 1).await {
        Err(idem::Error::Replay { scope, problem }) => {
            assert_eq!(scope, "features::large");
            assert!(problem.contains("65537 bytes"), "{problem}");
        }
        other => panic!("expected a replay error, got {other:?}"),
    }
    assert_eq!(count(pool, "effects").await, 0);
    assert_eq!(count(pool, "idem_records").await, 0);
    let value = large(pool, "fits", idem::MAX_REPLAY_LEN).await.unwrap().applied().unwrap();
    assert_eq!(
        large(pool, "fits", idem::MAX_REPLAY_LEN).await.unwrap(),
        Outcome::Replayed(value)
    );
}

// ---------------------------------------------------------------------------------------------
// max_attempts

/// Errors and panics are counted after the rollback; at the bound the message is poisoned and
/// does not run; the count survives the rolled-back transactions.
pub async fn failures_are_counted_and_poison_at_the_bound(pool: &Pool<Db>) {
    use std::sync::atomic::Ordering::SeqCst;
    effects_table(pool).await;
    COUNTED_RUNS.store(0, SeqCst);
    let failing = Msg {
        fail: true,
        ..msg("bad", "a")
    };
    let panicking = Msg {
        panic: true,
        ..msg("bad", "a")
    };
    assert!(matches!(counted(pool, &failing).await, Err(idem::Error::Handler(_))));
    let caught = idem::__private::catch_unwind(counted(pool, &panicking)).await;
    assert!(caught.is_err(), "the panic is resumed after counting");
    assert_eq!(attempts(pool).await, 2);
    let last: String = scalar(pool, "SELECT last_error FROM idem_attempts").await;
    assert!(last.contains("panicked after its write"), "{last}");
    assert!(matches!(counted(pool, &failing).await, Err(idem::Error::Handler(_))));
    assert_eq!(attempts(pool).await, 3);
    // Poisoned: even a delivery that would succeed does not run.
    assert_eq!(
        counted(pool, &msg("bad", "a")).await.unwrap(),
        Outcome::Poisoned { attempts: 3 }
    );
    assert_eq!(COUNTED_RUNS.load(SeqCst), 3);
    assert_eq!(count(pool, "effects").await, 0);
    assert_eq!(count(pool, "idem_records").await, 0);
}

/// A success before the bound clears the count, in the transaction of its effect.
pub async fn a_success_clears_the_count(pool: &Pool<Db>) {
    effects_table(pool).await;
    let failing = Msg {
        fail: true,
        ..msg("flaky", "a")
    };
    for _ in 0..2 {
        assert!(flaky(pool, &failing).await.is_err());
    }
    assert_eq!(attempts(pool).await, 2);
    assert!(flaky(pool, &msg("flaky", "a")).await.unwrap().is_applied());
    assert_eq!(count(pool, "idem_attempts").await, 0);
    assert_eq!(flaky(pool, &msg("flaky", "a")).await.unwrap(), Outcome::Duplicate);
    assert_eq!(count(pool, "effects").await, 1);
}

/// In a batch, a failing message is counted once per delivery (when the batch runs it alone),
/// and once poisoned it is poisoned in the batch too, while the others apply.
pub async fn attempts_are_counted_in_a_batch(pool: &Pool<Db>) {
    effects_table(pool).await;
    let failing = Msg {
        fail: true,
        ..msg("bad", "a")
    };
    for round in 0..2 {
        let messages = [msg(&format!("ok{round}"), "a"), failing.clone()];
        let results = idem::batch(pool, &messages, async |b, m| counted_in_batch(b, m).await)
            .await
            .unwrap();
        assert!(results[0].as_ref().unwrap().is_applied());
        assert!(matches!(results[1], Err(idem::Error::Handler(_))));
        assert_eq!(attempts(pool).await, round + 1);
    }
    let messages = [msg("ok9", "a"), msg("bad", "a")];
    let results = idem::batch(pool, &messages, async |b, m| counted_in_batch(b, m).await)
        .await
        .unwrap();
    assert!(results[0].as_ref().unwrap().is_applied());
    assert_eq!(
        results[1].as_ref().unwrap(),
        &Outcome::Poisoned { attempts: 2 }
    );
    assert_eq!(count(pool, "effects").await, 3);
    assert_eq!(count(pool, "idem_records").await, 3);
}

// ---------------------------------------------------------------------------------------------
// metrics

/// A recorder that keeps every counter's total and every histogram's number of samples, by
/// name and labels (`name{label=value,...}`).
#[cfg(feature = "metrics")]
#[derive(Default)]
struct TestRecorder(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>);

#[cfg(feature = "metrics")]
struct Slot(
    std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    String,
);

#[cfg(feature = "metrics")]
impl Slot {
    fn add(&self, n: u64) {
        *self.0.lock().unwrap().entry(self.1.clone()).or_default() += n;
    }
}

#[cfg(feature = "metrics")]
impl metrics::CounterFn for Slot {
    fn increment(&self, n: u64) {
        self.add(n);
    }
    fn absolute(&self, _: u64) {}
}

#[cfg(feature = "metrics")]
impl metrics::HistogramFn for Slot {
    fn record(&self, _: f64) {
        self.add(1);
    }
}

#[cfg(feature = "metrics")]
impl TestRecorder {
    fn slot(&self, key: &metrics::Key) -> std::sync::Arc<Slot> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        std::sync::Arc::new(Slot(self.0.clone(), name))
    }

    fn get(&self, name: &str) -> u64 {
        self.0.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

#[cfg(feature = "metrics")]
impl metrics::Recorder for TestRecorder {
    fn describe_counter(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_gauge(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn describe_histogram(&self, _: metrics::KeyName, _: Option<metrics::Unit>, _: metrics::SharedString) {}
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.slot(key))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::from_arc(self.slot(key))
    }
}

/// The counters equal the outcomes the handlers returned, labelled by scope and outcome; each
/// claim and each delivery is timed once.
#[cfg(feature = "metrics")]
pub async fn metrics_count_the_outcomes(pool: &Pool<Db>) {
    let recorder = TestRecorder::default();
    let _guard = metrics::set_default_local_recorder(&recorder);
    idem::metrics::describe();
    effects_table(pool).await;
    assert!(fingerprinted(pool, &msg("k", "a")).await.unwrap().is_applied());
    assert_eq!(fingerprinted(pool, &msg("k", "a")).await.unwrap(), Outcome::Duplicate);
    conflict(fingerprinted(pool, &msg("k", "b")).await);
    let failing = Msg {
        fail: true,
        ..msg("m", "a")
    };
    assert!(flaky(pool, &failing).await.is_err());
    assert!(flaky(pool, &msg("m", "a")).await.unwrap().is_applied());
    let scope = |s: &str, outcome: &str| {
        recorder.get(&format!("idem_messages_total{{outcome={outcome},scope=features::{s}}}"))
    };
    assert_eq!(scope("fingerprinted", "applied"), 1);
    assert_eq!(scope("fingerprinted", "duplicate"), 1);
    assert_eq!(scope("fingerprinted", "conflict"), 1);
    assert_eq!(scope("flaky", "failed"), 1);
    assert_eq!(scope("flaky", "applied"), 1);
    assert_eq!(
        recorder.get("idem_claim_duration_seconds{scope=features::fingerprinted}"),
        3
    );
    assert_eq!(
        recorder.get("idem_handle_duration_seconds{outcome=applied,scope=features::flaky}"),
        1
    );
    // Nothing to purge: the counter is still reported, at 0.
    idem::retention::purge_expired(pool, 100).await.unwrap();
    assert_eq!(recorder.get("idem_purged_records_total{}"), 0);
}
