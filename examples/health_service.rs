//! A consumer service with health endpoints, to copy: a NATS JetStream consumer on PostgreSQL
//! serving `/readyz` and `/livez` (200, or 503 with the reason as text) for Kubernetes' probes,
//! beside `/metrics` in Prometheus' text format. `cargo run --example health_service --features
//! postgres,nats,metrics -- --once`.
//!
//! It creates a stream of its own with a durable consumer, publishes 20 payments (5 of them
//! twice) and consumes them: applied 20, duplicate 5. The endpoints listen on `IDEM_HEALTH_ADDR`
//! (default `127.0.0.1:8080`). `--once` (CI) listens on a free port, asks its own endpoints
//! (ready while it runs, `/metrics` counting what it did, not ready once the run ended; exit 1
//! otherwise), stops after 3 s without a delivery and deletes its stream and rows; else ctrl-c
//! stops it.
//! `IDEM_POSTGRES_URL`, `IDEM_NATS_URL`: other than local servers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::{routing::get, Router};
use futures_util::StreamExt as _;
use idem::consume::{json, Consumer, Health};
use idem::nats::async_nats::jetstream::{self, consumer::pull};
use idem::nats::Source;
use idem::{idempotent, Batch, Tx};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::{PgPool, Postgres};

#[derive(serde::Deserialize)]
struct Payment {
    id: String,
    cents: i64,
}

