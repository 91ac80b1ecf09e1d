//! idem's broker conformance kit on the local NATS server (`IDEM_NATS_URL`, default
//! `nats://127.0.0.1:4222`), JetStream, on SQLite and PostgreSQL (`IDEM_POSTGRES_URL`):
//! [`Nats`] is one rule's stream, its durable pull consumer and a stream keeping the default
//! dead-letter subject; `broker_suite!` runs every rule on it. What is NATS's own (the server's
//! `max_deliver`, dead letters on core NATS, a dead-letter subject the stream captures, what
//! `connect` checks, delayed naks, `Progress` heartbeats, confirmed acks) is in [`specific`].
//! Built without `IDEM_NATS_URL` (and without `CI`), the tests are ignored, saying so (the crate's
//! build script); a server that does not answer fails the test in CI and skips it, saying why,
//! elsewhere.

#[path = "conformance/auth.rs"]
mod auth;
#[path = "conformance/cluster.rs"]
mod cluster;
#[path = "conformance/health.rs"]
mod health;
#[path = "conformance/specific.rs"]
mod specific;
#[path = "conformance/tls.rs"]
mod tls;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::nats::async_nats::{self, jetstream, HeaderMap};
use idem::nats::{headers, OutboxPublisher, Source};
use idem_testkit::broker::harness::{skip, unique_name};
use idem_testkit::broker::{Arrived, Broker, DeadLetter, Raw, Settings, Spec};

idem_testkit::broker_suite!(Nats; absent(
    idem_no_nats = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
));

/// The server the tests use: `IDEM_NATS_URL`, default the local server.
pub fn url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

/// The durable pull consumer of every input.
pub const CONSUMER: &str = "workers";

/// One rule's stream (subjects `<prefix>.>`, messages published on `<prefix>.in`), its durable
/// pull consumer `workers`, and the stream `<stream>_DLQ` that keeps the default dead-letter
/// subject (`idem.dead-letter.<stream>.workers`).
pub struct Nats {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub stream: String,
    /// The stream's subjects are `<prefix>.>`.
    pub prefix: String,
}

