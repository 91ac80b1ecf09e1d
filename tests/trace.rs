//! One trace from a request, through the outbox and a broker, to the consumer of another
//! process (feature `otel`), on each of the four brokers.
//!
//! Service A and service B are separate processes (this binary run again, [`service`], the role
//! in `IDEM_TRACE_ROLE`), each exporting its spans through `tracing-opentelemetry` into the
//! SDK's in-memory exporter and writing them to a file for the test to read. A serves 8
//! concurrent requests, each a root span, whose handler publishes through the outbox; its relay
//! sends them. B consumes them with two consumers on one source, one handling each delivery
//! alone and one in batches. The test then checks, from both processes' spans and databases:
//!
//! - every outbox row carries the `traceparent` of its request's trace, and the relay's `send`
//!   span of each message is in that trace;
//! - every message B handled is in a `process` span whose parent is the message's context (a
//!   delivery alone) or which links it (a batch), in the trace of the request that caused it:
//!   0 missing, 0 wrong links (a batch links exactly the messages it handled);
//! - B applied every message once.
//!
//! 1,000 messages per broker (`IDEM_TRACE_MESSAGES` overrides it). Built without a broker's
//! variable (and without `CI`), its case is ignored, saying so (the crate's build script).
#![cfg(all(
    feature = "sqlite",
    feature = "otel",
    feature = "rabbitmq",
    feature = "nats",
    feature = "kafka",
    feature = "redis"
))]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use idem::consume::{json, Consumer, Source};
use idem::outbox::{Publisher, Relay};
use idem::{idempotent, Context, Tx};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool};
use tracing_subscriber::layer::SubscriberExt as _;

/// The child's role: `a` (requests, outbox, relay) or `b` (consumers).
const ROLE: &str = "IDEM_TRACE_ROLE";
const BROKER: &str = "IDEM_TRACE_BROKER";
/// The broker's names: input, destination and group, separated by tabs.
const NAMES: &str = "IDEM_TRACE_NAMES";
const DB: &str = "IDEM_TRACE_DB";
/// Where the child writes its spans, one JSON object a line.
const SPANS: &str = "IDEM_TRACE_SPANS";
const MESSAGES: &str = "IDEM_TRACE_MESSAGES";

/// The concurrent requests of service A, each a root span.
const REQUESTS: usize = 8;
/// B's batches: under the SDK's 128 links a span.
const BATCH: usize = 20;

fn messages() -> usize {
    std::env::var(MESSAGES)
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000)
}

/// What a request asks service A to do: publish event `n` of request `request`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Placed {
    id: String,
    request: i64,
    n: i64,
    destination: String,
}

/// What service A publishes and service B handles.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Event {
    id: String,
    request: i64,
    n: i64,
}

/// Service A's handler: one event through the outbox.
#[idempotent(key = "msg.id", scope = "trace::placed")]
async fn placed(
    tx: &mut Tx<'_, Sqlite>,
    msg: &Placed,
    ctx: &Context,
) -> Result<String, sqlx::Error> {
    let event = Event {
        id: msg.id.clone(),
        request: msg.request,
        n: msg.n,
    };
    ctx.publish(tx, &msg.destination, &event).await
}

