//! An idempotent create-payment endpoint on PostgreSQL, and clients that retry, race and change
//! payloads: `cargo run --example http_payments --features postgres,http`.
//!
//! The service (first, to copy): `POST /payments` behind an `IdempotencyLayer`; the handler's
//! insert commits with the `Idempotency-Key` and the stored 201. A client sends each of 50 keys
//! three times at once, retries some after the answer, reuses a key with another body (422) and
//! sends no key (400); a second client sends one of its keys (its own payment). The oracle checks
//! the answers (per client and key, one ran the handler, every other is its replay byte for byte
//! or a 409) and the database (exactly the payments answered). Exit 1 on a mismatch, 2 without
//! PostgreSQL (`IDEM_POSTGRES_URL`); it works in a schema of its own, dropped at the end.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{header::LOCATION, request::Parts, HeaderMap, StatusCode};
use axum::{response::IntoResponse, routing::post, Json, Router};
use futures_util::future::join_all;
use idem::http::{IdempotencyLayer, RequestTx};
use reqwest::Client;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, Postgres};
use sqlx::Connection as _;

// ---- The service ----

/// Who is asking: keys are scoped by it. A header stands in for authentication here; in a real
/// service, read the user that your auth middleware put in the request's extensions.
fn client(parts: &Parts) -> Option<String> {
    Some(parts.headers.get("x-client")?.to_str().ok()?.to_owned())
}

#[derive(Deserialize)]
struct NewPayment {
    amount: i64,
    currency: String,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, sqlx::FromRow)]
struct Payment {
    id: i64,
    client: String,
    amount: i64,
    currency: String,
}

/// `POST /payments`: the insert, the key and this 201 commit together, or none does.
async fn create_payment(
    headers: HeaderMap,
    mut tx: RequestTx<Postgres>,
    Json(new): Json<NewPayment>,
) -> Result<impl IntoResponse, StatusCode> {
    let client = headers["x-client"].to_str().unwrap_or_default(); // without it, 401
    let sql = "INSERT INTO payments (client, amount, currency) VALUES ($1, $2, $3) RETURNING *";
    let insert = sqlx::query_as::<_, Payment>(sql).bind(client);
    let insert = insert.bind(new.amount).bind(new.currency);
    let failed = |_| StatusCode::INTERNAL_SERVER_ERROR; // a 5xx rolls back, is not stored
    let payment = insert.fetch_one(&mut *tx).await.map_err(failed)?;
    let location = [(LOCATION, format!("/payments/{}", payment.id))];
    Ok((StatusCode::CREATED, location, Json(payment)))
}

fn app(pool: PgPool) -> Router {
    // A concurrent copy waits for the first request, then gets its response. A handler that
    // calls a payment provider adds `.lease(..)`: a copy gets 409 with Retry-After at once (the
    // clients below then retry, and the checks pass as well).
    let idempotent = IdempotencyLayer::new(pool, "payments::create", client);
    Router::new().route("/payments", post(create_payment).layer(idempotent))
}

// ---- The clients, and the oracle ----

const KEYS: usize = 50;

/// One answer as a client saw it.
#[derive(Debug, Clone)]
struct Seen {
    status: u16,
    replayed: bool,
    location: Option<String>,
    body: Bytes,
}

impl Seen {
    /// All but `Idempotent-Replayed`: what a replay repeats byte for byte.
    fn response(&self) -> (u16, Option<&str>, &[u8]) {
        (self.status, self.location.as_deref(), &self.body)
    }
}

/// `POST /payments` as `who`, with the key `order-<key>` if any, and again after a 409's
/// Retry-After, as a real client does. Every answer, in order.
async fn send(http: &Client, url: &str, who: &str, key: Option<usize>, amount: i64) -> Vec<Seen> {
    let mut seen = Vec::new();
    loop {
        let body = serde_json::json!({ "amount": amount, "currency": "EUR" });
        let mut request = http.post(url).header("x-client", who).json(&body);
        if let Some(key) = key {
            // The draft's key is a Structured Field string: in double quotes.
            request = request.header("idempotency-key", format!("\"order-{key}\""));
        }
        let response = request.send().await.expect("the server answers");
        let header = |name| Some(response.headers().get(name)?.to_str().ok()?.to_owned());
        let (status, after) = (response.status().as_u16(), header("retry-after"));
        seen.push(Seen {
            status,
            replayed: header("idempotent-replayed").as_deref() == Some("true"),
            location: header("location"),
            body: response.bytes().await.expect("a body"),
        });
        if status != 409 {
            return seen;
        }
        let after = after.and_then(|after| after.parse().ok()).unwrap_or(1);
        tokio::time::sleep(Duration::from_secs(after)).await;
    }
}

