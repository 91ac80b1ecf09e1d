//! The session on the book's operating page (`docs/src/operating.md`, section "The CLI") is real:
//! its `$ idem ...` commands run here, on a fresh SQLite database that real handlers populated,
//! and must print what the page shows (times masked, since they are the database's clock at the
//! run).

mod common;

use std::time::Duration;

use idem::{idempotent, Context, Tx};
use sqlx::Sqlite;

#[idempotent(key = "msg_id", scope = "billing::on_paid")]
async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg_id: &str, ctx: &Context) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO paid (msg) VALUES (?)")
        .bind(msg_id)
        .execute(&mut **tx)
        .await?;
    ctx.publish(tx, "receipts", &msg_id).await?;
    Ok(())
}

#[idempotent(
    key = "msg_id",
    version = "version",
    entity = "order_id",
    scope = "orders::status"
)]
async fn on_status(
    tx: &mut Tx<'_, Sqlite>,
    msg_id: &str,
    order_id: i64,
    version: i64,
) -> Result<(), sqlx::Error> {
    let _ = (tx, msg_id, order_id, version);
    Ok(())
}

#[idempotent(key = "user_id", scope = "emails::welcome", retention = "1ms")]
async fn welcome(tx: &mut Tx<'_, Sqlite>, user_id: i64) -> Result<(), sqlx::Error> {
    let _ = (tx, user_id);
    Ok(())
}

#[idempotent(
    key = "msg_id",
    scope = "payments::charge",
    mode = "lease",
    lease = "10m"
)]
async fn charge(tx: &mut Tx<'_, Sqlite>, msg_id: &str) -> Result<(), sqlx::Error> {
    let _ = (tx, msg_id);
    panic!("the worker died while charging");
}

#[idempotent(key = "msg_id", scope = "emails::receipt", max_attempts = 5)]
async fn send_receipt(tx: &mut Tx<'_, Sqlite>, msg_id: &str) -> Result<(), String> {
    let _ = (tx, msg_id);
    Err("smtp: connection refused".to_string())
}

/// The `console` block of the operating page's "The CLI" section.
fn session() -> String {
    session_of("The CLI")
}

/// The first `console` block of the operating page's section `title`.
fn session_of(title: &str) -> String {
    let page = include_str!("../../docs/src/operating.md");
    let section = page
        .split(&format!("\n## {title}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("docs/src/operating.md has a \"{title}\" section"));
    let block = section
        .split("```console\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the section has a console block");
    format!("{block}\n")
}

/// Runs each `$ idem ...` line of `expected` on `url`, and gives the session as it printed.
fn replay_session(url: &str, expected: &str) -> String {
    let mut actual = String::new();
    for line in expected.lines() {
        if !line.starts_with('$') {
            continue;
        }
        actual.push_str(line);
        actual.push('\n');
        let Some(args) = line.strip_prefix("$ idem ") else {
            continue; // `export DATABASE_URL=...`: the test sets it
        };
        let args: Vec<&str> = args.split_whitespace().collect();
        let run = common::idem(Some(url), &args);
        assert!(!run.stderr.contains("panicked"), "{run:#?}");
        actual.push_str(&run.stdout);
        actual.push_str(&run.stderr);
    }
    actual
}

/// Each timestamp `2026-12-03T07:14:58.123Z` as `<time>`, and the "(5s ago)"/"(in 29d 23h)"
/// after it as `(<ago>)`.
fn mask(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let stamp = bytes.get(i..i + 24).is_some_and(|w| {
            w.iter().enumerate().all(|(j, &b)| match j {
                4 | 7 => b == b'-',
                10 => b == b'T',
                13 | 16 => b == b':',
                19 => b == b'.',
                23 => b == b'Z',
                _ => b.is_ascii_digit(),
            })
        });
        if !stamp {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
            continue;
        }
        out.push_str("<time>");
        i += 24;
        if text[i..].starts_with(" (") {
            if let Some(end) = text[i..].find(')') {
                out.push_str(" (<ago>)");
                i += end + 1;
            }
        }
    }
    out
}

