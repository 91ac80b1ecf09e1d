//! A server process SIGKILLed at the worst moments, on PostgreSQL: after its transaction
//! committed and before the response left (the retry to a restarted server gets the stored
//! response, and nothing runs twice), and in lease mode while its handler ran (the lease
//! expires, then the retry runs).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};

use crate::support::{app, payments, records, Client, Payment, Steer, TestDb};

const CHILD_SCHEMA: &str = "IDEM_HTTP_CHILD_SCHEMA";
const PAY: &str = r#"{"amount":4200}"#;

/// The child: the payments app on `IDEM_HTTP_CHILD_SCHEMA`, on a port it prints; a request with
/// `x-die` kills the process once the idempotency layer has returned (its commit done) and
/// before the response is written.
#[tokio::test]
#[ignore = "the server process of the crash cases; they start it"]
async fn server_child() {
    let Ok(schema) = std::env::var(CHILD_SCHEMA) else {
        return;
    };
    let pool = pool_in(&schema).await;
    let die = |request: Request, next: Next| async move {
        let dies = request.headers().contains_key("x-die");
        let response = next.run(request).await;
        if dies {
            // SAFETY: kill(2) on this process; SIGKILL ends it at once.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        response
    };
    let router = app(pool, Arc::new(Steer::default())).layer(middleware::from_fn(die));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // On stderr: the test harness holds back what a test prints on stdout.
    eprintln!("listening on {}", listener.local_addr().unwrap());
    axum::serve(listener, router).await.unwrap();
}

async fn pool_in(schema: &str) -> PgPool {
    let options: PgConnectOptions = idem_testkit::backends::Postgres::url().parse().unwrap();
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options.options([("search_path", schema)]))
        .await
        .unwrap()
}

/// A child server process, killed on drop if still running.
struct ChildServer {
    child: Child,
    url: String,
}

impl ChildServer {
    fn start(schema: &str) -> ChildServer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "crash::server_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_SCHEMA, schema)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = lines
            .by_ref()
            .map(Result::unwrap)
            .find_map(|line| {
                line.strip_prefix("listening on ")
                    .map(|addr| format!("http://{addr}"))
            })
            .expect("the child server printed its address");
        // The rest of what it says goes on to this test's output.
        std::thread::spawn(move || {
            lines
                .map_while(Result::ok)
                .for_each(|line| eprintln!("child: {line}"))
        });
        ChildServer { child, url }
    }

    /// Waits for the process to end (it killed itself): its exit status.
    fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A schema of this case's own, migrated, with the payments table; dropped by `cleanup`.
async fn schema() -> Option<(PgPool, String)> {
    let pool = <Postgres as TestDb>::setup().await?;
    let schema: String = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    Some((pool, schema))
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn a_server_killed_after_its_commit_and_before_its_response_replays_it_after_a_restart() {
    let Some((pool, schema)) = schema().await else {
        return;
    };
    let http = reqwest::Client::new();
    let doomed = ChildServer::start(&schema);
    let lost = http
        .post(format!("{}/payments", doomed.url))
        .header("x-client", "alice")
        .header("x-die", "1")
        .header("idempotency-key", "\"crash-1\"")
        .header("content-type", "application/json")
        .body(PAY)
        .send()
        .await;
    assert!(lost.is_err(), "the response never left: {lost:?}");
    let status = doomed.wait();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    // The commit happened before the kill: the effect and the response are stored.
    assert_eq!(payments(&pool).await, 1);
    assert_eq!(records(&pool, "test::payments").await, 1);

    let restarted = ChildServer::start(&schema);
    let alice = Client::new(&restarted.url, "alice");
    let retry = alice.post("/payments", Some("\"crash-1\""), PAY).await;
    assert_eq!(
        (retry.status, retry.replayed),
        (201, true),
        "{}",
        retry.text()
    );
    let payment: Payment = serde_json::from_slice(&retry.body).unwrap();
    let stored: String = sqlx::query_scalar("SELECT id FROM payments")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        payment.id, stored,
        "the replay is the response of the committed run"
    );
    assert_eq!(payments(&pool).await, 1, "no second effect");
    drop(restarted);
    <Postgres as TestDb>::teardown(pool).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn in_lease_mode_a_server_killed_mid_request_leaves_a_lease_that_expires_then_the_retry_runs()
{
    let Some((pool, schema)) = schema().await else {
        return;
    };
    let http = reqwest::Client::new();
    let doomed = ChildServer::start(&schema);
    let hung = tokio::spawn({
        let (http, url) = (http.clone(), doomed.url.clone());
        async move {
            http.post(format!("{url}/payments-leased"))
                .header("x-client", "alice")
                .header("x-hang", "1")
                .header("idempotency-key", "\"crash-2\"")
                .header("content-type", "application/json")
                .body(PAY)
                .send()
                .await
        }
    });
    // The lease is committed before the handler runs: wait for its record.
    for _ in 0..500 {
        if records(&pool, "test::payments-leased").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        records(&pool, "test::payments-leased").await,
        1,
        "the lease was taken"
    );
    drop(doomed);
    assert!(hung.await.unwrap().is_err());
    assert_eq!(
        payments(&pool).await,
        0,
        "the killed run's write rolled back"
    );

    let restarted = ChildServer::start(&schema);
    let alice = Client::new(&restarted.url, "alice");
    let busy = alice
        .post("/payments-leased", Some("\"crash-2\""), PAY)
        .await;
    assert_eq!(
        busy.status,
        409,
        "the dead request's lease holds until it expires: {}",
        busy.text()
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let retry = alice
        .post("/payments-leased", Some("\"crash-2\""), PAY)
        .await;
    assert_eq!(
        (retry.status, retry.replayed),
        (201, false),
        "{}",
        retry.text()
    );
    assert_eq!(payments(&pool).await, 1);
    let again = alice
        .post("/payments-leased", Some("\"crash-2\""), PAY)
        .await;
    assert_eq!((again.replayed, &again.body), (true, &retry.body));
    drop(restarted);
    <Postgres as TestDb>::teardown(pool).await;
}