/// Service B's handler: the event applied once.
#[idempotent(key = "msg.id", scope = "trace::handled")]
async fn handled(tx: &mut Tx<'_, Sqlite>, msg: &Event) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO handled (id, request, n) VALUES (?, ?, ?)")
        .bind(&msg.id)
        .bind(msg.request)
        .bind(msg.n)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A broker's names, as the children get them.
#[derive(Debug, Clone)]
struct Names {
    /// The queue, stream or topic B consumes.
    input: String,
    /// Where A publishes (the queue, a subject of the stream, the topic, the stream).
    destination: String,
    /// The consumer group (NATS: the durable consumer), where the broker has one.
    group: String,
}

impl Names {
    fn encode(&self) -> String {
        format!("{}\t{}\t{}", self.input, self.destination, self.group)
    }

    fn decode(line: &str) -> Self {
        let mut parts = line.split('\t').map(str::to_string);
        let mut next = || parts.next().expect("three names");
        Names {
            input: next(),
            destination: next(),
            group: next(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The children.

/// The child entry: plays the role in `IDEM_TRACE_ROLE`; nothing when run by hand.
#[test]
#[ignore = "a child process of the tests of this file"]
fn service() {
    let Ok(role) = std::env::var(ROLE) else {
        eprintln!("not a child: a service of the trace tests");
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let (broker, names, db, spans) = (
        var(BROKER),
        Names::decode(&var(NAMES)),
        PathBuf::from(var(DB)),
        PathBuf::from(var(SPANS)),
    );
    // ANCHOR: otel_setup
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("trace-test"));
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(layer);
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    // ANCHOR_END: otel_setup
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let pool = common::sqlite_file(&db).await;
        match role.as_str() {
            "a" => service_a(&broker, &names, &pool).await,
            "b" => service_b(&broker, &names, &pool).await,
            other => panic!("unknown role {other}"),
        }
        pool.close().await;
    });
    provider.force_flush().expect("flushed");
    let lines: Vec<String> = exporter
        .get_finished_spans()
        .expect("the finished spans")
        .iter()
        .map(|span| serde_json::to_string(&Exported::of(span)).unwrap())
        .collect();
    std::fs::write(&spans, lines.join("\n")).expect("the spans written");
}

/// Service A: 8 concurrent requests, each a root span, publish through the outbox; the relay
/// sends what they committed until nothing is left.
async fn service_a(broker: &str, names: &Names, pool: &SqlitePool) {
    let total = messages();
    let requests: Vec<_> = (0..REQUESTS)
        .map(|r| {
            let pool = pool.clone();
            let destination = names.destination.clone();
            let request = tracing::info_span!(parent: None, "request", request = r as i64);
            tokio::spawn(tracing::Instrument::instrument(
                async move {
                    for n in (r..total).step_by(REQUESTS) {
                        let msg = Placed {
                            id: format!("r{r}-n{n}"),
                            request: r as i64,
                            n: n as i64,
                            destination: destination.clone(),
                        };
                        placed(&pool, &msg).await.expect("published");
                    }
                },
                request,
            ))
        })
        .collect();
    let all_sent = {
        let pool = pool.clone();
        async move {
            for request in requests {
                request.await.expect("a request");
            }
            loop {
                let pending: i64 =
                    sqlx::query_scalar("SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                if pending == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let stats = match broker {
        "rabbitmq" => {
            let publisher = idem::rabbitmq::OutboxPublisher::builder(rabbitmq_url());
            relay(pool, publisher.connect().await.unwrap(), all_sent).await
        }
        "nats" => {
            let publisher = idem::nats::OutboxPublisher::builder(nats_url());
            relay(pool, publisher.connect().await.unwrap(), all_sent).await
        }
        "kafka" => {
            // One record per produced batch: tansu 0.6.0 mishandles batches of several.
            let publisher = idem::kafka::OutboxPublisher::builder(&kafka_brokers())
                .producer_config("batch.num.messages", "1")
                .producer_config("linger.ms", "0");
            relay(pool, publisher.connect().await.unwrap(), all_sent).await
        }
        "redis" => {
            let publisher = idem::redis::OutboxPublisher::builder(redis_url());
            relay(pool, publisher.connect().await.unwrap(), all_sent).await
        }
        other => panic!("unknown broker {other}"),
    };
    assert_eq!(stats.published, total as u64, "{stats:?}");
}

async fn relay<P: Publisher>(
    pool: &SqlitePool,
    publisher: P,
    until: impl Future<Output = ()>,
) -> idem::outbox::RelayStats {
    Relay::new(pool.clone(), publisher)
        .idle(Duration::from_millis(2), Duration::from_millis(50))
        .run(until)
        .await
}

/// Service B: two consumers on one source, one taking each delivery alone and one in batches,
/// until every message was applied.
async fn service_b(broker: &str, names: &Names, pool: &SqlitePool) {
    match broker {
        "rabbitmq" => {
            let source = idem::rabbitmq::Source::builder(rabbitmq_url(), names.input.as_str());
            consume(source.connect().await.unwrap(), pool).await;
        }
        "nats" => {
            let source =
                idem::nats::Source::builder(nats_url(), names.input.as_str(), &names.group);
            consume(source.connect().await.unwrap(), pool).await;
        }
        "kafka" => {
            let source = idem::kafka::Source::builder(&kafka_brokers(), &names.input, &names.group)
                .consumer_config("session.timeout.ms", "6000")
                .consumer_config("heartbeat.interval.ms", "500")
                .producer_config("batch.num.messages", "1")
                .commit_interval(Duration::from_millis(200));
            consume(source.connect().await.unwrap(), pool).await;
        }
        "redis" => {
            let source =
                idem::redis::Source::builder(redis_url(), names.input.as_str(), &names.group, "b1")
                    .block(Duration::from_millis(50));
            consume(source.connect().await.unwrap(), pool).await;
        }
        other => panic!("unknown broker {other}"),
    }
}

async fn consume<S: Source>(source: S, pool: &SqlitePool) {
    let total = messages() as i64;
    let all_applied = || {
        let pool = pool.clone();
        async move {
            loop {
                let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM handled")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                if applied >= total {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let alone = Consumer::new(pool.clone()).batch(1).run(
        source.deliveries(),
        json::<Event>,
        async |b, msg| handled(b, msg).await,
        all_applied(),
    );
    let batched = Consumer::new(pool.clone()).batch(BATCH).run(
        source.deliveries(),
        json::<Event>,
        async |b, msg| handled(b, msg).await,
        all_applied(),
    );
    let (alone, batched) = tokio::join!(alone, batched);
    assert_eq!(
        (
            alone.failed + batched.failed,
            alone.dead_lettered + batched.dead_lettered
        ),
        (0, 0),
        "{alone:?} {batched:?}"
    );
    source.close().await.expect("close leaves the broker");
}

/// A finished span as the children write it and the test reads it.
#[derive(Debug, Serialize, Deserialize)]
struct Exported {
    name: String,
    kind: String,
    trace: String,
    span: String,
    parent: String,
    remote_parent: bool,
    attributes: BTreeMap<String, String>,
    links: Vec<ExportedLink>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ExportedLink {
    trace: String,
    span: String,
    attributes: BTreeMap<String, String>,
}

impl Exported {
    fn of(span: &opentelemetry_sdk::trace::SpanData) -> Self {
        let attributes = |kvs: &[opentelemetry::KeyValue]| {
            kvs.iter()
                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                .collect()
        };
        Exported {
            name: span.name.to_string(),
            kind: format!("{:?}", span.span_kind),
            trace: span.span_context.trace_id().to_string(),
            span: span.span_context.span_id().to_string(),
            parent: span.parent_span_id.to_string(),
            remote_parent: span.parent_span_is_remote,
            attributes: attributes(&span.attributes),
            links: span
                .links
                .links
                .iter()
                .map(|link| ExportedLink {
                    trace: link.span_context.trace_id().to_string(),
                    span: link.span_context.span_id().to_string(),
                    attributes: attributes(&link.attributes),
                })
                .collect(),
        }
    }

    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

// ---------------------------------------------------------------------------------------------
// The test.

fn rabbitmq_url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn kafka_brokers() -> String {
    std::env::var("IDEM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into())
}

fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs one service as a child process until it exits (at most `limit`), then reads its spans.
fn run_service(role: &str, broker: &str, names: &Names, db: &Path) -> Vec<Exported> {
    let spans = std::env::temp_dir().join(format!("{}.jsonl", common::unique_name("idem_trace")));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "service",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(BROKER, broker)
        .env(NAMES, names.encode())
        .env(DB, db)
        .env(SPANS, &spans)
        .env(MESSAGES, messages().to_string())
        .spawn()
        .expect("the service starts");
    let limit = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("service {role} on {broker} did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "service {role} on {broker}: {status}");
    let text = std::fs::read_to_string(&spans).expect("the service's spans");
    let _ = std::fs::remove_file(&spans);
    text.lines()
        .map(|line| serde_json::from_str(line).expect("a span"))
        .collect()
}

/// An outbox row of service A: id, payload, headers, when it was sent.
type OutboxRow = (String, Vec<u8>, Option<String>, Option<i64>);

/// The trace id and the span id in a `traceparent` (`00-<trace>-<span>-<flags>`).
fn traceparent(value: &str) -> (String, String) {
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "a traceparent: {value}");
    (parts[1].to_string(), parts[2].to_string())
}

/// Runs A, then B, on `names` of `broker`, and checks their spans and databases.
fn through(broker: &str, names: &Names) {
    let total = messages();
    let (db_a, db_b) = (
        common::temp_db("idem_trace_a"),
        common::temp_db("idem_trace_b"),
    );
    runtime().block_on(async {
        common::sqlite_file(&db_a).await.close().await;
        let b = common::sqlite_file(&db_b).await;
        sqlx::query("CREATE TABLE handled (id TEXT NOT NULL, request INTEGER, n INTEGER)")
            .execute(&b)
            .await
            .unwrap();
        b.close().await;
    });
    let spans_a = run_service("a", broker, names, &db_a);
    let spans_b = run_service("b", broker, names, &db_b);

    // A: one trace per request.
    let mut trace_of: HashMap<i64, String> = HashMap::new();
    for span in spans_a.iter().filter(|s| s.name == "request") {
        let r: i64 = span.attribute("request").unwrap().parse().unwrap();
        assert_eq!(span.parent, "0000000000000000", "a request is a root span");
        assert!(trace_of.insert(r, span.trace.clone()).is_none());
    }
    assert_eq!(trace_of.len(), REQUESTS);
    let distinct: BTreeSet<&String> = trace_of.values().collect();
    assert_eq!(distinct.len(), REQUESTS, "one trace per request");

    // A's outbox: every row sent, with its request's traceparent, captured in its handler.
    let (rows, handled): (Vec<OutboxRow>, Vec<(String, i64, i64)>) = runtime().block_on(async {
        let a = common::sqlite_file(&db_a).await;
        let rows = sqlx::query_as("SELECT id, payload, headers, sent_at FROM idem_outbox")
            .fetch_all(&a)
            .await
            .unwrap();
        let b = common::sqlite_file(&db_b).await;
        let handled = sqlx::query_as("SELECT id, request, n FROM handled")
            .fetch_all(&b)
            .await
            .unwrap();
        (rows, handled)
    });
    assert_eq!(rows.len(), total);
    // The event id (the key B handles it under) → its message id and its request's trace.
    let mut message_of: HashMap<String, (String, String)> = HashMap::new();
    let mut event_of: HashMap<String, String> = HashMap::new();
    let handler_spans: HashMap<&str, &Exported> = spans_a
        .iter()
        .filter(|s| s.name == "idempotent")
        .map(|s| (s.span.as_str(), s))
        .collect();
    for (id, payload, headers, sent_at) in &rows {
        assert!(sent_at.is_some(), "{id} was sent");
        let event: Event = serde_json::from_slice(payload).unwrap();
        let trace = trace_of[&event.request].clone();
        let headers: Vec<(String, String)> =
            serde_json::from_str(headers.as_deref().expect("headers")).unwrap();
        let parent = headers
            .iter()
            .find(|(name, _)| name == "traceparent")
            .map(|(_, value)| traceparent(value))
            .expect("a traceparent");
        assert_eq!(
            parent.0, trace,
            "{id}: the trace of request {}",
            event.request
        );
        let handler = handler_spans
            .get(parent.1.as_str())
            .expect("the handler's span");
        assert_eq!(handler.attribute("key"), Some(event.id.as_str()));
        message_of.insert(event.id.clone(), (id.clone(), trace));
        event_of.insert(id.clone(), event.id.clone());
    }
    assert_eq!(message_of.len(), total);

    // A's relay: each message sent in a `send` span of its request's trace.
    let mut sent = BTreeSet::new();
    for span in spans_a.iter().filter(|s| s.name.starts_with("send ")) {
        assert_eq!(span.name, format!("send {}", names.destination));
        assert_eq!(span.kind, "Producer");
        assert_eq!(span.attribute("messaging.system"), Some(broker));
        assert_eq!(span.attribute("messaging.operation.type"), Some("send"));
        let id = span
            .attribute("messaging.message.id")
            .expect("a message id");
        let (_, trace) = &message_of[&event_of[id]];
        assert_eq!(&span.trace, trace, "the send span of {id}");
        assert!(span.remote_parent);
        sent.insert(id.to_string());
    }
    assert_eq!(sent.len(), total, "a send span for every message");

    // B's database: every message applied once.
    assert_eq!(handled.len(), total, "applied once each");
    let once: BTreeSet<&String> = handled.iter().map(|(id, _, _)| id).collect();
    assert_eq!(once.len(), total);
    for (id, request, _) in &handled {
        assert!(
            message_of.contains_key(id),
            "{id} was published for request {request}"
        );
    }

    // B's spans: each handled message in a span of its request's trace, as parent or link.
    let process: HashMap<&str, &Exported> = spans_b
        .iter()
        .filter(|s| s.name.starts_with("process "))
        .map(|s| (s.span.as_str(), s))
        .collect();
    let mut children: HashMap<&str, BTreeSet<String>> = HashMap::new();
    let (mut applied, mut missing, mut alone, mut batched) = (BTreeSet::new(), Vec::new(), 0, 0);
    for span in spans_b.iter().filter(|s| s.name == "idempotent") {
        let key = span.attribute("key").expect("a key").to_string();
        let Some(group) = process.get(span.parent.as_str()) else {
            missing.push(format!("{key}: not in a process span"));
            continue;
        };
        assert_eq!(span.trace, group.trace, "a child is in its parent's trace");
        let (message, trace) = &message_of[&key];
        children
            .entry(group.span.as_str())
            .or_default()
            .insert(message.clone());
        if span.attribute("outcome") == Some("applied") {
            assert!(applied.insert(key.clone()), "{key} applied twice");
        }
        let ok = if group.links.is_empty() {
            alone += 1;
            &group.trace == trace
                && group.remote_parent
                && group.attribute("messaging.message.id") == Some(message.as_str())
        } else {
            batched += 1;
            group.links.iter().any(|link| {
                &link.trace == trace && link.attributes.get("messaging.message.id") == Some(message)
            })
        };
        if !ok {
            missing.push(format!(
                "{key}: not in or linked from the trace of its request"
            ));
        }
    }
    assert_eq!(missing, Vec::<String>::new(), "0 missing");
    assert_eq!(applied.len(), total, "an applied span for every message");
    assert!(
        alone > 0 && batched > 0,
        "both kinds ran: {alone} alone, {batched} batched"
    );

    // Every B span: attributes, and a batch links exactly the messages it handled.
    let mut wrong = Vec::new();
    for group in process.values() {
        assert_eq!(group.name, format!("process {}", names.input));
        assert_eq!(group.kind, "Consumer");
        assert_eq!(group.attribute("messaging.system"), Some(broker));
        assert_eq!(
            group.attribute("messaging.destination.name"),
            Some(names.input.as_str())
        );
        assert_eq!(group.attribute("messaging.operation.type"), Some("process"));
        let expected_group = (!names.group.is_empty()).then_some(names.group.as_str());
        assert_eq!(
            group.attribute("messaging.consumer.group.name"),
            expected_group
        );
        assert!(group.attribute("idem.outcome").is_some(), "{group:?}");
        if group.links.is_empty() {
            continue;
        }
        assert_eq!(
            group.attribute("messaging.batch.message_count"),
            Some(group.links.len().to_string().as_str())
        );
        let linked: BTreeSet<String> = group
            .links
            .iter()
            .filter_map(|link| {
                let id = link.attributes.get("messaging.message.id")?;
                let right = event_of
                    .get(id)
                    .is_some_and(|event| message_of[event].1 == link.trace);
                if !right {
                    wrong.push(format!("{id} linked from the trace {}", link.trace));
                }
                Some(id.clone())
            })
            .collect();
        if linked.len() != group.links.len() {
            wrong.push(format!("a link without a message id in {}", group.span));
        }
        let handled_here = children
            .get(group.span.as_str())
            .cloned()
            .unwrap_or_default();
        if linked != handled_here {
            wrong.push(format!(
                "{} links {linked:?}, handled {handled_here:?}",
                group.span
            ));
        }
    }
    assert_eq!(wrong, Vec::<String>::new(), "0 wrong links");
}

/// Says why a case does not run; a failure when `CI` is set, since CI must run them all.
fn skip(what: &str, why: impl std::fmt::Display) {
    if std::env::var_os("CI").is_some() {
        panic!("CI must run the trace tests, but {what}: {why}");
    }
    eprintln!("skipped: {what}: {why}");
}

#[test]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
fn rabbitmq() {
    use idem::rabbitmq::lapin::options::{
        ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use idem::rabbitmq::lapin::types::FieldTable;
    use idem::rabbitmq::lapin::{Connection, ConnectionProperties, ExchangeKind};

    let queue = common::unique_name("idem_trace");
    let dead = format!("{queue}.dead");
    let rt = runtime();
    let Some((connection, channel)) = rt.block_on(async {
        let connection =
            match Connection::connect(&rabbitmq_url(), ConnectionProperties::default()).await {
                Ok(connection) => connection,
                Err(err) => {
                    skip("no RabbitMQ at IDEM_RABBITMQ_URL", err);
                    return None;
                }
            };
        let channel = connection.create_channel().await.unwrap();
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        // The consumer's default dead-letter exchange must exist.
        channel
            .exchange_declare(
                dead.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        Some((connection, channel))
    }) else {
        return;
    };
    let names = Names {
        input: queue.clone(),
        destination: queue.clone(),
        group: String::new(),
    };
    let result = std::panic::catch_unwind(|| through("rabbitmq", &names));
    rt.block_on(async {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        channel
            .exchange_delete(dead.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .unwrap();
        let _ = connection.close(200, "OK".into()).await;
    });
    // Cleaned up either way; then the failure, if any.
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
fn nats() {
    use idem::nats::async_nats::{self, jetstream};

    let stream = common::unique_name("IDEM_TRACE").to_uppercase();
    let subject = format!("{}.events", stream.to_lowercase().replace('_', "-"));
    let dead_stream = format!("{stream}_DLQ");
    let rt = runtime();
    let Some(js) = rt.block_on(async {
        let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(2));
        let client = match options.connect(nats_url()).await {
            Ok(client) => client,
            Err(err) => {
                skip("no NATS server at IDEM_NATS_URL", err);
                return None;
            }
        };
        let js = jetstream::new(client);
        // The stream, and one that keeps the default dead-letter subject.
        let dead_subject = format!("idem.dead-letter.{stream}.workers");
        for (name, subject) in [(&stream, &subject), (&dead_stream, &dead_subject)] {
            let config = jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                ..Default::default()
            };
            js.create_stream(config).await.unwrap();
        }
        js.create_consumer_on_stream(
            jetstream::consumer::pull::Config {
                durable_name: Some("workers".into()),
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            },
            stream.as_str(),
        )
        .await
        .unwrap();
        Some(js)
    }) else {
        return;
    };
    let names = Names {
        input: stream.clone(),
        destination: subject,
        group: "workers".into(),
    };
    let result = std::panic::catch_unwind(|| through("nats", &names));
    rt.block_on(async {
        let _ = js.delete_stream(&stream).await;
        let _ = js.delete_stream(&dead_stream).await;
    });
    // Cleaned up either way; then the failure, if any.
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
fn kafka() {
    use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use idem::kafka::rdkafka::client::DefaultClientContext;
    use idem::kafka::rdkafka::config::ClientConfig;

    if std::env::var("IDEM_KAFKA_BROKERS").is_err() {
        return skip("IDEM_KAFKA_BROKERS is not set", "start a broker (tansu)");
    }
    let topic = common::unique_name("idem_trace");
    let dead = format!("{topic}.dead");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    let rt = runtime();
    rt.block_on(async {
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let topics = [
            NewTopic::new(&topic, 1, TopicReplication::Fixed(1)),
            NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
        ];
        for result in admin.create_topics(&topics, &options).await.unwrap() {
            result.unwrap();
        }
    });
    let names = Names {
        input: topic.clone(),
        destination: topic.clone(),
        group: format!("{topic}_group"),
    };
    let result = std::panic::catch_unwind(|| through("kafka", &names));
    rt.block_on(async {
        let _ = admin
            .delete_topics(&[&topic, &dead], &AdminOptions::new())
            .await;
    });
    // Cleaned up either way; then the failure, if any.
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
fn redis() {
    use idem::redis::redis::AsyncCommands as _;

    let stream = common::unique_name("idem_trace");
    let rt = runtime();
    let client = idem::redis::redis::Client::open(redis_url()).unwrap();
    let Some(mut conn) = rt.block_on(async {
        match client.get_multiplexed_async_connection().await {
            Ok(conn) => Some(conn),
            Err(err) => {
                skip("no Redis at IDEM_REDIS_URL", err);
                None
            }
        }
    }) else {
        return;
    };
    let names = Names {
        input: stream.clone(),
        destination: stream.clone(),
        group: "billing".into(),
    };
    let result = std::panic::catch_unwind(|| through("redis", &names));
    rt.block_on(async {
        let dead = format!("{stream}:dead");
        let _: i64 = conn.del(&[&stream, &dead]).await.unwrap();
    });
    // Cleaned up either way; then the failure, if any.
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
