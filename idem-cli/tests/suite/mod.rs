//! The black-box suite, shared by `tests/sqlite.rs`, `tests/postgres.rs` and `tests/mysql.rs`
//! through `super::Db` (and `super::sql`, the backend's placeholders):
//! each scenario populates a fresh database with real handlers, runs the `idem` binary, and
//! asserts its output, its exit code and the tables. The file that includes this module (as
//! `scenarios`, with `#[macro_use]`) makes each scenario a test with `suite!`.

/// One `#[tokio::test]` per scenario of this module, in a module `suite` of the file that
/// includes it; ignored with the reason when the cfg given holds (the backend's server was not
/// named at build time).
macro_rules! suite {
    ($($absent:ident = $why:literal)?) => {
        mod suite {
            suite!(@tests [$($absent = $why)?];
                migrate_creates_the_tables_that_every_other_command_needs,
                stats_counts_records_leases_expired_records_and_versions_per_scope,
                inspect_shows_the_record_and_the_version_of_string_integer_and_tuple_keys,
                forget_makes_the_next_delivery_apply_again,
                release_ends_a_stuck_lease_so_the_next_delivery_runs,
                purge_removes_exactly_the_expired_records,
                poisoned_lists_counted_failures_and_clear_attempts_lets_the_next_delivery_run,
                retry_the_former_name_of_clear_attempts_still_clears_and_says_it_is_renamed,
                outbox_shows_pending_oldest_and_failed_publishes_per_destination,
                json_help_lists_exactly_the_fields_that_json_prints,
            );
        }
    };
    (@tests $absent:tt;) => {};
    (@tests [$($absent:ident = $why:literal)?]; $name:ident, $($rest:tt)*) => {
        #[tokio::test]
        $(#[cfg_attr($absent, ignore = $why)])?
        async fn $name() {
            super::scenarios::$name().await
        }

        suite!(@tests [$($absent = $why)?]; $($rest)*);
    };
}

use std::time::Duration;

use idem::outbox::OutboxStore;
use idem::{idempotent, Context, Outcome, Tx};
use serde_json::Value;
use sqlx::Pool;

use super::common::{idem, Run};
use super::{empty, Db, TestDb};

/// Opens a fresh database, or skips (with the reason already printed) when there is none.
macro_rules! db {
    () => {
        match empty().await {
            Some(db) => db,
            None => return,
        }
    };
}

/// A migrated database with the handlers' `effects` table.
macro_rules! migrated {
    () => {{
        let db = db!();
        idem::migrate(&db.pool).await.unwrap();
        sqlx::query("CREATE TABLE effects (handler TEXT NOT NULL, id TEXT NOT NULL)")
            .execute(&db.pool)
            .await
            .unwrap();
        db
    }};
}

async fn effect(tx: &mut Tx<'_, Db>, handler: &str, id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(super::sql(
        "INSERT INTO effects (handler, id) VALUES ($1, $2)",
    ))
    .bind(handler)
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// How many times `handler` applied `id`.
async fn applied(pool: &Pool<Db>, handler: &str, id: &str) -> i64 {
    sqlx::query_scalar(super::sql(
        "SELECT COUNT(*) FROM effects WHERE handler = $1 AND id = $2",
    ))
    .bind(handler)
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Records of `scope` in the table.
async fn records(pool: &Pool<Db>, scope: &str) -> i64 {
    sqlx::query_scalar(super::sql(
        "SELECT COUNT(*) FROM idem_records WHERE scope = $1",
    ))
    .bind(scope)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[idempotent(key = "id", scope = "cli::credit")]
async fn credit(tx: &mut Tx<'_, Db>, id: &str) -> Result<(), sqlx::Error> {
    effect(tx, "credit", id).await
}

#[idempotent(key = "id", scope = "cli::short", retention = "1ms")]
async fn short(tx: &mut Tx<'_, Db>, id: &str) -> Result<(), sqlx::Error> {
    effect(tx, "short", id).await
}

#[idempotent(
    key = "event",
    version = "version",
    entity = "order",
    scope = "cli::orders"
)]
async fn order_changed(
    tx: &mut Tx<'_, Db>,
    event: &str,
    order: i64,
    version: i64,
) -> Result<(), sqlx::Error> {
    effect(tx, "order_changed", event).await?;
    let _ = (order, version);
    Ok(())
}

