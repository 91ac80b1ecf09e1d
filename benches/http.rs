//! Requests per second of an idempotent HTTP endpoint (`idem::http::IdempotencyLayer`) beside
//! the same endpoint without idem, on PostgreSQL, through a real axum server and a real HTTP
//! client on local ports.
//!
//! ```text
//! cargo bench --bench http --features postgres,http
//! ```
//!
//! The endpoint inserts one payment and answers 201 with it as JSON. The modes:
//! - `plain`: the endpoint on a transaction of its own (`pool.begin()`, insert, commit), no key;
//! - `hand-written key`: the same endpoint with the pattern a careful user writes by hand in
//!   the same transaction: insert the key (`ON CONFLICT DO NOTHING`), replay the stored
//!   response if it was there, else insert the payment and store the response with an `UPDATE`
//!   (no fingerprint, no client scope, no expiry);
//! - `new key`: behind the layer, each request with a new `Idempotency-Key` (the claim, the
//!   insert and the stored response in one transaction);
//! - `replay`: behind the layer, keys already answered (the stored response; the handler does
//!   not run);
//! - `lease, new key`: the layer in lease mode (the lease commits first, then the insert and the
//!   response).
//!
//! The modes run in one process, interleaved round by round in an order shuffled each round
//! (`BENCH_ORDER`); each round's rate is divided by `plain`'s of the same round, and the median
//! ratio over rounds is reported, so a shared machine's drift cancels out. Environment:
//! `IDEM_POSTGRES_URL`, `BENCH_ROUNDS` (20), `BENCH_REQUESTS` (requests per mode and round,
//! 400), `BENCH_CONCURRENCY` (requests in flight, 8).
//!
//! No timing is asserted anywhere; this binary only measures and prints.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use futures_util::stream::{self, StreamExt};
use idem::http::{IdempotencyLayer, RequestTx};
use sqlx::{PgPool, Postgres};

#[allow(dead_code)] // shared by every bench; this one uses the backends, order and stats
mod support;

use support::backends::PostgresDb;
use support::order::Rounds;
use support::stats::{median, spread, spread3};
use support::{env_usize, run};

#[derive(serde::Serialize, serde::Deserialize)]
struct Create {
    amount: i64,
}

#[derive(serde::Serialize)]
struct Payment {
    id: i64,
    amount: i64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

async fn insert(conn: &mut sqlx::PgConnection, amount: i64) -> Result<Payment, sqlx::Error> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) as i64;
    sqlx::query("INSERT INTO bench_payments (id, amount) VALUES ($1, $2)")
        .bind(id)
        .bind(amount)
        .execute(conn)
        .await?;
    Ok(Payment { id, amount })
}

/// The endpoint without idem: its own transaction.
async fn plain(
    State(pool): State<PgPool>,
    Json(create): Json<Create>,
) -> Result<(StatusCode, Json<Payment>), StatusCode> {
    let failed = |_| StatusCode::INTERNAL_SERVER_ERROR;
    let mut tx = pool.begin().await.map_err(failed)?;
    let payment = insert(&mut tx, create.amount).await.map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    Ok((StatusCode::CREATED, Json(payment)))
}

/// The same endpoint with its key handled by hand, in its own transaction: two statements more
/// than `plain` for a new key, as idem's claim and stored response.
async fn hand(
    State(pool): State<PgPool>,
    headers: axum::http::HeaderMap,
    Json(create): Json<Create>,
) -> Result<(StatusCode, Vec<u8>), StatusCode> {
    let failed = |_| StatusCode::INTERNAL_SERVER_ERROR;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .ok_or(StatusCode::BAD_REQUEST)?
        .to_owned();
    let mut tx = pool.begin().await.map_err(failed)?;
    let claimed = sqlx::query("INSERT INTO bench_keys (key) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(&key)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    if claimed.rows_affected() == 0 {
        let stored: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT response FROM bench_keys WHERE key = $1")
                .bind(&key)
                .fetch_one(&mut *tx)
                .await
                .map_err(failed)?;
        return Ok((StatusCode::CREATED, stored.ok_or(StatusCode::CONFLICT)?));
    }
    let payment = insert(&mut tx, create.amount).await.map_err(failed)?;
    let body = serde_json::to_vec(&payment).map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    sqlx::query("UPDATE bench_keys SET response = $2 WHERE key = $1")
        .bind(&key)
        .bind(&body)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    tx.commit().await.map_err(failed)?;
    Ok((StatusCode::CREATED, body))
}

/// The same endpoint behind the layer: the layer's transaction.
async fn keyed(
    mut tx: RequestTx<Postgres>,
    Json(create): Json<Create>,
) -> Result<(StatusCode, Json<Payment>), StatusCode> {
    let payment = insert(&mut tx, create.amount)
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok((StatusCode::CREATED, Json(payment)))
}

fn app(pool: PgPool) -> Router {
    let client = |_: &axum::http::request::Parts| Some("bench".to_owned());
    let layer = IdempotencyLayer::new(pool.clone(), "bench::payments", client);
    let leased =
        IdempotencyLayer::new(pool.clone(), "bench::leased", client).lease(Duration::from_secs(30));
    Router::new()
        .route("/plain", post(plain))
        .route("/hand", post(hand))
        .route("/keyed", post(keyed).layer(layer))
        .route("/leased", post(keyed).layer(leased))
        .with_state(pool)
}

