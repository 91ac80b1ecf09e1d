//! A lease holder process paused with SIGSTOP inside its handler past its lease, then SIGCONT,
//! cannot commit over the new holder (PostgreSQL). The holder is this test binary again
//! (`paused::holder_child`); the kit's rule `pause__…` checks the same in process on every
//! database.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use idem::{idempotent, Error, Outcome, Tx};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres};

use crate::support::{child, killed_by};

/// Set in the holder process: the schema of its database.
const CHILD_SCHEMA: &str = "IDEM_PAUSED_SCHEMA";
/// What the holder prints once it is inside its handler's body, holding the lease.
const INSIDE: &str = "holder inside its body";

/// Ships order `msg.0` as holder `msg.1`; when `pause` is set, prints [`INSIDE`] and waits that
/// long first (the parent stops it meanwhile).
#[idempotent(key = "msg.0", scope = "paused::ship", mode = "lease", lease = "1s")]
async fn ship(
    tx: &mut Tx<'_, Postgres>,
    msg: &(String, String),
    pause: Option<Duration>,
) -> Result<(), sqlx::Error> {
    if let Some(pause) = pause {
        println!("{INSIDE}");
        tokio::time::sleep(pause).await;
    }
    sqlx::query("INSERT INTO shipments (message, holder) VALUES ($1, $2)")
        .bind(&msg.0)
        .bind(&msg.1)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The holder process: does nothing in a normal test run. Its commit must be refused.
#[test]
fn holder_child() {
    let Ok(schema) = std::env::var(CHILD_SCHEMA) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let options: sqlx::postgres::PgConnectOptions =
            crate::common::postgres_url().parse().unwrap();
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(options.options([("search_path", schema.as_str())]))
            .await
            .unwrap();
        let msg = ("ship-1".to_string(), "paused".to_string());
        let resumed = ship(&pool, &msg, Some(Duration::from_millis(500))).await;
        assert!(
            matches!(resumed, Err(Error::LeaseLost)),
            "the resumed holder's commit is refused: {resumed:?}"
        );
    });
}

/// The record's lease token, and whether its lease is held.
async fn lease(pool: &PgPool) -> (i64, bool) {
    sqlx::query_as(
        "SELECT lease_token, lease_until IS NOT NULL FROM idem_records \
         WHERE scope = 'paused::ship' AND msg_key = $1",
    )
    .bind(b"ship-1".as_slice())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The holder process, SIGKILLed when dropped (a failed test leaves no stopped process).
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a child of ours has no memory-safety preconditions.
    let sent = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

/// The holder takes the lease (1 s) and is SIGSTOPped inside its body; past the lease a second
/// holder (this process) takes the message over and commits; then the first is SIGCONTed: its
/// commit is refused with `LeaseLost` (the child asserts it and exits cleanly). One shipment,
/// the new holder's; the record done under the new holder's token.
#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn a_lease_holder_paused_with_sigstop_past_its_lease_cannot_commit_over_the_new_holder() {
    crate::common::with_postgres(async |pool| {
        sqlx::query("CREATE TABLE shipments (message TEXT NOT NULL, holder TEXT NOT NULL)")
            .execute(pool)
            .await
            .unwrap();
        let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
            .fetch_one(pool)
            .await
            .unwrap();
        let mut holder = Holder(
            child("paused::holder_child")
                .env(CHILD_SCHEMA, &schema)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stdout = holder.0.stdout.take().unwrap();
        let (inside_tx, inside) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains(INSIDE) {
                    let _ = inside_tx.send(());
                }
            }
        });
        inside
            .recv_timeout(Duration::from_secs(30))
            .expect("the holder reaches its body");
        signal(holder.0.id(), libc::SIGSTOP);
        let (paused_token, held) = lease(pool).await;
        assert!(held, "the paused holder holds the lease");
        tokio::time::sleep(Duration::from_millis(1_200)).await; // past the 1 s lease
        let msg = ("ship-1".to_string(), "second".to_string());
        assert_eq!(
            ship(pool, &msg, None).await.unwrap(),
            Outcome::Applied(()),
            "the expired lease is taken over"
        );
        let (token, held) = lease(pool).await;
        assert!(!held, "the second holder completed the record");
        assert_ne!(token, paused_token, "the takeover replaced the token");
        signal(holder.0.id(), libc::SIGCONT);
        let status = holder.0.wait().unwrap();
        assert!(
            status.success(),
            "the resumed holder was refused (else it failed): {status:?}, signal {:?}",
            killed_by(status)
        );
        let shipments: Vec<(String, String)> =
            sqlx::query_as("SELECT message, holder FROM shipments")
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(
            shipments,
            [("ship-1".to_string(), "second".to_string())],
            "one shipment, the new holder's"
        );
        assert_eq!(lease(pool).await, (token, false), "the new holder's record");
        assert_eq!(ship(pool, &msg, None).await.unwrap(), Outcome::Duplicate);
    })
    .await;
}
