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
                dead_letters_summary_groups_and_replay_sends_each_once,
                dead_letters_show_prints_everything_and_a_binary_payload_in_base64,
                purge_removes_dead_letters_past_their_retention_and_buries_abandoned_retries,
                dead_letters_json_help_lists_exactly_the_fields_that_json_prints,
                a_replay_killed_halfway_and_run_again_redrives_each_once,
                a_replay_to_the_consumer_parks_each_dead_letter_once,
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
        &["dead-letters", "summary"],
        &["dead-letters", "replay", "--all"],
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
/// line of its long help that names a field (lowercase letters, digits and `_`, then two
/// spaces or more).
fn json_help_fields(command: &[&str]) -> std::collections::BTreeSet<String> {
    let help = idem(None, &[command, &["--help"]].concat());
    let text = help.ok();
    let section = text
        .split_once("      --json\n")
        .unwrap_or_else(|| panic!("`{command:?} --help` has --json: {text}"))
        .1;
    section
        .lines()
        .take_while(|line| !line.trim_start().starts_with('-'))
        .filter_map(|line| {
            let line = line.trim_start();
            let (name, rest) = line.split_once("  ")?;
            let is_name = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
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
        let listed = json_help_fields(&[command]);
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

/// A dead letter as a consumer's recovery writes one, put in with plain SQL.
struct Dead<'a> {
    consumer: &'a str,
    scope: Option<&'a str>,
    key: Option<&'a [u8]>,
    reason: &'a str,
    error: &'a str,
    payload: &'a [u8],
    headers: Option<&'a str>,
    destination: &'a str,
    /// When it failed, first and last (epoch milliseconds).
    failed_ms: i64,
}

/// Writes `dead` with the shape and group the consumers give it.
async fn bury(conn: &mut <Db as sqlx::Database>::Connection, dead: &Dead<'_>) {
    let shape = idem::recover::shape(dead.error);
    let group = idem::recover::group_of(dead.consumer, dead.scope, dead.reason, &shape);
    sqlx::query(super::query(format!(
        "INSERT INTO idem_dead_letters (consumer, scope, msg_key, reason, error, error_shape, \
         error_group, payload, headers, broker, source, coordinates, destination, attempts, \
         first_failed_at, last_failed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, \
         'rabbitmq', 'orders-in', 'delivery tag 7', $10, 3, {}, {})",
        super::time("$11"),
        super::time("$12")
    )))
    .bind(dead.consumer)
    .bind(dead.scope)
    .bind(dead.key)
    .bind(dead.reason)
    .bind(dead.error)
    .bind(&shape)
    .bind(&group)
    .bind(dead.payload)
    .bind(dead.headers)
    .bind(dead.destination)
    .bind(dead.failed_ms)
    .bind(dead.failed_ms)
    .execute(conn)
    .await
    .unwrap();
}

/// The database's clock, in epoch milliseconds.
async fn db_now(pool: &Pool<Db>) -> i64 {
    <Db as idem::admin::Admin>::now_ms(pool).await.unwrap()
}

/// One `i64` a query of the suite counts or selects (`$1`, `$2` bound in order).
async fn scalar(pool: &Pool<Db>, sql: &'static str, binds: &[&str]) -> i64 {
    let mut query = sqlx::query_scalar(super::sql(sql));
    for bind in binds {
        query = query.bind(*bind);
    }
    query.fetch_one(pool).await.unwrap()
}

/// Dead letters of `group` in `state`.
async fn in_state(pool: &Pool<Db>, group: &str, state: &str) -> i64 {
    scalar(
        pool,
        "SELECT COUNT(*) FROM idem_dead_letters WHERE error_group = $1 AND state = $2",
        &[group, state],
    )
    .await
}

/// Outbox rows to `destination`.
async fn outbox_rows(pool: &Pool<Db>, destination: &str) -> i64 {
    scalar(
        pool,
        "SELECT COUNT(*) FROM idem_outbox WHERE destination = $1",
        &[destination],
    )
    .await
}

/// Dead letters of `group` whose replay is an outbox row (each at most one: ids are unique).
async fn replayed_into_outbox(pool: &Pool<Db>, group: &str) -> i64 {
    scalar(
        pool,
        "SELECT COUNT(*) FROM idem_dead_letters d JOIN idem_outbox o ON o.id = d.replayed_as \
         WHERE d.error_group = $1",
        &[group],
    )
    .await
}

/// The ids of `group`'s dead letters, in order.
async fn group_ids(pool: &Pool<Db>, group: &str) -> Vec<i64> {
    sqlx::query_scalar(super::sql(
        "SELECT id FROM idem_dead_letters WHERE error_group = $1 ORDER BY id",
    ))
    .bind(group)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The three causes of [`three_causes`]: scope, reason, the error of message `n`, where its
/// replay goes.
struct Cause {
    scope: String,
    reason: &'static str,
    error: fn(usize) -> String,
    destination: String,
}

/// 300 dead letters of one consumer: 100 for each of three causes, across two scopes, each
/// error naming its message's own numbers. Cause 0 is `flaky`'s (scope `cli::flaky`, keys
/// `job-N`), so that a replay's clearing of counted attempts shows in the handler.
async fn three_causes(pool: &Pool<Db>, consumer: &str, run: &str) -> [Cause; 3] {
    let causes = [
        Cause {
            scope: "cli::flaky".to_string(),
            reason: "poisoned",
            error: |n| format!("order {} not found", 1000 + n * 7),
            destination: format!("{run}-orders"),
        },
        Cause {
            scope: "cli::flaky".to_string(),
            reason: "poisoned",
            error: |n| format!("customer {n} has no card on file"),
            destination: format!("{run}-orders"),
        },
        Cause {
            scope: format!("{run}::cards"),
            reason: "conflict",
            error: |n| format!("key 'evt-{n}' was applied with another payload"),
            destination: format!("{run}-cards"),
        },
    ];
    let now = db_now(pool).await;
    let mut tx = pool.begin().await.unwrap();
    for n in 0..100 {
        for (c, cause) in causes.iter().enumerate() {
            let key = format!("job-{}", c * 100 + n);
            let headers = format!(r#"[["trace-id","t-{c}-{n}"]]"#);
            let payload = format!(r#"{{"job":"{key}","cause":{c}}}"#);
            bury(
                &mut tx,
                &Dead {
                    consumer,
                    scope: Some(&cause.scope),
                    key: Some(key.as_bytes()),
                    reason: cause.reason,
                    error: &(cause.error)(n),
                    payload: payload.as_bytes(),
                    headers: Some(&headers),
                    destination: &cause.destination,
                    failed_ms: now - 60_000 + n as i64,
                },
            )
            .await;
        }
    }
    tx.commit().await.unwrap();
    causes
}

/// The group of `cause` for `consumer`, as the consumers compute it.
fn group_of(consumer: &str, cause: &Cause) -> String {
    let shape = idem::recover::shape(&(cause.error)(0));
    idem::recover::group_of(consumer, Some(&cause.scope), cause.reason, &shape)
}

pub(super) async fn dead_letters_summary_groups_and_replay_sends_each_once() {
    let db = migrated!();
    let tag = super::common::unique_name("dl");
    let consumer = format!("{tag}-consumer");
    assert_eq!(
        run_dl(&db, &["summary"]).ok(),
        "no dead letters: nothing waits for an operator\n"
    );
    let causes = three_causes(&db.pool, &consumer, &tag).await;
    let groups: Vec<String> = causes.iter().map(|c| group_of(&consumer, c)).collect();
    // Jobs 0..5 of cause 0 failed twice in `flaky` (max_attempts = 2): poisoned.
    for n in 0..5 {
        for _ in 0..2 {
            assert!(flaky(&db.pool, &format!("job-{n}"), true).await.is_err());
        }
    }
    assert_eq!(counted(&db.pool).await, 5);

    // Three groups of 100, one per cause, though no two errors are alike.
    let summary = parse(&run_dl(&db, &["summary", "--json"]));
    let listed = summary["groups"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{summary}");
    let mut seen: Vec<&str> = listed
        .iter()
        .map(|g| {
            assert_eq!(g["count"], 100, "{g}");
            assert_eq!(g["consumer"], consumer.as_str());
            g["group"].as_str().unwrap()
        })
        .collect();
    seen.sort_unstable();
    let mut expected: Vec<&str> = groups.iter().map(String::as_str).collect();
    expected.sort_unstable();
    assert_eq!(seen, expected);
    let cards = listed.iter().find(|g| g["group"] == groups[2]).unwrap();
    assert_eq!(
        cards["error_shape"],
        "key '…' was applied with another payload"
    );
    assert_eq!(cards["scope"], causes[2].scope.as_str());
    assert_eq!(cards["reason"], "conflict");
    let text = run_dl(&db, &["summary", "--scope", &causes[2].scope]);
    let lines: Vec<&str> = text.ok().lines().collect();
    assert_eq!(lines[0], format!("{}  100 dead letters", groups[2]));
    assert_eq!(lines[1], format!("  consumer    {consumer}"));
    assert_eq!(lines[2], format!("  scope       {}", causes[2].scope));
    assert_eq!(lines[3], "  reason      conflict");
    assert_eq!(
        lines[4],
        "  error       key '…' was applied with another payload"
    );
    assert!(lines[5].starts_with("  first       20") && lines[6].starts_with("  last        20"));
    assert_eq!(
        lines[8],
        "1 group, 100 dead letters; `idem dead-letters list --group GROUP` lists one group"
    );
    assert_eq!(lines.len(), 9);

    // Times: each failed about a minute ago, by the database's clock.
    for (args, groups_found) in [
        (&["--since", "2m"][..], 3),
        (&["--since", "1970-01-02"], 3),
        (&["--since", "1s"], 0),
        (&["--until", "2m"], 0),
        (&["--until", "1s", "--scope", "cli::flaky"], 2),
        (&["--until", "1970-01-02T00:00:00+01:00"], 0),
    ] {
        let found = parse(&run_dl(&db, &[&["summary", "--json"], args].concat()));
        assert_eq!(
            found["groups"].as_array().unwrap().len(),
            groups_found,
            "{args:?}: {found}"
        );
    }
    assert_eq!(
        run_dl(&db, &["summary", "--until", "2m"]).ok(),
        "no open dead letter matches\n"
    );

    // A dry run says what it would do and changes nothing.
    let dry = run_dl(&db, &["replay", "--group", &groups[0], "--dry-run"]);
    let text = dry.ok();
    assert!(
        text.starts_with("would replay 100 dead letters:\n"),
        "{text}"
    );
    assert!(
        text.ends_with("(a dry run: nothing was changed)\n"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 102);
    let dry = parse(&run_dl(
        &db,
        &["replay", "--group", &groups[0], "--dry-run", "--json"],
    ));
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["replayed"].as_array().unwrap().len(), 100);
    assert_eq!(outbox_rows(&db.pool, &causes[0].destination).await, 0);
    assert_eq!(in_state(&db.pool, &groups[0], "dead").await, 100);
    assert_eq!(counted(&db.pool).await, 5);

    // The replay: 100 outbox rows, the group replayed, the others untouched.
    let out = run_dl(&db, &["replay", "--group", &groups[0]]);
    assert_eq!(
        out.ok(),
        "replayed 100 dead letters: each is an outbox message now, which the relay publishes \
         to its destination (`idem outbox` shows them)\n"
    );
    assert_eq!(outbox_rows(&db.pool, &causes[0].destination).await, 100);
    assert_eq!(in_state(&db.pool, &groups[0], "replayed").await, 100);
    assert_eq!(replayed_into_outbox(&db.pool, &groups[0]).await, 100);
    assert_eq!(in_state(&db.pool, &groups[1], "dead").await, 100);
    assert_eq!(in_state(&db.pool, &groups[2], "dead").await, 100);
    assert_eq!(outbox_rows(&db.pool, &causes[2].destination).await, 0);
    // Its payload and headers went along; the counted attempts are cleared, so the poisoned
    // message runs its handler again when it comes back.
    let (payload, headers, partition_key): (Vec<u8>, Option<String>, String) =
        sqlx::query_as(super::sql(
            "SELECT o.payload, o.headers, o.partition_key FROM idem_outbox o \
             JOIN idem_dead_letters d ON o.id = d.replayed_as WHERE d.msg_key = $1",
        ))
        .bind(&b"job-3"[..])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(payload, br#"{"job":"job-3","cause":0}"#);
    assert_eq!(headers.as_deref(), Some(r#"[["trace-id","t-0-3"]]"#));
    assert_eq!(partition_key, "");
    assert_eq!(counted(&db.pool).await, 0);
    assert_eq!(
        flaky(&db.pool, "job-3", false).await.unwrap(),
        Outcome::Applied(())
    );

    // Again: nothing more.
    assert_eq!(
        run_dl(&db, &["replay", "--group", &groups[0]]).ok(),
        "no open dead letter matches: nothing to replay\n"
    );
    assert_eq!(outbox_rows(&db.pool, &causes[0].destination).await, 100);

    // A replay killed halfway through a group, run again: 37 replayed by id first, then the
    // group. The second destination is shared with the first group: 100 more rows, each once.
    let ids = group_ids(&db.pool, &groups[1]).await;
    assert_eq!(ids.len(), 100);
    let mut args = vec!["replay".to_string()];
    for id in &ids[..37] {
        args.extend(["--id".to_string(), id.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = parse(&run_dl(&db, &[&args[..], &["--json"]].concat()));
    assert_eq!(first["replayed"].as_array().unwrap().len(), 37, "{first}");
    assert_eq!(in_state(&db.pool, &groups[1], "replayed").await, 37);
    let rest = parse(&run_dl(&db, &["replay", "--group", &groups[1], "--json"]));
    assert_eq!(rest["replayed"].as_array().unwrap().len(), 63, "{rest}");
    assert_eq!(rest["skipped"], serde_json::json!([]));
    assert_eq!(outbox_rows(&db.pool, &causes[1].destination).await, 200);
    assert_eq!(in_state(&db.pool, &groups[1], "replayed").await, 100);
    assert_eq!(replayed_into_outbox(&db.pool, &groups[1]).await, 100);
    // By id once more: each is skipped, not sent twice, and that is no failure.
    let again = run_dl(&db, &["replay", "--id", &ids[0].to_string()]);
    assert_eq!(
        again.ok(),
        format!("skipped {}: it is replayed, not dead\n", ids[0])
    );
    assert_eq!(outbox_rows(&db.pool, &causes[1].destination).await, 200);
    // An id that no dead letter has is a failure, after the report.
    let missing = run_dl(&db, &["replay", "--id", "999999999"]);
    assert_eq!(missing.code, Some(1));
    assert_eq!(missing.stdout, "no dead letter has id 999999999\n");
    assert_eq!(
        missing.stderr,
        "error: 1 of the selected dead letters was not replayed: 1 missing, 0 refused\n"
    );

    // Discard: a dry run first, then the group leaves the summary, its rows kept, discarded.
    let dry = run_dl(&db, &["discard", "--group", &groups[2], "--dry-run"]);
    assert!(
        dry.ok().starts_with("would discard 100 dead letters:\n"),
        "{dry:#?}"
    );
    assert_eq!(in_state(&db.pool, &groups[2], "dead").await, 100);
    assert_eq!(
        run_dl(&db, &["discard", "--group", &groups[2]]).ok(),
        "discarded 100 dead letters: they stay, discarded, until `idem purge` removes them \
         after the retention\n"
    );
    assert_eq!(in_state(&db.pool, &groups[2], "discarded").await, 100);
    assert_eq!(outbox_rows(&db.pool, &causes[2].destination).await, 0);
    assert_eq!(
        run_dl(&db, &["summary"]).ok(),
        "no dead letters: nothing waits for an operator\n"
    );
    let json = parse(&run_dl(&db, &["discard", "--group", &groups[2], "--json"]));
    assert_eq!(json["discarded"], 0);

    // The list pages through a state, in id order.
    let page = run_dl(
        &db,
        &[
            "list",
            "--group",
            &groups[2],
            "--state",
            "discarded",
            "--limit",
            "60",
        ],
    );
    let lines: Vec<&str> = page.ok().lines().collect();
    assert_eq!(lines.len(), 61);
    let ids = group_ids(&db.pool, &groups[2]).await;
    assert!(
        lines[0].starts_with(&format!(
            "{}  {}  job-200  conflict  {}  3 attempts, the last 20",
            ids[0], causes[2].scope, groups[2]
        )),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("): key 'evt-0' was applied with another payload  [discarded 20"),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[60],
        format!("(the first 60; --after {} lists the next)", ids[59])
    );
    let next = parse(&run_dl(
        &db,
        &[
            "list",
            "--group",
            &groups[2],
            "--state",
            "discarded",
            "--after",
            &ids[59].to_string(),
            "--json",
        ],
    ));
    let rows = next["dead_letters"].as_array().unwrap();
    assert_eq!(rows.len(), 40);
    assert_eq!(rows[0]["id"], ids[60]);
    assert_eq!(next["next_after"], Value::Null);
    assert_eq!(run_dl(&db, &["list"]).ok(), "no open dead letter matches\n");
    db.close().await;
}

/// `idem dead-letters ARGS` against `db`.
fn run_dl(db: &TestDb, args: &[&str]) -> Run {
    run(db, &[&["dead-letters"], args].concat())
}

pub(super) async fn dead_letters_show_prints_everything_and_a_binary_payload_in_base64() {
    let db = migrated!();
    let tag = super::common::unique_name("dl");
    let consumer = format!("{tag}-consumer");
    let now = db_now(&db.pool).await;
    let mut conn = db.pool.acquire().await.unwrap();
    let base = Dead {
        consumer: &consumer,
        scope: None,
        key: None,
        reason: "undecodable",
        error: "expected value at line 1 column 1",
        payload: &[0xff, 0xfe, 0x00, 0x61, 0x62],
        headers: None,
        destination: "orders-in",
        failed_ms: now - 5_000,
    };
    bury(&mut conn, &base).await;
    let scope = format!("{tag}::billing");
    bury(
        &mut conn,
        &Dead {
            scope: Some(&scope),
            key: Some(b"evt-9"),
            reason: "poisoned",
            error: "order 9 not found",
            payload: br#"{"order":9,"lines":[{"sku":"a"}]}"#,
            headers: Some(r#"[["trace-id","t-9"],["content-type","application/json"]]"#),
            ..base
        },
    )
    .await;
    drop(conn);
    let ids: Vec<i64> = sqlx::query_scalar(super::sql(
        "SELECT id FROM idem_dead_letters WHERE consumer = $1 ORDER BY id",
    ))
    .bind(&consumer)
    .fetch_all(&db.pool)
    .await
    .unwrap();

    let shown = run_dl(&db, &["show", &ids[0].to_string()]);
    let lines: Vec<&str> = shown.ok().lines().collect();
    assert_eq!(lines[0], format!("id           {}", ids[0]));
    assert_eq!(lines[1], "state        dead");
    assert_eq!(lines[2], format!("consumer     {consumer}"));
    assert_eq!(lines[3], "scope        (no scope)");
    assert_eq!(lines[4], "key          (no key)");
    assert_eq!(lines[5], "reason       undecodable");
    assert_eq!(lines[6], "error        expected value at line 1 column 1");
    assert!(lines[7].ends_with(" (expected value at line # column #)"));
    assert_eq!(lines[8], "broker       rabbitmq");
    assert_eq!(lines[9], "source       orders-in");
    assert_eq!(lines[10], "coordinates  delivery tag 7");
    assert_eq!(lines[11], "destination  orders-in");
    assert_eq!(lines[12], "attempts     3");
    assert!(lines[13].starts_with("first failed 20") && lines[13].ends_with("s ago)"));
    assert!(lines[14].starts_with("last failed  20"));
    assert_eq!(lines[15], "headers      none");
    assert_eq!(
        lines[16],
        "payload      5 bytes, not UTF-8, in base64 (`base64 -d` decodes it)"
    );
    assert_eq!(lines[17], "//4AYWI=");
    assert_eq!(lines.len(), 18);
    let json = parse(&run_dl(&db, &["show", &ids[0].to_string(), "--json"]));
    let dead = &json["dead_letter"];
    assert_eq!(dead["payload"]["encoding"], "binary");
    assert_eq!(dead["payload"]["text"], Value::Null);
    assert_eq!(dead["payload"]["base64"], "//4AYWI=");
    assert_eq!(dead["payload"]["size"], 5);
    assert_eq!(dead["scope"], Value::Null);
    assert_eq!(dead["key"], Value::Null);

    let shown = run_dl(&db, &["show", &ids[1].to_string()]);
    let text = shown.ok();
    assert!(text.contains("\nkey          evt-9\n"), "{text}");
    assert!(
        text.ends_with(
            "headers      2\n  trace-id: t-9\n  content-type: application/json\n\
             payload      JSON, 33 bytes\n{\n  \"order\": 9,\n  \"lines\": [\n    {\n      \
             \"sku\": \"a\"\n    }\n  ]\n}\n"
        ),
        "{text}"
    );
    let json = parse(&run_dl(&db, &["show", &ids[1].to_string(), "--json"]));
    let dead = &json["dead_letter"];
    assert_eq!(dead["key"]["display"], "evt-9");
    assert_eq!(
        dead["headers"][1],
        serde_json::json!(["content-type", "application/json"])
    );
    assert_eq!(dead["payload"]["encoding"], "json");
    assert_eq!(
        dead["payload"]["text"],
        r#"{"order":9,"lines":[{"sku":"a"}]}"#
    );

    let err = run_dl(&db, &["show", "999999999"]).fails(1).to_string();
    assert!(err.contains("no dead letter has id 999999999"), "{err}");

    // A database migrated before dead letters existed.
    sqlx::query("DROP TABLE idem_dead_letters")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = run_dl(&db, &["summary"]).fails(1).to_string();
    assert!(
        err.contains("predates dead letters") && err.contains("idem migrate"),
        "{err}"
    );
    assert_eq!(run(&db, &["purge"]).ok(), "purged 0 expired records\n");
    db.close().await;
}

pub(super) async fn purge_removes_dead_letters_past_their_retention_and_buries_abandoned_retries() {
    let db = migrated!();
    let tag = super::common::unique_name("dl");
    let consumer = format!("{tag}-consumer");
    let scope = format!("{tag}::orders");
    let now = db_now(&db.pool).await;
    let day = 86_400_000;
    // Keys tell the rows apart: (key, failed days ago, state, settled days ago).
    let rows: [(&str, i64, &str, Option<i64>); 6] = [
        ("dead-new", 0, "dead", None),
        ("dead-old", 3, "dead", None),
        ("replayed-old", 5, "replayed", Some(3)),
        ("replayed-new", 5, "replayed", Some(0)),
        ("discarded-old", 4, "discarded", Some(3)),
        ("discarded-new", 1, "discarded", Some(0)),
    ];
    let mut conn = db.pool.acquire().await.unwrap();
    for (key, ago, _, _) in rows {
        bury(
            &mut conn,
            &Dead {
                consumer: &consumer,
                scope: Some(&scope),
                key: Some(key.as_bytes()),
                reason: "poisoned",
                error: "boom",
                payload: b"{}",
                headers: None,
                destination: "orders-in",
                failed_ms: now - ago * day - 1_000,
            },
        )
        .await;
    }
    for (key, _, state, settled) in rows {
        let Some(settled) = settled else { continue };
        sqlx::query(super::query(format!(
            "UPDATE idem_dead_letters SET state = $1, settled_at = {} WHERE msg_key = $3",
            super::time("$2")
        )))
        .bind(state)
        .bind(now - settled * day)
        .bind(key.as_bytes())
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    // Parked retries: due 3 days ago (abandoned), due 3 days ago but held now, due an hour ago.
    for (due_ago, lease_in, error) in [
        (3 * day, None, Some("order 7 not found")),
        (3 * day, Some(3_600_000), Some("held")),
        (3_600_000, None, None),
    ] {
        sqlx::query(super::query(format!(
            "INSERT INTO idem_parked (consumer, payload, headers, broker, source, coordinates, \
             destination, attempts, last_error, first_failed_at, due_at, lease_until) VALUES \
             ($1, $2, NULL, 'nats', 'orders', 'stream sequence 4', 'orders', 2, $3, {}, {}, {})",
            super::time("$4"),
            super::time("$5"),
            super::time("$6"),
        )))
        .bind(&consumer)
        .bind(&b"\x01\x02"[..])
        .bind(error)
        .bind(now - due_ago - 1_000)
        .bind(now - due_ago)
        .bind(lease_in.map(|l| now + l))
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    drop(conn);
    let counts = <Db as idem::admin::DeadLetterAdmin>::recovery_counts(&db.pool)
        .await
        .unwrap();
    assert_eq!(counts.parked.len(), 1);
    assert_eq!(
        (counts.parked[0].parked, counts.parked[0].held),
        (3, 1),
        "{counts:?}"
    );
    assert_eq!(counts.parked[0].oldest_due_ms, Some(now - 3 * day));
    assert_eq!(counts.dead.len(), 1);
    assert_eq!(
        (counts.dead[0].scope.as_deref(), counts.dead[0].dead),
        (Some(scope.as_str()), 2)
    );

    let err = run(&db, &["purge", "--dead-letter-retention", "2 days"])
        .fails(2)
        .to_string();
    assert!(
        err.starts_with("error: --dead-letter-retention: `2 days` is not a duration"),
        "{err}"
    );
    let out = run(
        &db,
        &["purge", "--dead-letter-retention", "2d", "--batch", "1"],
    );
    assert_eq!(
        out.ok(),
        "purged 0 expired records\n\
         moved 1 parked retry to the dead letters (reason `abandoned`): was due over 2d ago and \
         not taken by any consumer\n\
         purged 3 dead letters past their retention of 2d\n"
    );
    let left: Vec<Vec<u8>> = sqlx::query_scalar(super::sql(
        "SELECT msg_key FROM idem_dead_letters WHERE scope = $1 ORDER BY msg_key",
    ))
    .bind(&scope)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let left: Vec<&str> = left
        .iter()
        .map(|k| std::str::from_utf8(k).unwrap())
        .collect();
    assert_eq!(left, ["dead-new", "discarded-new", "replayed-new"]);
    // The abandoned retry is a dead letter now, and the other two are still parked.
    let abandoned = parse(&run_dl(
        &db,
        &[
            "list",
            "--reason",
            "abandoned",
            "--consumer",
            &consumer,
            "--json",
        ],
    ));
    let abandoned = abandoned["dead_letters"].as_array().unwrap();
    assert_eq!(abandoned.len(), 1, "{abandoned:?}");
    assert_eq!(abandoned[0]["error"], "order 7 not found");
    assert_eq!(abandoned[0]["scope"], Value::Null);
    assert_eq!(abandoned[0]["attempts"], 2);
    assert_eq!(abandoned[0]["coordinates"], "stream sequence 4");
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT COUNT(*) FROM idem_parked WHERE consumer = $1",
            &[&consumer]
        )
        .await,
        2
    );
    // Nothing left past the retention: no lines about dead letters.
    assert_eq!(
        run(&db, &["purge", "--dead-letter-retention", "2d"]).ok(),
        "purged 0 expired records\n"
    );
    db.close().await;
}

pub(super) async fn dead_letters_json_help_lists_exactly_the_fields_that_json_prints() {
    let db = migrated!();
    let tag = super::common::unique_name("dl");
    let consumer = format!("{tag}-consumer");
    let scope = format!("{tag}::orders");
    let now = db_now(&db.pool).await;
    let mut conn = db.pool.acquire().await.unwrap();
    for (key, headers) in [
        ("k1", r#"[["trace-id","t-1"]]"#),
        ("k2", r#"[["trace-id","t-2"]]"#),
        ("k3", r#"[["not a header name","v"]]"#),
    ] {
        bury(
            &mut conn,
            &Dead {
                consumer: &consumer,
                scope: Some(&scope),
                key: Some(key.as_bytes()),
                reason: "poisoned",
                error: "order 3 not found",
                payload: b"{}",
                headers: Some(headers),
                destination: "orders-in",
                failed_ms: now,
            },
        )
        .await;
    }
    drop(conn);
    let ids: Vec<String> = sqlx::query_scalar::<_, i64>(super::sql(
        "SELECT id FROM idem_dead_letters WHERE scope = $1 ORDER BY id",
    ))
    .bind(&scope)
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .iter()
    .map(i64::to_string)
    .collect();
    let (k1, k2, k3) = (ids[0].as_str(), ids[1].as_str(), ids[2].as_str());

    // Each command, run so that every object its JSON can hold is there (not null), its
    // stdout read whatever its exit code (an id missing is a failure, after the report).
    let stdout = |args: &[&str]| -> Value {
        let out = run_dl(&db, args);
        serde_json::from_str(&out.stdout).unwrap_or_else(|err| panic!("{err}: {out:#?}"))
    };
    let replay = [
        stdout(&[
            "replay",
            "--id",
            k1,
            "--id",
            k3,
            "--id",
            "999999999",
            "--json",
        ]),
        stdout(&["replay", "--id", k1, "--json"]), // skipped
    ];
    assert_eq!(
        replay[0]["refused"][0]["id"].to_string(),
        k3,
        "{}",
        replay[0]
    );
    let runs: [(&str, Vec<Value>); 5] = [
        ("summary", vec![stdout(&["summary", "--json"])]),
        ("list", vec![stdout(&["list", "--state", "all", "--json"])]),
        ("show", vec![stdout(&["show", k1, "--json"])]),
        ("replay", replay.to_vec()),
        (
            "discard",
            vec![stdout(&[
                "discard",
                "--id",
                k2,
                "--id",
                k1,
                "--id",
                "999999999",
                "--json",
            ])],
        ),
    ];
    for (command, outputs) in runs {
        let mut printed = std::collections::BTreeSet::new();
        for output in &outputs {
            json_keys(output, &mut printed);
        }
        let listed = json_help_fields(&["dead-letters", command]);
        assert!(printed.len() >= 5, "{command}: {printed:?}");
        assert_eq!(
            listed, printed,
            "`idem dead-letters {command} --help` lists the fields its --json prints"
        );
        let short = idem(None, &["dead-letters", command, "-h"]);
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

/// A replay SIGKILLed halfway, then run again: every selected dead letter is re-driven exactly
/// once (one outbox message each, none twice, none missing), whatever the kill cut.
pub(super) async fn a_replay_killed_halfway_and_run_again_redrives_each_once() {
    const N: usize = 2_000;
    let db = migrated!();
    let tag = super::common::unique_name("killed");
    let consumer = format!("{tag}-consumer");
    let destination = format!("{tag}-orders");
    let now = db_now(&db.pool).await;
    let mut tx = db.pool.begin().await.unwrap();
    for n in 0..N {
        let key = format!("job-{n}");
        let error = format!("order {n} not found");
        let dead = Dead {
            consumer: &consumer,
            scope: Some("cli::killed"),
            key: Some(key.as_bytes()),
            reason: "poisoned",
            error: &error,
            payload: key.as_bytes(),
            headers: None,
            destination: &destination,
            failed_ms: now,
        };
        bury(&mut tx, &dead).await;
    }
    tx.commit().await.unwrap();
    let group = idem::recover::group_of(
        &consumer,
        Some("cli::killed"),
        "poisoned",
        "order # not found",
    );
    let replayed = async || in_state(&db.pool, &group, "replayed").await;

    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["dead-letters", "replay", "--group", &group])
        .env("DATABASE_URL", &db.url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the idem binary starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while replayed().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the replay never began"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    child.kill().expect("SIGKILL"); // `Child::kill` is SIGKILL on Unix: no goodbye
    let status = child.wait().unwrap();
    assert!(!status.success(), "killed, not finished: {status:?}");
    let at_kill = replayed().await;
    assert!(
        at_kill > 0 && at_kill < N as i64,
        "the kill came halfway: {at_kill} of {N} replayed"
    );

    let again = run_dl(&db, &["replay", "--group", &group]);
    assert_eq!(again.code, Some(0), "{again:#?}");
    assert_eq!(replayed().await, N as i64);
    assert_eq!(in_state(&db.pool, &group, "dead").await, 0);
    let outbox = "SELECT COUNT(*) FROM idem_outbox WHERE destination = $1";
    let distinct = "SELECT COUNT(DISTINCT id) FROM idem_outbox WHERE destination = $1";
    assert_eq!(scalar(&db.pool, outbox, &[&destination]).await, N as i64);
    assert_eq!(scalar(&db.pool, distinct, &[&destination]).await, N as i64);
    // Each dead letter names its own outbox message, which carries its payload.
    let joined = "SELECT COUNT(*) FROM idem_dead_letters d JOIN idem_outbox o \
                  ON o.id = d.replayed_as AND o.payload = d.payload WHERE d.error_group = $1";
    assert_eq!(scalar(&db.pool, joined, &[&group]).await, N as i64);
    sqlx::query(super::sql("DELETE FROM idem_outbox WHERE destination = $1"))
        .bind(&destination)
        .execute(&db.pool)
        .await
        .unwrap();
    db.close().await;
}

/// `replay --to-consumer`: the dead letter becomes a parked retry of its consumer, due now, in
/// the transaction that marks it replayed; no outbox message. Run again, nothing more.
pub(super) async fn a_replay_to_the_consumer_parks_each_dead_letter_once() {
    let db = migrated!();
    let tag = super::common::unique_name("tocons");
    let consumer = format!("{tag}-consumer");
    let destination = format!("{tag}-orders");
    let now = db_now(&db.pool).await;
    let dead = Dead {
        consumer: &consumer,
        scope: Some("cli::to_consumer"),
        key: Some(b"job-1"),
        reason: "poisoned",
        error: "order 1 not found",
        payload: b"{\"id\":\"job-1\"}",
        headers: Some("[[\"x-trace\",\"t-1\"]]"),
        destination: &destination,
        failed_ms: now,
    };
    let mut conn = db.pool.acquire().await.unwrap();
    bury(&mut conn, &dead).await;
    drop(conn);
    let id = scalar(
        &db.pool,
        "SELECT MAX(id) FROM idem_dead_letters WHERE consumer = $1",
        &[&consumer],
    )
    .await;
    let id_text = id.to_string();
    let run = run_dl(
        &db,
        &["replay", "--id", &id_text, "--to-consumer", "--json"],
    );
    assert_eq!(run.code, Some(0), "{run:#?}");
    let report = parse(&run);
    assert_eq!(
        report["replayed"][0]["consumer"],
        consumer.as_str(),
        "{report}"
    );
    assert!(report["replayed"][0]["outbox_id"].is_null(), "{report}");
    let parked = "SELECT COUNT(*) FROM idem_parked WHERE consumer = $1 AND attempts = 0 \
                  AND lease_token IS NULL AND payload = (SELECT payload FROM idem_dead_letters \
                  WHERE consumer = $2)";
    assert_eq!(scalar(&db.pool, parked, &[&consumer, &consumer]).await, 1);
    let outbox = "SELECT COUNT(*) FROM idem_outbox WHERE destination = $1";
    assert_eq!(scalar(&db.pool, outbox, &[&destination]).await, 0);
    let state = "SELECT COUNT(*) FROM idem_dead_letters WHERE consumer = $1 AND state = 'replayed'";
    assert_eq!(scalar(&db.pool, state, &[&consumer]).await, 1);
    // Due now: a consumer of that name takes it at once.
    let taken = <Db as idem::recover::RecoveryStore>::take_due(
        &db.pool,
        &consumer,
        10,
        std::time::Duration::from_secs(60),
        7,
    )
    .await
    .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].payload, b"{\"id\":\"job-1\"}");
    assert_eq!(taken[0].origin.destination, destination);
    assert_eq!(taken[0].last_error.as_deref(), Some("order 1 not found"));
    let again = run_dl(&db, &["replay", "--id", &id_text, "--to-consumer"]);
    assert_eq!(again.code, Some(0), "{again:#?}");
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT COUNT(*) FROM idem_parked WHERE consumer = $1",
            &[&consumer]
        )
        .await,
        1,
        "run again, nothing more"
    );
    sqlx::query(super::sql("DELETE FROM idem_parked WHERE consumer = $1"))
        .bind(&consumer)
        .execute(&db.pool)
        .await
        .unwrap();
    db.close().await;
}