#[idempotent(key = "msg.id", scope = "health_service::payment")]
async fn pay(tx: &mut Tx<'_, Postgres>, msg: &Payment) -> Result<(), sqlx::Error> {
    let sql = "INSERT INTO example_health_payments (id, cents) VALUES ($1, $2)";
    sqlx::query(sql)
        .bind(&msg.id)
        .bind(msg.cents)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// What the endpoints read: the consumer's health and the metrics recorder.
#[derive(Clone)]
struct Probes {
    health: Health,
    metrics: PrometheusHandle,
}

/// Kubernetes' readinessProbe: 200 while the consumer runs, reaches its broker and database
/// and takes work; else 503 and why.
async fn readyz(State(probes): State<Probes>) -> (StatusCode, String) {
    match probes.health.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// Kubernetes' livenessProbe: 200 unless a batch is stuck past the bound (or the run ended).
async fn livez(State(probes): State<Probes>) -> (StatusCode, String) {
    match probes.health.live() {
        Ok(()) => (StatusCode::OK, "live\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// Prometheus' scrape: every `idem_*` series, in its text format.
async fn metrics(State(probes): State<Probes>) -> String {
    probes.metrics.render()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let once = std::env::args().any(|a| a == "--once");
    let env = |name, default: &str| std::env::var(name).unwrap_or(default.to_string());
    // The recorder idem's `metrics` (feature `metrics`) go to; `/metrics` renders it.
    let recorder = PrometheusBuilder::new().install_recorder()?;
    idem::metrics::describe(); // the series' descriptions (`# HELP`)
    let upkeep = recorder.clone(); // drains the histograms' buckets now and then
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    let db = env("IDEM_POSTGRES_URL", "postgres://postgres@localhost/test");
    let pool = PgPool::connect(&db).await?;
    idem::migrate(&pool).await?;
    let table =
        "CREATE TABLE IF NOT EXISTS example_health_payments (id TEXT PRIMARY KEY, cents BIGINT)";
    sqlx::query(table).execute(&pool).await?;

    // A stream and a durable pull consumer of this run's own (the server may be shared).
    let url = env("IDEM_NATS_URL", "nats://localhost:4222");
    let js = jetstream::new(idem::nats::async_nats::connect(&url).await?);
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let stream_name = format!("IDEM_EXAMPLE_HEALTH_{}_{run_id}", std::process::id());
    let subject = stream_name.to_lowercase();
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await?;
    let config = pull::Config {
        durable_name: Some("payments".into()),
        ..Default::default()
    };
    stream.create_consumer(config).await?;
    for i in (0..20).chain(0..5) {
        let body = format!(r#"{{"id": "{stream_name}-{i}", "cents": {}}}"#, 100 * i);
        js.publish(subject.clone(), body.into()).await?.await?;
    }

    let source = Source::builder(&url, &stream_name, "payments")
        .prefetch(50)
        .connect()
        .await?;
    let consumer = Consumer::new(pool.clone())
        .batch(50)
        .health_of(&source) // the broker's probe: the NATS connection's state
        .health_every(Duration::from_secs(if once { 1 } else { 5 }))
        .stuck_after(Duration::from_secs(60));
    let probes = Probes {
        health: consumer.health(),
        metrics: recorder,
    };

    let app = Router::new()
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics))
        .with_state(probes.clone());
    let addr = if once {
        "127.0.0.1:0".to_string()
    } else {
        env("IDEM_HEALTH_ADDR", "127.0.0.1:8080")
    };
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let base = format!("http://{}", listener.local_addr()?);
    println!("serving {base}/readyz, {base}/livez and {base}/metrics");
    tokio::spawn(async move { axum::serve(listener, app).await });

    // `--once`: the stream ends after 3 s without a delivery; meanwhile, ask the endpoints.
    let idle = Duration::from_secs(if once { 3 } else { u64::MAX });
    let deliveries = futures_util::stream::unfold(source.deliveries(), move |mut d| async move {
        Some((tokio::time::timeout(idle, d.next()).await.ok()??, d))
    });
    let self_check = once.then(|| tokio::spawn(while_running(base.clone())));
    let shutdown = async { tokio::signal::ctrl_c().await.unwrap_or_default() };
    let handler = async |b: &mut Batch<Postgres>, m: &Payment| pay(b, m).await;
    let counts = consumer
        .run(deliveries, json::<Payment>, handler, shutdown)
        .await;
    source.close().await?;
    println!("{counts:?}");

    if let Some(self_check) = self_check {
        let mut failures = self_check.await?;
        let (status, body) = fetch(&format!("{base}/readyz")).await?;
        println!("after the run: /readyz {status} {body}");
        if status != 503 || !body.starts_with("stopped") {
            failures.push(format!("/readyz after the run: {status} {body}"));
        }
        if (counts.applied, counts.duplicate) != (20, 5) {
            failures.push(format!("expected applied 20, duplicate 5: {counts:?}"));
        }
        js.delete_stream(&stream_name).await?;
        let delete = "DELETE FROM example_health_payments WHERE id LIKE $1";
        let prefix = format!("{stream_name}-%");
        sqlx::query(delete).bind(prefix).execute(&pool).await?;
        if !failures.is_empty() {
            eprintln!("health_service: {}", failures.join("; "));
            std::process::exit(1);
        }
    }
    Ok(())
}

/// While the consumer runs: `/readyz` turns 200 (within 30 s), `/livez` is 200, and
/// `/metrics` has the consumer's series. Returns what went wrong.
async fn while_running(base: String) -> Vec<String> {
    let mut failures = Vec::new();
    let mut ready = None;
    for _ in 0..300 {
        match fetch(&format!("{base}/readyz")).await {
            Ok((200, body)) => {
                ready = Some(body);
                break;
            }
            Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    match ready {
        Some(body) => println!("while running: /readyz 200 {body}"),
        None => failures.push("/readyz never answered 200".into()),
    }
    match fetch(&format!("{base}/livez")).await {
        Ok((200, body)) => println!("while running: /livez 200 {body}"),
        other => failures.push(format!("/livez while running: {other:?}")),
    }
    // Wait for the first settled deliveries to show in the scrape.
    for _ in 0..100 {
        if let Ok((200, body)) = fetch(&format!("{base}/metrics")).await {
            if body.contains("idem_consumer_settled_total") {
                let series = body
                    .lines()
                    .filter(|l| l.starts_with("idem_consumer_settled_total"));
                for line in series {
                    println!("/metrics: {line}");
                }
                return failures;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    failures.push("/metrics has no idem_consumer_settled_total".into());
    failures
}

/// A GET: the status and the body.
async fn fetch(url: &str) -> Result<(u16, String), reqwest::Error> {
    let response = reqwest::get(url).await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?.trim_end().to_string()))
}
