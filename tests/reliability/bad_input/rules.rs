// The rules of `bad_input.rs`, included once per backend in a module `rules` of its own: they
// see that backend's `Db`, `database()`, `options()`, `release()`, `EXPIRES_IN_DAYS` and
// `SERVER_SLEEP`, and `backend!` in `bad_input.rs` makes each a test.
// (Included: no inner doc comments.)

use std::time::Duration;

use idem::__private::{Begun, Claim};
use idem::key::{KeyPart, KeyProblem, MAX_SCOPE_LEN};
use idem::{idempotent, Error, Outcome, Tx};
use sqlx::{AssertSqlSafe, Pool};

use crate::common::Stored;

#[derive(Debug, Clone)]
struct Msg {
    id: String,
}

fn msg(id: impl Into<String>) -> Msg {
    Msg { id: id.into() }
}

/// `$n` placeholders as the backend writes them (MySQL: `?`, in the same order).
fn q(sql: &str) -> AssertSqlSafe<String> {
    Stored::<Db>::sql(sql)
}

/// The handler's effect: one row per application, no unique key, so a double shows.
async fn effect(tx: &mut Tx<'_, Db>, id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(q("INSERT INTO effects (id) VALUES ($1)"))
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Another pool of `connections` on the same database.
async fn reopen(pool: &Pool<Db>, connections: u32) -> Pool<Db> {
    sqlx::pool::PoolOptions::<Db>::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(20))
        .connect_with(options(pool).await)
        .await
        .unwrap()
}