#[tokio::test]
async fn the_books_cli_session_is_what_the_binary_prints() {
    let (url, path) = common::sqlite_url();
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE paid (msg TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    for id in ["evt-1", "evt-2", "evt-3"] {
        on_paid(&pool, id).await.unwrap();
    }
    on_status(&pool, "st-1", 42, 1).await.unwrap();
    on_status(&pool, "st-2", 42, 2).await.unwrap();
    on_status(&pool, "st-3", 42, 3).await.unwrap();
    for user in [1001, 1002] {
        welcome(&pool, user).await.unwrap();
    }
    let crashed = {
        let pool = pool.clone();
        tokio::spawn(async move { charge(&pool, "pay-7").await })
    };
    assert!(crashed.await.unwrap_err().is_panic());
    for _ in 0..2 {
        assert!(send_receipt(&pool, "evt-3").await.is_err());
    }
    tokio::time::sleep(Duration::from_millis(20)).await;

    let expected = session();
    let actual = replay_session(&url, &expected);
    pool.close().await;
    common::remove_sqlite(&path);
    assert_eq!(
        mask(&actual),
        mask(&expected),
        "the session of docs/src/operating.md differs; this run printed:\n{actual}"
    );
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Paid {
    id: String,
    order_id: i64,
}

/// Orders from 1000 on are not in this database: those payments fail until someone fixes it.
#[idempotent(key = "msg.id", scope = "billing::on_paid", max_attempts = 2)]
async fn on_payment(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), String> {
    if msg.order_id >= 1000 {
        return Err(format!("order {} not found", msg.order_id));
    }
    sqlx::query("INSERT INTO paid (msg) VALUES (?)")
        .bind(&msg.id)
        .execute(&mut **tx)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::test]
async fn the_books_dead_letter_session_is_what_the_binary_prints() {
    use idem::consume::{memory::MemoryQueue, Consumer, DeadLetters, Recovery};

    let (url, path) = common::sqlite_url();
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE paid (msg TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    // A consumer whose two payments of unknown orders fail twice (max_attempts = 2), then are
    // poisoned, and which takes one message that is not JSON: three dead letters.
    let queue = MemoryQueue::named("payments");
    queue.publish(b"not json".to_vec());
    for (id, order) in [("evt-1", 42), ("evt-1017", 1017), ("evt-1018", 1018)] {
        let paid = Paid {
            id: id.into(),
            order_id: order,
        };
        queue.publish(serde_json::to_vec(&paid).unwrap());
    }
    let counts = Consumer::new(pool.clone())
        .retry_delay(Duration::from_millis(1), Duration::from_millis(1))
        .recovery(Recovery::new("billing").dead_letters(DeadLetters::Database))
        .run(
            queue.deliveries(),
            idem::consume::json::<Paid>,
            async |b, msg| on_payment(b, msg).await,
            queue.idle(),
        )
        .await;
    assert_eq!((counts.applied, counts.dead_letters_stored), (1, 3));

    let expected = session_of("Dead letters");
    let actual = replay_session(&url, &expected);
    let outbox: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    common::remove_sqlite(&path);
    assert_eq!(
        mask(&actual),
        mask(&expected),
        "the dead-letter session of docs/src/operating.md differs; this run printed:\n{actual}"
    );
    assert_eq!(
        outbox, 2,
        "the replayed group waits in the outbox for the relay"
    );
}

#[test]
fn masking_hides_times_only() {
    assert_eq!(
        mask("processed   2026-12-03T07:14:58.123Z (5s ago)\nx 2026-12-03T07:14:58.123Z\n"),
        "processed   <time> (<ago>)\nx <time>\n"
    );
    assert_eq!(mask("évt (1) 2026-12"), "évt (1) 2026-12");
}
