//! On a terminal (a pseudo-terminal from util-linux `script`): `forget` asks and obeys the
//! answer, and `purge` draws a bar instead of plain lines. Skipped where `script` is missing.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use idem::{idempotent, Outcome, Tx};
use sqlx::Sqlite;

#[idempotent(key = "id", scope = "tty::credit")]
async fn credit(tx: &mut Tx<'_, Sqlite>, id: &str) -> Result<(), sqlx::Error> {
    let _ = (tx, id);
    Ok(())
}

#[idempotent(key = "id", scope = "tty::short", retention = "1ms")]
async fn short(tx: &mut Tx<'_, Sqlite>, id: &str) -> Result<(), sqlx::Error> {
    let _ = (tx, id);
    Ok(())
}

/// Runs `idem args` on a pseudo-terminal with `input` typed; `None` without `script`.
fn on_terminal(url: &str, args: &str, input: &str) -> Option<(Option<i32>, String)> {
    let command = format!("{} {args}", env!("CARGO_BIN_EXE_idem"));
    let mut child = match Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("DATABASE_URL", url)
        .env_remove("CI")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(err) => {
            eprintln!("skipped: no `script` to make a terminal ({err})");
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Some((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

#[tokio::test]
async fn forget_asks_on_a_terminal_and_purge_draws_no_plain_lines() {
    let (url, path) = common::sqlite_url();
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    credit(&pool, "evt-1").await.unwrap();
    let count = || {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM idem_records WHERE scope = 'tty::credit'",
        )
        .fetch_one(&pool)
    };

    let Some((code, out)) = on_terminal(&url, "forget tty::credit evt-1", "n\n") else {
        return;
    };
    assert!(
        out.contains(
            "forget key `evt-1` in scope `tty::credit`? Its next delivery will apply again. [y/N]"
        ),
        "{out}"
    );
    assert!(
        out.contains("error: not confirmed; nothing forgotten"),
        "{out}"
    );
    assert_eq!(code, Some(1));
    assert_eq!(count().await.unwrap(), 1);

    let (code, out) = on_terminal(&url, "forget tty::credit evt-1", "y\n").unwrap();
    assert!(
        out.contains("forgot key `evt-1` in scope `tty::credit`"),
        "{out}"
    );
    assert_eq!(code, Some(0));
    assert_eq!(count().await.unwrap(), 0);
    assert_eq!(credit(&pool, "evt-1").await.unwrap(), Outcome::Applied(()));

    for id in ["s1", "s2", "s3"] {
        short(&pool, id).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (code, out) = on_terminal(&url, "purge --batch 1", "").unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("purged 3 expired records"), "{out}");
    assert!(
        !out.contains("purged 1 of 3"),
        "a bar, not plain lines: {out}"
    );

    pool.close().await;
    common::remove_sqlite(&path);
}