#[idempotent(key = "(order, region)", scope = "cli::shipped")]
async fn shipped(tx: &mut Tx<'_, Db>, order: i64, region: &str) -> Result<(), sqlx::Error> {
    effect(tx, "shipped", &format!("{order}/{region}")).await
}

/// Lease mode; `crash` panics after the claim, leaving the lease held for an hour.
#[idempotent(
    key = "id",
    scope = "cli::lease",
    mode = "lease",
    lease = "1h",
    retention = "1ms"
)]
async fn charge(tx: &mut Tx<'_, Db>, id: &str, crash: bool) -> Result<(), sqlx::Error> {
    if crash {
        panic!("the worker crashed while holding the lease");
    }
    effect(tx, "charge", id).await
}

/// Runs `charge` in a task that panics, leaving `id` in progress.
async fn crash_charge(pool: &Pool<Db>, id: &'static str) {
    let pool = pool.clone();
    let crashed = tokio::spawn(async move { charge(&pool, id, true).await });
    assert!(crashed.await.unwrap_err().is_panic());
}

/// The binary's run against `db`.
fn run(db: &TestDb, args: &[&str]) -> Run {
    idem(Some(&db.url), args)
}

fn parse(run: &Run) -> Value {
    serde_json::from_str(run.ok()).unwrap_or_else(|err| panic!("{err}: {run:#?}"))
}

pub(super) async fn migrate_creates_the_tables_that_every_other_command_needs() {
    let db = db!();
    for args in [
        &["stats"][..],
        &["inspect", "cli::credit", "a"],
        &["forget", "--yes", "cli::credit", "a"],
        &["release", "cli::credit", "a"],
        &["purge"],
        &["poisoned"],
        &["outbox"],
    ] {
        let err = run(&db, args).fails(1).to_string();
        assert!(
            err.contains("no idem tables") && err.contains("run `idem migrate`"),
            "{err}"
        );
    }
    assert_eq!(
        run(&db, &["migrate"]).ok(),
        "idem's tables are up to date\n"
    );
    assert_eq!(
        run(&db, &["migrate"]).ok(),
        "idem's tables are up to date\n"
    );
    assert_eq!(run(&db, &["stats"]).ok(), "no records or versions yet\n");
    let stats = parse(&run(&db, &["stats", "--json"]));
    assert_eq!(stats["scopes"], serde_json::json!([]));
    db.close().await;
}