/// A database of its own with the effects table, or `None` (the test skipped).
async fn prepared() -> Option<Pool<Db>> {
    let pool = database().await?;
    sqlx::query("CREATE TABLE effects (id VARCHAR(64) NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    Some(pool)
}

async fn count(pool: &Pool<Db>, sql: &str) -> i64 {
    sqlx::query_scalar(q(sql)).fetch_one(pool).await.unwrap()
}

/// Rows in (effects, idem_records, idem_versions).
async fn rows(pool: &Pool<Db>) -> (i64, i64, i64) {
    (
        count(pool, "SELECT COUNT(*) FROM effects").await,
        count(pool, "SELECT COUNT(*) FROM idem_records").await,
        count(pool, "SELECT COUNT(*) FROM idem_versions").await,
    )
}

async fn effects_of(pool: &Pool<Db>, id: &str) -> i64 {
    sqlx::query_scalar(q("SELECT COUNT(*) FROM effects WHERE id = $1"))
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

const AT_LIMIT_ASCII: &str = "sssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss";
const AT_LIMIT_MULTIBYTE: &str = "éééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééa";
const AT_LIMIT_EMOJI: &str = "🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀abc";

/// Handlers that write their effect and nothing else, each with its scope (and options).
macro_rules! effect_only {
    ($($name:ident: $($option:ident = $value:tt),+;)*) => {$(
        #[idempotent(key = "msg.id", $($option = $value),+)]
        async fn $name(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<(), sqlx::Error> {
            effect(tx, &msg.id).await
        }
    )*};
}

effect_only! {
    scope_ascii: scope = "sssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss";
    scope_multibyte: scope = "éééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééééa";
    scope_emoji: scope = "🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀abc";
    scope_over: scope = "ssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssssss";
    century: scope = "bad_input::century", retention = "36525d";
    plain: scope = "bad_input::plain";
}

/// `msgs` through [`plain`], in one `idem::batch`.
async fn plain_batch(
    pool: &Pool<Db>,
    msgs: &[Msg],
) -> Vec<Result<Outcome<()>, Error<sqlx::Error>>> {
    idem::batch(pool, msgs, async |b, m| plain(b, m).await)
        .await
        .unwrap()
}

/// Writes its effect, then waits (in the client) far longer than any caller's timeout.
#[idempotent(key = "msg.id", scope = "bad_input::slow")]
async fn slow(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<(), sqlx::Error> {
    effect(tx, &msg.id).await?;
    tokio::time::sleep(Duration::from_secs(30)).await;
    Ok(())
}

/// Writes its effect, then runs a statement that takes seconds in the database.
#[idempotent(key = "msg.id", scope = "bad_input::slow_server")]
async fn slow_server(tx: &mut Tx<'_, Db>, msg: &Msg) -> Result<(), sqlx::Error> {
    effect(tx, &msg.id).await?;
    sqlx::query(SERVER_SLEEP).execute(&mut **tx).await?;
    Ok(())
}

/// Scopes of 255 bytes (ASCII, 2-byte and 4-byte UTF-8) are stored as they are; one of 256
/// bytes is refused before anything is written.
pub(super) async fn scopes_at_the_limit_are_stored_and_over_it_refused() {
    let Some(pool) = prepared().await else { return };
    for scope in [AT_LIMIT_ASCII, AT_LIMIT_MULTIBYTE, AT_LIMIT_EMOJI] {
        assert_eq!(scope.len(), MAX_SCOPE_LEN);
    }
    let m = msg("m1");
    assert_eq!(scope_ascii(&pool, &m).await.unwrap(), Outcome::Applied(()));
    assert_eq!(
        scope_multibyte(&pool, &m).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(scope_emoji(&pool, &m).await.unwrap(), Outcome::Applied(()));
    assert_eq!(scope_ascii(&pool, &m).await.unwrap(), Outcome::Duplicate);
    assert_eq!(
        scope_multibyte(&pool, &m).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(scope_emoji(&pool, &m).await.unwrap(), Outcome::Duplicate);
    for scope in [AT_LIMIT_ASCII, AT_LIMIT_MULTIBYTE, AT_LIMIT_EMOJI] {
        assert_eq!(Stored(&pool).records(scope, "m1").await, 1, "{scope}");
    }
    let mut stored: Vec<String> = sqlx::query_scalar("SELECT scope FROM idem_records")
        .fetch_all(&pool)
        .await
        .unwrap();
    stored.sort();
    let mut expected = vec![
        AT_LIMIT_ASCII.to_string(),
        AT_LIMIT_MULTIBYTE.to_string(),
        AT_LIMIT_EMOJI.to_string(),
    ];
    expected.sort();
    assert_eq!(stored, expected, "stored byte for byte, not truncated");

    let err = scope_over(&pool, &msg("m2")).await.unwrap_err();
    let Error::Key(key) = &err else {
        panic!("expected Error::Key, got {err:?}")
    };
    assert_eq!(key.part(), KeyPart::Scope);
    assert_eq!(
        key.problem(),
        &KeyProblem::TooLong {
            len: MAX_SCOPE_LEN + 1,
            max: MAX_SCOPE_LEN
        }
    );
    assert_eq!(
        rows(&pool).await,
        (3, 3, 0),
        "nothing written for the refused scope"
    );
    release(pool).await;
}

/// A scope with a NUL character (only reachable below the attribute, which refuses a literal
/// one at compile time: `idem-ui/tests/ui/fail/bad_literals.rs`) is refused before anything is written,
/// on every backend alike.
pub(super) async fn a_nul_in_a_scope_is_refused() {
    let Some(pool) = prepared().await else { return };
    for scope in ["bad_input\0nul", "\0", "trailing\0"] {
        let begun: Begun<'_, '_, Db, (), sqlx::Error> =
            Claim::new(scope).key("k").begin(&pool).await;
        match begun {
            Begun::Done(Err(Error::Key(key))) => {
                assert_eq!(key.part(), KeyPart::Scope);
                assert_eq!(key.problem(), &KeyProblem::Nul);
                assert!(key.to_string().contains("NUL"), "{key}");
            }
            Begun::Done(other) => panic!("{scope:?}: expected Error::Key, got {other:?}"),
            Begun::Run(..) => panic!("{scope:?}: claimed"),
        }
    }
    assert_eq!(rows(&pool).await, (0, 0, 0));
    release(pool).await;
}

/// A retention of 100 years is stored as such (no overflow, no wrap past 2038) and the record
/// still deduplicates.
pub(super) async fn a_retention_of_a_hundred_years_is_kept() {
    let Some(pool) = prepared().await else { return };
    let m = msg("c1");
    assert_eq!(century(&pool, &m).await.unwrap(), Outcome::Applied(()));
    assert_eq!(century(&pool, &m).await.unwrap(), Outcome::Duplicate);
    let days: i64 = sqlx::query_scalar(EXPIRES_IN_DAYS)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!((36_524..=36_525).contains(&days), "expires in {days} days");
    assert_eq!(rows(&pool).await, (1, 1, 0));
    release(pool).await;
}

/// Batches of 0, 1 and 50,000 messages (more than PostgreSQL's 65,535 bind parameters would
/// allow if the claim bound three per row in one statement): each message applied once, and the
/// whole batch again is all duplicates.
pub(super) async fn batches_of_zero_one_and_fifty_thousand() {
    let Some(pool) = prepared().await else { return };
    let none: Vec<Msg> = Vec::new();
    let results = plain_batch(&pool, &none).await;
    assert!(results.is_empty());
    assert_eq!(rows(&pool).await, (0, 0, 0));

    let one = vec![msg("one")];
    let results = plain_batch(&pool, &one).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].as_ref().unwrap(), &Outcome::Applied(()));
    assert_eq!(rows(&pool).await, (1, 1, 0));

    const MANY: usize = 50_000;
    let many: Vec<Msg> = (0..MANY).map(|i| msg(format!("b{i}"))).collect();
    let results = plain_batch(&pool, &many).await;
    assert_eq!(results.len(), MANY);
    assert!(results
        .iter()
        .all(|r| matches!(r, Ok(Outcome::Applied(())))));
    let total = 1 + MANY as i64;
    assert_eq!(rows(&pool).await, (total, total, 0));
    assert_eq!(
        count(&pool, "SELECT COUNT(DISTINCT id) FROM effects").await,
        total,
        "each message once"
    );

    let results = plain_batch(&pool, &many).await;
    assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Duplicate))));
    assert_eq!(
        rows(&pool).await,
        (total, total, 0),
        "a redelivered batch writes nothing"
    );
    release(pool).await;
}

