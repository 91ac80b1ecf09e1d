//! idem's broker conformance kit on the real local RabbitMQ (`IDEM_RABBITMQ_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`), on SQLite and PostgreSQL (`IDEM_POSTGRES_URL`):
//! [`Rabbit`] is one rule's queue, its default dead-letter exchange `<queue>.dead` and a queue
//! bound to it; `broker_suite!` runs every rule on it. What is RabbitMQ's own (a missing
//! exchange, held requeues and `close`, an ack that cannot reach the broker, unroutable dead
//! letters, a lease held elsewhere, the database outage) is in [`specific`] and [`outage`];
//! [`pipeline`] is RabbitMQ's reliability test, two services SIGKILLed at random. On private
//! nodes the tests start themselves (never the shared server): [`tls`], the consumer and the
//! outbox over `amqps://` with a generated CA, and [`cluster`], a quorum queue on three nodes
//! that loses the consumer's node.
//! Built without `IDEM_RABBITMQ_URL` (and without `CI`), the tests are ignored, saying so (the
//! crate's build script); a server that does not answer fails the test in CI and skips it, saying
//! why, elsewhere.

#[path = "conformance/cluster.rs"]
mod cluster;
#[path = "conformance/outage.rs"]
mod outage;
#[path = "conformance/pipeline.rs"]
mod pipeline;
#[path = "conformance/specific.rs"]
mod specific;
#[path = "conformance/tls.rs"]
mod tls;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem::rabbitmq::lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use idem::rabbitmq::lapin::tcp::OwnedTLSConfig;
use idem::rabbitmq::lapin::types::{AMQPValue, FieldTable, LongString};
use idem::rabbitmq::lapin::{
    self, BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use idem::rabbitmq::{headers, OutboxPublisher, Source};
use idem_testkit::broker::harness::{skip, unique_name};
use idem_testkit::broker::{Arrived, Broker, DeadLetter, Raw, Settings, Spec};

idem_testkit::broker_suite!(Rabbit; absent(
    idem_no_rabbitmq = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
));

/// The broker: `IDEM_RABBITMQ_URL`, default the local server with guest/guest.
pub fn url() -> String {
    std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// One rule's queue (classic, or quorum when deliveries must be counted), the default
/// dead-letter exchange `<queue>.dead` and the queue `<queue>.dead.q` bound to it with the
/// default routing key (the queue's name); a confirm-mode channel of the test's own.
pub struct Rabbit {
    pub queue: String,
    pub quorum: bool,
    /// The broker (`url()`, or a private node's).
    pub url: String,
    /// TLS settings for an `amqps://` URL.
    pub tls: Option<OwnedTLSConfig>,
    connection: Connection,
    pub channel: Channel,
    /// What was taken from the dead-letter queue and from the queue (by `arrived`): a read
    /// takes messages away, so they are kept here.
    dead: Mutex<Vec<DeadLetter>>,
    arrived: Mutex<Vec<Arrived>>,
}

impl Rabbit {
    /// The dead-letter exchange.
    pub fn dlx(&self) -> String {
        format!("{}.dead", self.queue)
    }

    /// The queue bound to the dead-letter exchange.
    pub fn dlq(&self) -> String {
        format!("{}.dead.q", self.queue)
    }

    /// A confirm-mode channel on a new connection; `None` (said why) without a broker.
    async fn connect(url: &str, tls: Option<&OwnedTLSConfig>) -> Option<(Connection, Channel)> {
        let runtime = lapin::runtime::default_runtime().unwrap();
        let tls = tls.cloned().unwrap_or_default();
        let properties = ConnectionProperties::default();
        let connection = match Connection::connect_with_config(url, properties, tls, runtime).await
        {
            Ok(connection) => connection,
            Err(err) => return skip(&format!("no RabbitMQ at {url}"), err),
        };
        let channel = connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        Some((connection, channel))
    }

    fn new(queue: String, quorum: bool, connection: Connection, channel: Channel) -> Rabbit {
        Rabbit {
            queue,
            quorum,
            url: url(),
            tls: None,
            connection,
            channel,
            dead: Mutex::default(),
            arrived: Mutex::default(),
        }
    }

    /// A new queue named after `rule` (quorum or classic), its dead-letter exchange and queue,
    /// on the broker at `url` (a private node's), over TLS with `tls`.
    pub async fn on(url: &str, tls: Option<OwnedTLSConfig>, rule: &str, quorum: bool) -> Rabbit {
        let (connection, channel) = Rabbit::connect(url, tls.as_ref())
            .await
            .unwrap_or_else(|| panic!("the private node at {url} answers"));
        let queue = unique_name(&format!("idem_{rule}"));
        let rabbit = Rabbit {
            url: url.to_string(),
            tls,
            ..Rabbit::new(queue, quorum, connection, channel)
        };
        rabbit.declare().await;
        rabbit
    }

    /// The queue `queue` (made by [`Rabbit::on`]) through another node of its cluster.
    pub async fn at(url: &str, queue: &str, quorum: bool) -> Rabbit {
        let (connection, channel) = Rabbit::connect(url, None)
            .await
            .unwrap_or_else(|| panic!("the private node at {url} answers"));
        Rabbit {
            url: url.to_string(),
            ..Rabbit::new(queue.to_string(), quorum, connection, channel)
        }
    }

    async fn declare(&self) {
        let mut arguments = FieldTable::default();
        if self.quorum {
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString(LongString::from("quorum")),
            );
            // RabbitMQ 4.x quorum queues drop a message after 20 deliveries by default: keep
            // the broker's own limit out of the consumer's way.
            arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(1000));
        }
        let durable = QueueDeclareOptions::durable();
        self.channel
            .queue_declare(self.queue.as_str().into(), durable, arguments)
            .await
            .unwrap();
        self.channel
            .exchange_declare(
                self.dlx().as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        // On a private node (a cluster), the dead letters of a quorum queue are replicated too.
        let mut dead = FieldTable::default();
        if self.quorum && self.url != url() {
            dead.insert(
                "x-queue-type".into(),
                AMQPValue::LongString(LongString::from("quorum")),
            );
        }
        self.channel
            .queue_declare(self.dlq().as_str().into(), durable, dead)
            .await
            .unwrap();
        self.channel
            .queue_bind(
                self.dlq().as_str().into(),
                self.dlx().as_str().into(),
                self.queue.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    /// Ready messages and consumers of `queue` (a passive declare; unacked ones are not ready).
    pub async fn depth(&self, queue: &str) -> (u32, u32) {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (q.message_count(), q.consumer_count())
    }

    /// Waits (up to 10 s) until `queue` has `ready` ready messages and no consumer.
    pub async fn settles_at(&self, queue: &str, ready: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let depth = self.depth(queue).await;
            if depth == (ready, 0) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{queue}: (ready, consumers) = {depth:?}, expected ({ready}, 0)"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes every message of `queue` (acked), in order.
    pub async fn take_all(&self, queue: &str) -> Vec<lapin::message::Delivery> {
        let mut all = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            all.push(message.delivery);
        }
        all
    }

    /// The source of the rule's queue, with its default dead-letter exchange.
    pub fn builder(&self) -> idem::rabbitmq::SourceBuilder {
        let builder = Source::builder(self.url.as_str(), self.queue.as_str());
        match &self.tls {
            Some(tls) => builder.tls(tls.clone()),
            None => builder,
        }
    }
}

/// A header of a message as text.
pub fn header(message: &lapin::message::Delivery, name: &str) -> Option<String> {
    headers_of(message).remove(name)
}

/// Every header of a message as text.
fn headers_of(message: &lapin::message::Delivery) -> BTreeMap<String, String> {
    let Some(table) = message.properties.headers().as_ref() else {
        return BTreeMap::new();
    };
    table
        .inner()
        .iter()
        .map(|(name, value)| {
            let value = match value {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.as_str().to_string(),
                AMQPValue::LongLongInt(n) => n.to_string(),
                AMQPValue::LongInt(n) => n.to_string(),
                AMQPValue::ShortInt(n) => n.to_string(),
                other => format!("{other:?}"),
            };
            (name.as_str().to_string(), value)
        })
        .collect()
}

fn message_id(message: &lapin::message::Delivery) -> Option<String> {
    message
        .properties
        .message_id()
        .as_ref()
        .map(|id| id.as_str().to_string())
}

impl Broker for Rabbit {
    type Source = Source;
    type Publisher = OutboxPublisher;

    const NAME: &'static str = "RabbitMQ";
    /// Quorum queues count (`x-delivery-count`); the rule that needs it asks for one.
    const COUNTS_DELIVERIES: bool = true;
    const SETTLES_EACH: bool = true;
    const DROPS_REPUBLISHED: bool = false;

    async fn create(spec: Spec) -> Option<Rabbit> {
        let (connection, channel) = Rabbit::connect(&url(), None).await?;
        let queue = unique_name(&format!("idem_kit_{}", spec.rule));
        let rabbit = Rabbit::new(queue, spec.counted, connection, channel);
        rabbit.declare().await;
        Some(rabbit)
    }

    fn names(&self) -> String {
        format!("{} {}", self.queue, self.quorum)
    }

    async fn attach(names: &str) -> Rabbit {
        let (queue, quorum) = names.split_once(' ').expect("queue quorum");
        let (connection, channel) = Rabbit::connect(&url(), None).await.expect("the broker");
        Rabbit::new(queue.into(), quorum == "true", connection, channel)
    }

    async fn publish(&self, messages: &[Raw]) {
        for chunk in messages.chunks(500) {
            for message in chunk {
                let mut headers = FieldTable::default();
                headers.insert(
                    "x-producer".into(),
                    AMQPValue::LongString(LongString::from("idem-kit")),
                );
                self.channel
                    .basic_publish(
                        "".into(),
                        self.queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &message.payload,
                        BasicProperties::default()
                            .with_message_id(message.id.as_str().into())
                            .with_delivery_mode(2)
                            .with_headers(headers),
                    )
                    .await
                    .unwrap();
            }
            let returned = self.channel.wait_for_confirms().await.unwrap();
            assert!(returned.is_empty(), "{returned:?}");
        }
    }

    async fn source(&self, settings: Settings) -> Source {
        self.builder()
            .prefetch(settings.prefetch)
            .connect()
            .await
            .unwrap()
    }

    async fn dead_letters(&self) -> Vec<DeadLetter> {
        let taken = self.take_all(&self.dlq()).await;
        let mut dead = self.dead.lock().unwrap();
        dead.extend(taken.iter().map(|letter| {
            let fields = headers_of(letter);
            // A dead letter keeps the original's properties (its message_id, the kit's id) and
            // headers.
            assert_eq!(
                fields.get("x-producer").map(String::as_str),
                Some("idem-kit"),
                "{fields:?}"
            );
            DeadLetter {
                id: message_id(letter),
                payload: letter.data.clone(),
                fields,
            }
        }));
        dead.clone()
    }

    async fn unsettled(&self) -> u64 {
        u64::from(self.depth(&self.queue).await.0)
    }

    async fn gone(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.depth(&self.queue).await.1 > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn publisher(&self) -> OutboxPublisher {
        let builder = OutboxPublisher::builder(self.url.as_str());
        let builder = match &self.tls {
            Some(tls) => builder.tls(tls.clone()),
            None => builder,
        };
        builder.connect().await.unwrap()
    }

    fn input(&self) -> String {
        self.queue.clone()
    }

    fn destination(&self) -> String {
        self.queue.clone()
    }

    async fn refusing_destination(&self) -> (String, String) {
        // The default exchange routes this key to no queue: the broker returns it.
        (format!("{}.nowhere", self.queue), "to no queue".into())
    }

    async fn arrived(&self, expected: usize) -> Vec<Arrived> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let taken = self.take_all(&self.queue).await;
            let arrived = {
                let mut arrived = self.arrived.lock().unwrap();
                arrived.extend(taken.iter().map(|message| {
                    let mut fields = headers_of(message);
                    let partition_key = fields.remove(headers::PARTITION_KEY);
                    let id = message_id(message).expect("the outbox sets message_id");
                    assert_eq!(
                        fields.remove(headers::MESSAGE_ID).as_deref(),
                        Some(id.as_str()),
                        "the id is both the AMQP property and idem's header"
                    );
                    Arrived {
                        id,
                        partition_key,
                        partition: None,
                        payload: message.data.clone(),
                        headers: fields,
                    }
                }));
                arrived.clone()
            };
            if arrived.len() >= expected || Instant::now() > deadline {
                return arrived;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn teardown(self) {
        for queue in [self.queue.clone(), self.dlq()] {
            let _ = self
                .channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .channel
            .exchange_delete(self.dlx().as_str().into(), ExchangeDeleteOptions::default())
            .await;
        let _ = self.connection.close(200, "OK".into()).await;
    }
}
