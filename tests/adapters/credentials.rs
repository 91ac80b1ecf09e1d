//! Credentials never shown: every adapter's source and outbox publisher, given a password (or a
//! NATS token, or Kafka's `sasl.password`), fails to connect — to a closed port, and to the real
//! server with a wrong password where the server checks one — and neither its error (`Display`,
//! `Debug`, every `source()` below it), nor its builder's `Debug`, nor any `tracing` event or
//! span field written meanwhile (at TRACE, the dependencies' own included) holds the secret.
//! Where an error shows the URL, it shows it redacted.

use std::error::Error as StdError;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// The password every case hides.
const SECRET: &str = "s3cret-Pa55w0rd";

/// What the `tracing` events of one case wrote.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Written {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Written {
    type Writer = Written;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Runs `case` on a runtime of its own, on this thread, with every `tracing` event at TRACE
/// (spans' fields included) written to a buffer; returns what the case returned and the text.
fn logged<T>(case: impl Future<Output = T>) -> (T, String) {
    let written = Written::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
        .with_ansi(false)
        .with_writer(written.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(case)
    });
    let text = String::from_utf8_lossy(&written.0.lock().unwrap()).into_owned();
    (out, text)
}

/// Every text an error gives: `Display`, `Debug`, and each cause's `Display`.
fn texts(err: &(dyn StdError + 'static)) -> String {
    let mut all = format!("{err}\n{err:?}\n");
    let mut cause = err.source();
    while let Some(err) = cause {
        all.push_str(&format!("{err}\n"));
        cause = err.source();
    }
    all
}

/// Connects with `connect` (bounded to `limit`), which must fail, and checks the error, the
/// builder's `Debug` and the log for the secret; the error must show `shown` (the redacted
/// URL, or what stands for it) where one is given. Returns the error's text.
fn hidden<B: Debug, T, E: StdError + 'static>(
    what: &str,
    builder: B,
    connect: impl AsyncFnOnce(B) -> Result<T, E>,
    limit: Duration,
    shown: Option<&str>,
) -> String {
    let debug = format!("{builder:?}");
    assert!(
        !debug.contains(SECRET),
        "{what}: the builder's Debug shows the secret: {debug}"
    );
    let (result, log) = logged(async move {
        tokio::time::timeout(limit, connect(builder))
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
    });
    let Err(err) = result else {
        panic!("{what}: connected");
    };
    let text = texts(&err);
    assert!(
        !text.contains(SECRET),
        "{what}: the error shows the secret:\n{text}"
    );
    assert!(
        !log.contains(SECRET),
        "{what}: the log shows the secret:\n{log}"
    );
    if let Some(shown) = shown {
        assert!(
            text.contains(shown),
            "{what}: the error should name `{shown}`:\n{text}"
        );
    }
    eprintln!("{what}: {err}");
    text
}

/// [`hidden`] for a builder whose `connect` must fail, within [`LIMIT`].
macro_rules! refused {
    ($what:expr, $builder:expr, $shown:expr) => {
        hidden($what, $builder, async |b| b.connect().await, LIMIT, $shown)
    };
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const LIMIT: Duration = Duration::from_secs(20);

#[test]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
fn rabbitmq_never_shows_a_password() {
    use idem::rabbitmq::{OutboxPublisher, Source};
    let closed = format!("amqp://guest:{SECRET}@127.0.0.1:{}/%2f", closed_port());
    let shown = Some("guest:***@127.0.0.1");
    let source = Source::builder(closed.clone(), "idem_credentials");
    refused!("rabbitmq source, closed port", source, shown);
    let publisher = OutboxPublisher::builder(closed);
    refused!("rabbitmq publisher, closed port", publisher, shown);

    // The shared server refuses guest with a wrong password.
    let server = std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string());
    let wrong = server.replacen("guest:guest@", &format!("guest:{SECRET}@"), 1);
    assert!(
        wrong.contains(SECRET),
        "IDEM_RABBITMQ_URL has guest:guest@: {server}"
    );
    let source = Source::builder(wrong.clone(), "idem_credentials");
    let text = refused!("rabbitmq source, wrong password", source, shown);
    assert!(
        text.contains("ACCESS_REFUSED") || text.contains("auth"),
        "{text}"
    );
    let publisher = OutboxPublisher::builder(wrong);
    refused!("rabbitmq publisher, wrong password", publisher, shown);
}

#[test]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
fn nats_never_shows_a_password_or_token() {
    use idem::nats::{OutboxPublisher, Source};
    let port = closed_port();
    for (url, shown) in [
        (
            format!("nats://idem:{SECRET}@127.0.0.1:{port}"),
            "idem:***@127.0.0.1",
        ),
        (
            format!("nats://{SECRET}@127.0.0.1:{port}"),
            "nats://***@127.0.0.1",
        ),
        (
            format!("nats://127.0.0.1:{port},nats://idem:{SECRET}@127.0.0.1:{port}"),
            "idem:***@127.0.0.1",
        ),
    ] {
        let source = Source::builder(url.clone(), "idem_credentials", "idem_credentials");
        refused!("nats source", source, Some(shown));
        let publisher = OutboxPublisher::builder(url);
        refused!("nats publisher", publisher, Some(shown));
    }
}

#[test]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
fn redis_never_shows_a_password() {
    use idem::redis::{OutboxPublisher, Source};
    // (The shared server takes any password, so a refused one is checked on a private server
    // that requires one, in idem-redis' tests.)
    let closed = format!("redis://default:{SECRET}@127.0.0.1:{}", closed_port());
    let shown = Some("default:***@");
    let source = Source::builder(closed.clone(), "idem_credentials", "g", "c");
    refused!("redis source", source, shown);
    let publisher = OutboxPublisher::builder(closed);
    refused!("redis publisher", publisher, shown);
}

#[test]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
fn kafka_never_shows_a_sasl_password() {
    use idem::kafka::{OutboxPublisher, Source};
    let brokers = format!("127.0.0.1:{}", closed_port());
    let sasl = [
        ("security.protocol", "sasl_plaintext"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.username", "idem"),
        ("sasl.password", SECRET),
    ];
    let mut source = Source::builder(&brokers, "idem_credentials", "idem_credentials");
    let mut publisher = OutboxPublisher::builder(&brokers);
    for (key, value) in sasl {
        source = source
            .consumer_config(key, value)
            .producer_config(key, value);
        publisher = publisher.producer_config(key, value);
    }
    refused!("kafka source", source, None);
    refused!("kafka publisher", publisher, None);
}