/// The pool is closed while 4 workers handle messages: each delivery either committed (effect
/// and record) or failed with a store error (neither); nothing half-recorded.
pub(super) async fn a_pool_closed_mid_run_leaves_nothing_half_done() {
    let Some(pool) = prepared().await else { return };
    let reader = reopen(&pool, 4).await;
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                for i in 0.. {
                    let m = msg(format!("w{w}-{i}"));
                    let result = plain(&pool, &m).await;
                    let failed = result.is_err();
                    seen.push((m.id, result));
                    if failed {
                        break;
                    }
                }
                seen
            })
        })
        .collect();
    // Let some messages through, then close the pool under the workers.
    while count(&reader, "SELECT COUNT(*) FROM effects").await < 40 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pool.close().await;
    let mut applied = 0;
    for worker in workers {
        let seen = worker.await.unwrap();
        let (last, results) = seen.split_last().unwrap();
        for (id, result) in results {
            assert_eq!(result.as_ref().unwrap(), &Outcome::Applied(()), "{id}");
            assert_eq!(effects_of(&reader, id).await, 1, "{id}");
            assert_eq!(
                Stored(&reader).records("bad_input::plain", id).await,
                1,
                "{id}"
            );
            applied += 1;
        }
        let (id, result) = last;
        let err = result.as_ref().unwrap_err();
        assert!(
            matches!(err, Error::Store(sqlx::Error::PoolClosed)),
            "{id}: {err:?}"
        );
        assert_eq!(effects_of(&reader, id).await, 0, "{id}");
        assert_eq!(
            Stored(&reader).records("bad_input::plain", id).await,
            0,
            "{id}"
        );
    }
    assert_eq!(rows(&reader).await, (applied, applied, 0));
    release(reader).await;
}

/// A handler future dropped by a caller's timeout, mid-body (waiting in the client, or inside
/// a slow statement in the database): nothing of it stays, the pool's only connection comes
/// back usable, the next message is served, and the redelivery applies once.
pub(super) async fn a_handler_dropped_by_a_timeout_leaves_nothing_and_the_pool_serves_on() {
    let Some(pool) = prepared().await else { return };
    let single = reopen(&pool, 1).await;
    let m = msg("dropped-1");
    let timed_out = tokio::time::timeout(Duration::from_millis(200), slow(&single, &m)).await;
    assert!(timed_out.is_err(), "the timeout fired");
    let m2 = msg("dropped-2");
    let timed_out =
        tokio::time::timeout(Duration::from_millis(200), slow_server(&single, &m2)).await;
    assert!(timed_out.is_err(), "the timeout fired");
    assert_eq!(
        rows(&pool).await,
        (0, 0, 0),
        "nothing of the dropped handlers stays"
    );

    // The only connection is back (or replaced): the next message is served.
    let next = msg("next");
    assert_eq!(plain(&single, &next).await.unwrap(), Outcome::Applied(()));
    // And the redeliveries apply, once.
    for (id, scope) in [
        ("dropped-1", "bad_input::plain"),
        ("dropped-2", "bad_input::plain"),
    ] {
        assert_eq!(
            plain(&single, &msg(id)).await.unwrap(),
            Outcome::Applied(())
        );
        assert_eq!(plain(&single, &msg(id)).await.unwrap(), Outcome::Duplicate);
        assert_eq!(effects_of(&pool, id).await, 1, "{id}");
        assert_eq!(Stored(&pool).records(scope, id).await, 1, "{id}");
    }
    assert_eq!(
        Stored(&pool).records("bad_input::slow", "dropped-1").await,
        0
    );
    assert_eq!(
        Stored(&pool)
            .records("bad_input::slow_server", "dropped-2")
            .await,
        0
    );
    assert_eq!(rows(&pool).await, (3, 3, 0));
    single.close().await;
    release(pool).await;
}