impl Nats {
    /// A client of the server; `None` (said why) when none answers.
    async fn connect() -> Option<async_nats::Client> {
        let url = url();
        let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(2));
        match tokio::time::timeout(Duration::from_secs(3), options.connect(&url)).await {
            Ok(Ok(client)) => Some(client),
            Ok(Err(err)) => skip(&format!("no NATS server at {url}"), err),
            Err(_) => skip(&format!("no NATS server at {url}"), "no answer within 3 s"),
        }
    }

    fn new(client: async_nats::Client, stream: &str) -> Nats {
        Nats {
            js: jetstream::new(client.clone()),
            client,
            stream: stream.to_string(),
            prefix: stream.to_lowercase().replace('_', "-"),
        }
    }

    /// A fresh input whose consumer has `ack_wait` `spec.redelivery` and `max_deliver`
    /// (`-1`: none).
    pub async fn create_with(spec: Spec, max_deliver: i64) -> Option<Nats> {
        let client = Nats::connect().await?;
        let stream = unique_name(&format!("idem_kit_{}", spec.rule)).to_uppercase();
        let nats = Nats::new(client, &stream);
        delete_stale_streams(&nats.js).await;
        create_stream(
            &nats.js,
            jetstream::stream::Config {
                name: nats.stream.clone(),
                subjects: vec![format!("{}.>", nats.prefix)],
                ..Default::default()
            },
        )
        .await;
        create_stream(
            &nats.js,
            jetstream::stream::Config {
                name: nats.dead_letter_stream(),
                subjects: vec![Source::default_dead_letter_subject(&nats.stream, CONSUMER)],
                ..Default::default()
            },
        )
        .await;
        nats.js
            .create_consumer_on_stream(
                jetstream::consumer::pull::Config {
                    durable_name: Some(CONSUMER.to_string()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: spec.redelivery,
                    max_deliver,
                    max_ack_pending: 10_000,
                    ..Default::default()
                },
                nats.stream.as_str(),
            )
            .await
            .unwrap();
        Some(nats)
    }

    /// The stream of the default dead-letter subject.
    pub fn dead_letter_stream(&self) -> String {
        format!("{}_DLQ", self.stream)
    }

    /// The source of the input, with the default dead-letter subject.
    pub fn builder(&self) -> idem::nats::SourceBuilder {
        Source::builder(url(), &self.stream, CONSUMER)
    }

    /// Publishes `payload` on `<prefix>.<subject>` and waits for the stream's ack.
    pub async fn publish_on(&self, subject: &str, payload: Vec<u8>) {
        self.js
            .publish(format!("{}.{subject}", self.prefix), payload.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    /// The consumer's `(num_pending, num_ack_pending, num_redelivered)`.
    pub async fn state(&self) -> (u64, usize, usize) {
        let mut consumer: jetstream::consumer::PullConsumer = self
            .js
            .get_consumer_from_stream(CONSUMER, &self.stream)
            .await
            .unwrap();
        let info = consumer.info().await.unwrap();
        (info.num_pending, info.num_ack_pending, info.num_redelivered)
    }

    /// Completes once the consumer has nothing pending and nothing unacked.
    pub async fn settled(&self) {
        while self.unsettled().await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The messages of `stream`, in order: subject, headers, payload.
    pub async fn messages(&self, stream: &str) -> Vec<(String, HeaderMap, Vec<u8>)> {
        let mut stream = self.js.get_stream(stream).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut all = Vec::new();
        for seq in 1..=last {
            if let Ok(message) = stream.get_raw_message(seq).await {
                all.push((
                    message.subject.to_string(),
                    message.headers,
                    message.payload.to_vec(),
                ));
            }
        }
        all
    }
}

/// A header's value as text.
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|v| v.as_str())
}

/// Every header as text (the last value of each).
fn fields(headers: &HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter_map(|(name, values)| {
            let value = values.last()?;
            Some((name.to_string(), value.as_str().to_string()))
        })
        .collect()
}

/// Creates a stream, trying again while the server answers "error creating store for stream"
/// (10049). nats-server 2.9 (Debian's) removes the account's store folder when its last stream is
/// deleted; a stream created by a parallel test at that moment fails to make its folder (the
/// server logs "mkdir …/jetstream/$G/streams: no such file or directory"). A later attempt
/// makes the folder again.
async fn create_stream(js: &jetstream::Context, config: jetstream::stream::Config) {
    let mut attempt = 1;
    loop {
        match js.create_stream(config.clone()).await {
            Ok(_) => return,
            Err(err) if attempt < 5 && store_not_created(&err) => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("creating stream {}: {err}", config.name),
        }
    }
}

/// Whether a stream's creation failed on the server's store ("error creating store for
/// stream", JetStream error code 10049).
fn store_not_created(err: &jetstream::context::CreateStreamError) -> bool {
    matches!(
        err.kind(),
        jetstream::context::CreateStreamErrorKind::JetStream(js)
            if js.error_code() == jetstream::ErrorCode::STREAM_CREATE
    )
}

/// Deletes test streams that runs which stopped early (a failed assertion, a killed process)
/// left behind, once per process: those older than an hour, by the time in their name.
async fn delete_stale_streams(js: &jetstream::Context) {
    use futures_util::TryStreamExt as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let Ok(names) = js.stream_names().try_collect::<Vec<String>>().await else {
        return;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    for name in names {
        // IDEM_KIT_<RULE>_<pid>_<nanos>_<n>, and its _DLQ.
        let Some(rest) = name.strip_prefix("IDEM_KIT_") else {
            continue;
        };
        let nanos = rest.split('_').nth(2).and_then(|n| n.parse::<u128>().ok());
        if nanos.is_some_and(|t| now.saturating_sub(t) > 3_600 * 1_000_000_000) {
            let _ = js.delete_stream(&name).await;
        }
    }
}

impl Broker for Nats {
    type Source = Source;
    type Publisher = OutboxPublisher;

    const NAME: &'static str = "NATS JetStream";
    const COUNTS_DELIVERIES: bool = true;
    const SETTLES_EACH: bool = true;
    /// The stream's duplicate window drops a message whose `Nats-Msg-Id` it stored.
    const DROPS_REPUBLISHED: bool = true;

    async fn create(spec: Spec) -> Option<Nats> {
        Nats::create_with(spec, -1).await
    }

    fn names(&self) -> String {
        self.stream.clone()
    }

    async fn attach(names: &str) -> Nats {
        let client = async_nats::connect(url()).await.expect("the NATS server");
        Nats::new(client, names)
    }

    async fn publish(&self, messages: &[Raw]) {
        // The id as idem's header only: a `Nats-Msg-Id` would make the stream drop the copies
        // the rules publish on purpose.
        for chunk in messages.chunks(256) {
            let mut acks = Vec::with_capacity(chunk.len());
            for message in chunk {
                let mut headers = HeaderMap::new();
                headers.insert(headers::MESSAGE_ID, message.id.as_str());
                let ack = self
                    .js
                    .publish_with_headers(
                        format!("{}.in", self.prefix),
                        headers,
                        message.payload.clone().into(),
                    )
                    .await
                    .unwrap();
                acks.push(ack);
            }
            for ack in acks {
                ack.await.unwrap();
            }
        }
    }

    async fn source(&self, settings: Settings) -> Source {
        self.builder()
            .prefetch(settings.prefetch)
            .expires(Duration::from_secs(1))
            .connect()
            .await
            .unwrap()
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        self.messages(&self.dead_letter_stream())
            .await
            .into_iter()
            .map(|(_, headers, payload)| DeadLetter {
                id: header(&headers, headers::MESSAGE_ID).map(str::to_string),
                payload,
                fields: fields(&headers),
            })
            .collect()
    }

    async fn unsettled(&self) -> u64 {
        let (pending, ack_pending, _) = self.state().await;
        pending + ack_pending as u64
    }

    async fn publisher(&self) -> OutboxPublisher {
        OutboxPublisher::builder(url()).connect().await.unwrap()
    }

    fn input(&self) -> String {
        self.stream.clone()
    }

    fn destination(&self) -> String {
        format!("{}.payments", self.prefix)
    }

    async fn refusing_destination(&self) -> (String, String) {
        // No stream captures it: no responders.
        let subject = unique_name("idem-no-stream").replace('_', "-");
        (subject.clone(), subject)
    }

    async fn arrived(&self, expected: usize) -> Vec<Arrived> {
        let _ = expected; // the stream acked every message before the relay returned
        let destination = self.destination();
        self.messages(&self.stream)
            .await
            .into_iter()
            .filter(|(subject, _, _)| *subject == destination)
            .map(|(_, headers, payload)| {
                let mut fields = fields(&headers);
                let id = fields
                    .remove("Nats-Msg-Id")
                    .expect("the outbox sets Nats-Msg-Id");
                assert_eq!(
                    fields.remove(headers::MESSAGE_ID).as_deref(),
                    Some(id.as_str()),
                    "the id is both Nats-Msg-Id and idem's header"
                );
                Arrived {
                    id,
                    partition_key: fields.remove(headers::PARTITION_KEY),
                    partition: None,
                    payload,
                    headers: fields,
                }
            })
            .collect()
    }

    async fn teardown(self) {
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self.js.delete_stream(self.dead_letter_stream()).await;
    }
}