async fn run(url: &str, schema: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let options: PgConnectOptions = url.parse()?;
    let options = options.options([("search_path", schema)]);
    let pool = PgPool::connect_with(options).await?;
    idem::migrate(&pool).await?;
    let table = "CREATE TABLE payments (id BIGSERIAL PRIMARY KEY, client TEXT NOT NULL, \
                 amount BIGINT NOT NULL, currency TEXT NOT NULL)";
    sqlx::query(table).execute(&pool).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/payments", listener.local_addr()?);
    let app = app(pool.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Alice sends each key three times at once (a timeout, a double click), then every fifth
    // again; then a key with another body, and no key. Bob sends one of alice's keys.
    let http = Client::new();
    let alice = |i: usize| send(&http, &url, "alice", Some(i), 1000 + i as i64);
    let copies = |i| async move { join_all((0..3).map(|_| alice(i))).await.concat() };
    let mut seen = join_all((0..KEYS).map(copies)).await; // every answer, per key
    let again = join_all((0..KEYS).step_by(5).map(alice)).await;
    for (i, again) in (0..KEYS).step_by(5).zip(again) {
        seen[i].extend(again);
    }
    let other_body = send(&http, &url, "alice", Some(1), 999_999).await;
    let keyless = send(&http, &url, "alice", None, 888_888).await;
    let bob = send(&http, &url, "bob", Some(2), 1002).await;

    // Per client and key: one answer ran the handler (a 201, not replayed) for that client and
    // amount, and every other one but a 409 is its replay, byte for byte.
    let keys = seen.into_iter().enumerate();
    let keys = keys.map(|(i, seen)| ("alice", 1000 + i as i64, seen));
    let (mut wrong, mut answered, mut replays, mut busy) = (Vec::new(), Vec::new(), 0, 0);
    for (who, amount, seen) in keys.chain([("bob", 1002, bob)]) {
        let all = seen.len();
        let seen: Vec<Seen> = seen.into_iter().filter(|s| s.status != 409).collect();
        let one = &seen[0]; // every answer but the 409s is the same response (and there is one)
        let ran = seen.iter().filter(|s| !s.replayed).count();
        (replays, busy) = (replays + seen.len() - ran, busy + all - seen.len());
        let same = seen.iter().all(|s| s.response() == one.response());
        if ran != 1 || one.status != 201 || !same {
            wrong.push(format!("{who}, amount {amount}: {seen:?}"));
            continue;
        }
        let payment: Payment = serde_json::from_slice(&one.body)?;
        if (payment.client.as_str(), payment.amount) != (who, amount) {
            wrong.push(format!("{who}, amount {amount}: answered {payment:?}"));
        }
        answered.push(payment);
    }
    let last = |seen: &[Seen]| seen.last().map_or(0, |s| s.status);
    if (last(&other_body), last(&keyless)) != (422, 400) {
        wrong.push(format!("other body: {other_body:?}, no key: {keyless:?}"));
    }
    // The database: exactly the payments answered (none for the 422 and the 400).
    let select = sqlx::query_as("SELECT * FROM payments ORDER BY id");
    let stored: Vec<Payment> = select.fetch_all(&pool).await?;
    answered.sort_by_key(|p| p.id);
    if stored != answered {
        wrong.push(format!("database: {stored:?}, answers: {answered:?}"));
    }

    println!("{} payments, {replays} replays, {busy} 409s", stored.len());
    let (other_body, keyless) = (last(&other_body), last(&keyless));
    println!("the same key with another body: {other_body}, no key: {keyless}");
    pool.close().await;
    Ok(wrong)
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_POSTGRES_URL");
    let url = url.unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let mut admin = match PgConnection::connect(&url).await {
        Ok(admin) => admin,
        Err(err) => {
            let url = idem::consume::adapter::redact(&url);
            eprintln!("No PostgreSQL answered at {url} ({err}); set IDEM_POSTGRES_URL.");
            return Ok(ExitCode::from(2));
        }
    };
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let schema = format!("http_payments_{}_{nanos}", std::process::id()); // a safe SQL name
    let create = sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}"));
    sqlx::query(create).execute(&mut admin).await?;
    let outcome = run(&url, &schema).await;
    let drop = sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE"));
    sqlx::query(drop).execute(&mut admin).await?;
    let wrong = outcome?;
    for mismatch in &wrong {
        eprintln!("MISMATCH {mismatch}");
    }
    if !wrong.is_empty() {
        return Ok(ExitCode::FAILURE);
    }
    println!("OK: one payment per client and key; every answer the first response or its replay");
    Ok(ExitCode::SUCCESS)
}