pub(super) async fn stats_counts_records_leases_expired_records_and_versions_per_scope() {
    let db = migrated!();
    for id in ["c1", "c2", "c3"] {
        assert_eq!(credit(&db.pool, id).await.unwrap(), Outcome::Applied(()));
    }
    short(&db.pool, "s1").await.unwrap();
    short(&db.pool, "s2").await.unwrap();
    order_changed(&db.pool, "e1", 41, 1).await.unwrap();
    order_changed(&db.pool, "e2", 42, 1).await.unwrap();
    order_changed(&db.pool, "e3", 42, 2).await.unwrap();
    crash_charge(&db.pool, "p1").await;
    tokio::time::sleep(Duration::from_millis(20)).await; // cli::short's 1 ms retention passes

    let stats = parse(&run(&db, &["stats", "--json"]));
    assert!(stats["now"].as_str().unwrap().ends_with('Z'));
    let scopes = stats["scopes"].as_array().unwrap();
    let names: Vec<&str> = scopes
        .iter()
        .map(|s| s["scope"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["cli::credit", "cli::lease", "cli::orders", "cli::short"]
    );
    let counts = |s: &Value| {
        [
            "records",
            "in_progress",
            "lapsed_leases",
            "expired",
            "versions",
        ]
        .map(|field| s[field].as_u64().unwrap())
    };
    assert_eq!(counts(&scopes[0]), [3, 0, 0, 0, 0]);
    assert_eq!(
        counts(&scopes[1]),
        [1, 1, 0, 0, 0],
        "a running lease is never expired"
    );
    assert_eq!(counts(&scopes[2]), [3, 0, 0, 0, 2]);
    assert_eq!(counts(&scopes[3]), [2, 0, 0, 2, 0]);
    for scope in scopes {
        let oldest = scope["oldest_processed_at"].as_str().unwrap();
        let newest = scope["newest_processed_at"].as_str().unwrap();
        assert!(oldest <= newest && newest.len() == 24, "{scope}");
    }

    let human = run(&db, &["stats", "--scope", "cli::short"]);
    let lines: Vec<&str> = human.ok().lines().collect();
    assert_eq!(lines[0], "cli::short");
    assert_eq!(
        lines[1],
        "  records     2 (0 in progress, 0 lapsed leases, 2 expired)"
    );
    assert!(lines[2].starts_with("  oldest      20") && lines[2].ends_with(')'));
    assert!(lines[3].starts_with("  newest      20"));
    assert_eq!(lines[4], "  versions    0");
    assert_eq!(lines.len(), 5);

    let one = parse(&run(&db, &["stats", "--scope", "cli::orders", "--json"]));
    assert_eq!(one["scopes"].as_array().unwrap().len(), 1);

    let err = run(&db, &["stats", "--scope", "cli::nope"])
        .fails(1)
        .to_string();
    assert!(err.contains("unknown scope `cli::nope`") && err.contains("idem stats"));
    db.close().await;
}

pub(super) async fn inspect_shows_the_record_and_the_version_of_string_integer_and_tuple_keys() {
    let db = migrated!();
    credit(&db.pool, "evt-1").await.unwrap();
    order_changed(&db.pool, "e1", 42, 7).await.unwrap();
    shipped(&db.pool, 42, "eu").await.unwrap();

    let out = run(&db, &["inspect", "cli::credit", "evt-1"]);
    let lines: Vec<&str> = out.ok().lines().collect();
    assert_eq!(lines[0], "scope       cli::credit");
    assert_eq!(lines[1], "key         evt-1");
    assert_eq!(lines[2], "record      done");
    assert!(lines[3].starts_with("processed   20") && lines[3].ends_with(')'));
    assert!(lines[4].starts_with("expires     20") && lines[4].contains("(in "));
    assert_eq!(lines.len(), 5);

    let json = parse(&run(&db, &["inspect", "cli::credit", "evt-1", "--json"]));
    assert_eq!(json["scope"], "cli::credit");
    assert_eq!(json["key"]["display"], "evt-1");
    assert_eq!(json["key"]["parts"], Value::Null);
    assert_eq!(json["key"]["hex"], "6576742d31");
    assert_eq!(json["record"]["state"], "done");
    assert_eq!(json["record"]["expired"], false);
    assert_eq!(json["record"]["lease_until"], Value::Null);
    assert!(
        json["record"]["processed_at"].as_str().unwrap()
            < json["record"]["expires_at"].as_str().unwrap()
    );
    assert_eq!(json["version"], Value::Null);

    // The entity 42 (an integer, typed in decimal) has a version row and no record.
    let out = run(&db, &["inspect", "cli::orders", "42"]);
    let text = out.ok();
    assert!(
        text.contains("record      none (the key is only an entity with a version)"),
        "{text}"
    );
    assert!(text.contains("version     7, updated 20"), "{text}");
    let json = parse(&run(&db, &["inspect", "cli::orders", "42", "--json"]));
    assert_eq!(json["record"], Value::Null);
    assert_eq!(json["version"]["version"], 7);

    // A tuple key, part by part.
    let out = run(
        &db,
        &["inspect", "cli::shipped", "--part", "42", "--part", "eu"],
    );
    assert!(
        out.ok()
            .contains("key         (42, eu)\nrecord      done\n"),
        "{out:#?}"
    );
    let json = parse(&run(
        &db,
        &[
            "inspect",
            "cli::shipped",
            "--part",
            "42",
            "--part",
            "eu",
            "--json",
        ],
    ));
    assert_eq!(json["key"]["parts"], serde_json::json!(["42", "eu"]));
    // The same text as one key is another key.
    let err = run(&db, &["inspect", "cli::shipped", "42"])
        .fails(1)
        .to_string();
    assert!(
        err.contains("no record or version of key `42` in scope `cli::shipped`"),
        "{err}"
    );

    let err = run(&db, &["inspect", "cli::credit", "evt-404"])
        .fails(1)
        .to_string();
    assert!(
        err.contains("evt-404") && err.contains("never handled, or purged"),
        "{err}"
    );
    let err = run(&db, &["inspect", "cli::nope", "evt-1"])
        .fails(1)
        .to_string();
    assert!(err.contains("unknown scope `cli::nope`"), "{err}");
    db.close().await;
}

pub(super) async fn forget_makes_the_next_delivery_apply_again() {
    let db = migrated!();
    assert_eq!(
        credit(&db.pool, "evt-1").await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(credit(&db.pool, "evt-1").await.unwrap(), Outcome::Duplicate);
    assert_eq!(applied(&db.pool, "credit", "evt-1").await, 1);

    // Not a terminal and no --yes: refused as bad usage, the record kept.
    let err = run(&db, &["forget", "cli::credit", "evt-1"])
        .fails(2)
        .to_string();
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(records(&db.pool, "cli::credit").await, 1);

    assert_eq!(
        run(&db, &["forget", "--yes", "cli::credit", "evt-1"]).ok(),
        "forgot key `evt-1` in scope `cli::credit`: its next delivery applies again\n"
    );
    assert_eq!(records(&db.pool, "cli::credit").await, 0);
    assert_eq!(
        credit(&db.pool, "evt-1").await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        applied(&db.pool, "credit", "evt-1").await,
        2,
        "applied again"
    );

    let err = run(&db, &["forget", "-y", "cli::credit", "evt-2"])
        .fails(1)
        .to_string();
    assert!(
        err.contains("no record of key `evt-2`") && err.contains("nothing to forget"),
        "{err}"
    );

    // A message in progress is not forgotten: that is release's job.
    crash_charge(&db.pool, "p1").await;
    let err = run(&db, &["forget", "--yes", "cli::lease", "p1"])
        .fails(1)
        .to_string();
    assert!(
        err.contains("in progress under a lease") && err.contains("idem release"),
        "{err}"
    );
    assert_eq!(records(&db.pool, "cli::lease").await, 1);
    db.close().await;
}

pub(super) async fn release_ends_a_stuck_lease_so_the_next_delivery_runs() {
    let db = migrated!();
    crash_charge(&db.pool, "p1").await;
    assert_eq!(
        charge(&db.pool, "p1", false).await.unwrap(),
        Outcome::InProgress
    );
    let json = parse(&run(&db, &["inspect", "cli::lease", "p1", "--json"]));
    assert_eq!(json["record"]["state"], "in_progress");
    assert!(json["record"]["lease_until"].is_string());
    let out = run(&db, &["inspect", "cli::lease", "p1"]);
    assert!(
        out.ok()
            .contains("record      in progress (a delivery holds the lease)\n"),
        "{out:#?}"
    );
    assert!(out.ok().contains("lease until 20"), "{out:#?}");

    let out = run(&db, &["release", "cli::lease", "p1"]);
    let text = out.ok();
    assert!(
        text.starts_with(
            "released key `p1` in scope `cli::lease`: its next delivery runs the handler; \
             its lease would have held until 20"
        ),
        "{text}"
    );
    assert!(
        text.ends_with(" (in 59m 59s)\n") || text.ends_with(" (in 1h)\n"),
        "{text}"
    );
    assert_eq!(records(&db.pool, "cli::lease").await, 0);
    assert_eq!(
        charge(&db.pool, "p1", false).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(applied(&db.pool, "charge", "p1").await, 1);

    let err = run(&db, &["release", "cli::lease", "p1"])
        .fails(1)
        .to_string();
    assert!(
        err.contains("is done, not in progress") && err.contains("idem forget"),
        "{err}"
    );
    assert_eq!(
        records(&db.pool, "cli::lease").await,
        1,
        "a done record is kept"
    );
    let err = run(&db, &["release", "cli::lease", "p2"])
        .fails(1)
        .to_string();
    assert!(err.contains("no record of key `p2`"), "{err}");
    let err = run(&db, &["release", "cli::nope", "p1"])
        .fails(1)
        .to_string();
    assert!(err.contains("unknown scope"), "{err}");
    db.close().await;
}

pub(super) async fn purge_removes_exactly_the_expired_records() {
    let db = migrated!();
    for id in ["s1", "s2", "s3", "s4", "s5"] {
        short(&db.pool, id).await.unwrap();
    }
    for id in ["c1", "c2", "c3"] {
        credit(&db.pool, id).await.unwrap();
    }
    crash_charge(&db.pool, "p1").await; // expired retention, but its lease runs: kept
    order_changed(&db.pool, "e1", 42, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let out = run(&db, &["purge", "--batch", "2"]);
    assert_eq!(out.ok(), "purged 5 expired records\n");
    // Not a terminal: a plain line per batch, no bar.
    assert_eq!(out.stderr, "purged 2 of 5\npurged 4 of 5\npurged 5 of 5\n");
    assert_eq!(records(&db.pool, "cli::short").await, 0);
    assert_eq!(records(&db.pool, "cli::credit").await, 3);
    assert_eq!(records(&db.pool, "cli::lease").await, 1);
    assert_eq!(records(&db.pool, "cli::orders").await, 1);

    assert_eq!(run(&db, &["purge"]).ok(), "purged 0 expired records\n");
    // A purged message is new again.
    assert_eq!(short(&db.pool, "s1").await.unwrap(), Outcome::Applied(()));
    db.close().await;
}

/// `max_attempts`: fails while `fail` is set; two failures poison it.
#[idempotent(key = "id", scope = "cli::flaky", max_attempts = 2)]
async fn flaky(tx: &mut Tx<'_, Db>, id: &str, fail: bool) -> Result<(), String> {
    if fail {
        return Err(format!("{id}: the provider is down"));
    }
    effect(tx, "flaky", id).await.map_err(|e| e.to_string())
}

async fn counted(pool: &Pool<Db>) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_attempts")
        .fetch_one(pool)
        .await
        .unwrap()
}

pub(super) async fn poisoned_lists_counted_failures_and_clear_attempts_lets_the_next_delivery_run()
{
    let db = migrated!();
    assert_eq!(
        run(&db, &["poisoned"]).ok(),
        "no failed attempts are counted: no message is poisoned\n"
    );
    for _ in 0..2 {
        assert!(flaky(&db.pool, "job-1", true).await.is_err());
    }
    assert_eq!(
        flaky(&db.pool, "job-1", false).await.unwrap(),
        Outcome::Poisoned { attempts: 2 }
    );
    let listed = run(&db, &["poisoned", "--scope", "cli::flaky"]);
    let line = listed.ok();
    assert!(
        line.starts_with("cli::flaky  job-1  2 failed attempts, the last "),
        "{line}"
    );
    // The last failure as idem recorded it (for an `Err`, its type: E need not be Display).
    let last: String = sqlx::query_scalar("SELECT last_error FROM idem_attempts")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(line.trim_end().ends_with(&format!(": {last}")), "{line}");
    let listed = parse(&run(&db, &["poisoned", "--scope", "cli::flaky", "--json"]));
    assert_eq!(listed["complete"], true);
    let messages = listed["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{listed}");
    assert_eq!(messages[0]["scope"], "cli::flaky");
    assert_eq!(messages[0]["key"]["display"], "job-1");
    assert_eq!(messages[0]["key"]["hex"], "6a6f622d31");
    assert_eq!(messages[0]["attempts"], 2);
    assert_eq!(messages[0]["last_error"], last.as_str());
    assert!(
        messages[0]["last_failed_at"].as_str().unwrap() <= listed["now"].as_str().unwrap(),
        "{listed}"
    );
    assert_eq!(
        run(&db, &["poisoned", "--scope", "cli::credit"]).ok(),
        "no failed attempts are counted: no message is poisoned\n"
    );
    let none = parse(&run(&db, &["poisoned", "--scope", "cli::credit", "--json"]));
    assert_eq!(none["messages"], serde_json::json!([]), "{none}");

    assert_eq!(
        run(&db, &["clear-attempts", "cli::flaky", "job-1"]).ok(),
        "cleared the failed attempts of key `job-1` in scope `cli::flaky`: its next delivery runs the handler\n"
    );
    assert_eq!(counted(&db.pool).await, 0);
    assert_eq!(
        flaky(&db.pool, "job-1", false).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(applied(&db.pool, "flaky", "job-1").await, 1);
    // Nothing counted any more: clear-attempts says so, exit 1.
    let err = run(&db, &["clear-attempts", "cli::flaky", "job-1"])
        .fails(1)
        .to_string();
    assert!(
        err.contains("no failed attempts are counted for key `job-1`")
            && err.contains("nothing to clear"),
        "{err}"
    );
    db.close().await;
}

pub(super) async fn retry_the_former_name_of_clear_attempts_still_clears_and_says_it_is_renamed() {
    let db = migrated!();
    for _ in 0..2 {
        assert!(flaky(&db.pool, "job-2", true).await.is_err());
    }
    assert_eq!(counted(&db.pool).await, 1);
    let out = run(&db, &["retry", "cli::flaky", "job-2"]);
    assert_eq!(
        out.ok(),
        "cleared the failed attempts of key `job-2` in scope `cli::flaky`: its next delivery runs the handler\n"
    );
    assert!(
        out.stderr
            .starts_with("note: `idem retry` is renamed `idem clear-attempts`")
            && out.stderr.lines().count() == 1,
        "{out:#?}"
    );
    assert_eq!(counted(&db.pool).await, 0);
    assert_eq!(
        flaky(&db.pool, "job-2", false).await.unwrap(),
        Outcome::Applied(())
    );
    db.close().await;
}

/// Service A of a pipeline: publishes a payment and an email through the outbox, in the
/// handler's transaction; `fail` rolls both back.
#[idempotent(key = "id", scope = "cli::paid")]
async fn paid(tx: &mut Tx<'_, Db>, id: &str, fail: bool, ctx: &Context) -> Result<(), sqlx::Error> {
    effect(tx, "paid", id).await?;
    ctx.publish(tx, "payments", &serde_json::json!({ "order": id }))
        .await?;
    ctx.outgoing("emails")
        .partition_key(id.to_string())
        .publish(tx, &serde_json::json!({ "to": id }))
        .await?;
    if fail {
        return Err(sqlx::Error::Protocol("failed after publishing".into()));
    }
    Ok(())
}

/// The outbox rows of `destination`, in order.
async fn outbox_seqs(pool: &Pool<Db>, destination: &str) -> Vec<i64> {
    sqlx::query_scalar(super::sql(
        "SELECT seq FROM idem_outbox WHERE destination = $1 ORDER BY seq",
    ))
    .bind(destination)
    .fetch_all(pool)
    .await
    .unwrap()
}

pub(super) async fn outbox_shows_pending_oldest_and_failed_publishes_per_destination() {
    let db = migrated!();
    assert_eq!(
        run(&db, &["outbox"]).ok(),
        "the outbox is empty: no message pending or sent\n"
    );
    for id in ["o1", "o2", "o3"] {
        assert_eq!(
            paid(&db.pool, id, false).await.unwrap(),
            Outcome::Applied(())
        );
    }
    assert!(paid(&db.pool, "o4", true).await.is_err(), "rolled back");
    let (payments, emails) = (
        outbox_seqs(&db.pool, "payments").await,
        outbox_seqs(&db.pool, "emails").await,
    );
    assert_eq!((payments.len(), emails.len()), (3, 3));
    // What a relay writes: the first payment confirmed and marked sent; two emails failed,
    // the first of them twice.
    let mut conn = db.pool.acquire().await.unwrap();
    assert_eq!(
        <Db as OutboxStore>::mark_sent(&mut conn, &payments[..1])
            .await
            .unwrap(),
        1
    );
    let backoff = Duration::from_secs(3600);
    <Db as OutboxStore>::mark_failed(&mut conn, &emails[..2], backoff, "connection refused")
        .await
        .unwrap();
    <Db as OutboxStore>::mark_failed(&mut conn, &emails[..1], backoff, "broker said no")
        .await
        .unwrap();
    drop(conn);

    let out = run(&db, &["outbox"]);
    let lines: Vec<&str> = out.ok().lines().collect();
    assert_eq!(lines[0], "emails", "{lines:#?}");
    assert_eq!(lines[1], "  pending     3");
    assert!(lines[2].starts_with("  oldest      20") && lines[2].ends_with(')'));
    assert_eq!(
        lines[3],
        "  failed      2 (up to 2 failed publishes; the last: broker said no)"
    );
    assert_eq!(
        lines[4],
        "  sent        0 (kept until the relay purges them)"
    );
    assert_eq!(lines[5], "");
    assert_eq!(lines[6], "payments");
    assert_eq!(lines[7], "  pending     2");
    assert!(lines[8].starts_with("  oldest      20"));
    assert_eq!(
        lines[9],
        "  sent        1 (kept until the relay purges them)"
    );
    assert_eq!(lines.len(), 10);

    let json = parse(&run(&db, &["outbox", "--json"]));
    let now = json["now"].as_str().unwrap();
    let destinations = json["destinations"].as_array().unwrap();
    assert_eq!(destinations.len(), 2);
    let emails_json = &destinations[0];
    assert_eq!(emails_json["destination"], "emails");
    assert_eq!(emails_json["pending"], 3);
    assert_eq!(emails_json["failed"], 2);
    assert_eq!(emails_json["most_attempts"], 2);
    assert_eq!(emails_json["last_error"], "broker said no");
    assert_eq!(emails_json["sent"], 0);
    let payments_json = &destinations[1];
    assert_eq!(
        (
            &payments_json["pending"],
            &payments_json["failed"],
            &payments_json["sent"]
        ),
        (&Value::from(2), &Value::from(0), &Value::from(1))
    );
    assert_eq!(payments_json["last_error"], Value::Null);
    for d in destinations {
        let oldest = d["oldest_pending_at"].as_str().unwrap();
        assert!(oldest.len() == 24 && oldest <= now, "{d}");
        assert!(d["oldest_pending_age_secs"].is_u64(), "{d}");
    }

    // One destination; once everything is sent, nothing is pending and no age is shown.
    let mut conn = db.pool.acquire().await.unwrap();
    <Db as OutboxStore>::mark_sent(&mut conn, &payments[1..])
        .await
        .unwrap();
    drop(conn);
    assert_eq!(
        run(&db, &["outbox", "--destination", "payments"]).ok(),
        "payments\n  pending     0\n  sent        3 (kept until the relay purges them)\n"
    );
    let one = parse(&run(
        &db,
        &["outbox", "--destination", "payments", "--json"],
    ));
    assert_eq!(one["destinations"][0]["oldest_pending_at"], Value::Null);
    assert_eq!(
        one["destinations"][0]["oldest_pending_age_secs"],
        Value::Null
    );
    let err = run(&db, &["outbox", "--destination", "refunds"])
        .fails(1)
        .to_string();
    assert!(
        err.contains("unknown destination `refunds`") && err.contains("idem outbox"),
        "{err}"
    );

    // A database migrated before the outbox existed.
    sqlx::query("DROP TABLE idem_outbox")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = run(&db, &["outbox"]).fails(1).to_string();
    assert!(
        err.contains("predates the outbox") && err.contains("idem migrate"),
        "{err}"
    );
    db.close().await;
}

/// Every key of a JSON value, at any depth (arrays looked into).
fn json_keys(value: &Value, keys: &mut std::collections::BTreeSet<String>) {
    match value {
        Value::Object(fields) => {
            for (key, value) in fields {
                keys.insert(key.clone());
                json_keys(value, keys);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| json_keys(item, keys)),
        _ => {}
    }
}

/// The field names that `idem <command> --help` lists under `--json`: the first word of each
/// line of its long help that names a field (a lowercase name, then two spaces or more).
fn json_help_fields(command: &str) -> std::collections::BTreeSet<String> {
    let help = idem(None, &[command, "--help"]);
    let text = help.ok();
    let section = text
        .split_once("      --json\n")
        .unwrap_or_else(|| panic!("`{command} --help` has --json: {text}"))
        .1;
    section
        .lines()
        .take_while(|line| !line.trim_start().starts_with('-'))
        .filter_map(|line| {
            let line = line.trim_start();
            let (name, rest) = line.split_once("  ")?;
            let is_name = !name.is_empty()
                && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                && !rest.trim().is_empty();
            is_name.then(|| name.to_string())
        })
        .collect()
}

pub(super) async fn json_help_lists_exactly_the_fields_that_json_prints() {
    let db = migrated!();
    credit(&db.pool, "evt-1").await.unwrap();
    order_changed(&db.pool, "e1", 42, 7).await.unwrap();
    for _ in 0..2 {
        assert!(flaky(&db.pool, "job-1", true).await.is_err());
    }
    paid(&db.pool, "o1", false).await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let emails = outbox_seqs(&db.pool, "emails").await;
    <Db as OutboxStore>::mark_failed(&mut conn, &emails, Duration::from_secs(3600), "down")
        .await
        .unwrap();
    drop(conn);

    // Each read command, run so that every object its JSON can hold is there (not null).
    let runs: [(&str, &[&[&str]]); 4] = [
        ("stats", &[&["stats", "--json"]]),
        (
            "inspect",
            &[
                &["inspect", "cli::credit", "evt-1", "--json"], // a record
                &["inspect", "cli::orders", "42", "--json"],    // a version
            ],
        ),
        ("poisoned", &[&["poisoned", "--json"]]),
        ("outbox", &[&["outbox", "--json"]]),
    ];
    for (command, args) in runs {
        let mut printed = std::collections::BTreeSet::new();
        for args in args {
            json_keys(&parse(&run(&db, args)), &mut printed);
        }
        let listed = json_help_fields(command);
        assert!(printed.len() >= 8, "{command}: {printed:?}");
        assert_eq!(
            listed, printed,
            "`idem {command} --help` lists the fields `idem {command} --json` prints"
        );
        // The short help stays one line and points at the long one.
        let short = idem(None, &[command, "-h"]);
        let line = short
            .ok()
            .lines()
            .find(|line| line.trim_start().starts_with("--json"))
            .unwrap_or_else(|| panic!("{short:#?}"));
        assert!(
            line.ends_with("Print JSON (`--help` lists its fields)"),
            "{line}"
        );
    }
    db.close().await;
}