const MODES: [&str; 6] = [
    "plain",
    "hand-written key",
    "new key",
    "replay",
    "lease, new key",
    "hand-written replay",
];

/// Sends `keys.len()` requests to `path`, `concurrency` at a time (no key when `keys` are
/// `None`); every answer must be 201. Returns requests per second.
async fn send(
    http: &reqwest::Client,
    url: &str,
    keys: Vec<Option<String>>,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let n = keys.len();
    let started = Instant::now();
    let statuses: Vec<u16> = stream::iter(keys)
        .map(|key| {
            let mut request = http
                .post(url)
                .header("content-type", "application/json")
                .body(r#"{"amount":1250}"#);
            if let Some(key) = key {
                request = request.header("idempotency-key", format!("\"{key}\""));
            }
            async move { request.send().await.map(|r| r.status().as_u16()) }
        })
        .buffer_unordered(concurrency)
        .map(|status| status.unwrap_or(0))
        .collect()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    ensure!(
        statuses.iter().all(|s| *s == 201),
        "{url}: not every answer was 201: {:?}",
        statuses
            .iter()
            .filter(|s| **s != 201)
            .take(5)
            .collect::<Vec<_>>()
    );
    Ok(n as f64 / elapsed)
}

async fn bench() -> anyhow::Result<()> {
    let rounds = env_usize("BENCH_ROUNDS", 20);
    let requests = env_usize("BENCH_REQUESTS", 400);
    let concurrency = env_usize("BENCH_CONCURRENCY", 8);
    let db = PostgresDb::open(concurrency as u32 + 2).await?;
    sqlx::query("CREATE TABLE bench_payments (id BIGINT PRIMARY KEY, amount BIGINT NOT NULL)")
        .execute(&db.pool)
        .await?;
    sqlx::query("CREATE TABLE bench_keys (key TEXT PRIMARY KEY, response BYTEA)")
        .execute(&db.pool)
        .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let router = app(db.pool.clone());
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let http = reqwest::Client::new();

    // The replayed keys, answered once before the rounds (this also warms every connection).
    let stored: Vec<Option<String>> = (0..requests).map(|i| Some(format!("stored-{i}"))).collect();
    send(&http, &format!("{base}/keyed"), stored.clone(), concurrency).await?;
    send(&http, &format!("{base}/hand"), stored.clone(), concurrency).await?;
    let mut fresh = 0usize;
    let mut new_keys = |prefix: &str| -> Vec<Option<String>> {
        let keys = (fresh..fresh + requests)
            .map(|i| Some(format!("{prefix}-{i}")))
            .collect();
        fresh += requests;
        keys
    };

    let mut order = Rounds::from_env();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        let mut this_round = [0.0; MODES.len()];
        for mode in order.next(round, MODES.len()) {
            this_round[mode] = match mode {
                0 => {
                    send(
                        &http,
                        &format!("{base}/plain"),
                        vec![None; requests],
                        concurrency,
                    )
                    .await?
                }
                1 => {
                    send(
                        &http,
                        &format!("{base}/hand"),
                        new_keys("hand"),
                        concurrency,
                    )
                    .await?
                }
                2 => {
                    send(
                        &http,
                        &format!("{base}/keyed"),
                        new_keys("new"),
                        concurrency,
                    )
                    .await?
                }
                3 => send(&http, &format!("{base}/keyed"), stored.clone(), concurrency).await?,
                4 => {
                    send(
                        &http,
                        &format!("{base}/leased"),
                        new_keys("lease"),
                        concurrency,
                    )
                    .await?
                }
                _ => send(&http, &format!("{base}/hand"), stored.clone(), concurrency).await?,
            };
        }
        for (mode, rate) in this_round.iter().enumerate() {
            rates[mode].push(*rate);
        }
    }
    let ratios = |mode: usize| -> Vec<f64> {
        rates[mode]
            .iter()
            .zip(&rates[0])
            .map(|(r, p)| r / p)
            .collect()
    };
    println!(
        "\n{rounds} rounds in {} order, {requests} requests per mode and round, {concurrency} in flight, PostgreSQL\n",
        order.order().describe()
    );
    println!("| mode | requests/s (median) | spread | ratio to `plain` (median) | spread |");
    println!("|---|---:|---|---:|---|");
    for (mode, name) in MODES.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {} | {:.3} | {} |",
            median(&rates[mode]),
            spread(&rates[mode]),
            median(&ratios(mode)),
            spread3(&ratios(mode)),
        );
    }
    // idem beside the hand-written pattern, round by round.
    let versus = |a: usize, b: usize| -> Vec<f64> {
        rates[a].iter().zip(&rates[b]).map(|(x, y)| x / y).collect()
    };
    for (a, b) in [(2, 1), (3, 5)] {
        let ratio = versus(a, b);
        println!(
            "\n`{}` / `{}`: {:.3} (spread {})",
            MODES[a],
            MODES[b],
            median(&ratio),
            spread3(&ratio)
        );
    }
    server.abort();
    db.close().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    run(bench)
}
