//! The adapter convention, checked: one consumer, [`consume`], written once against
//! `idem::consume::Source`, runs the same handler code (`Consumer::run` on
//! `source.deliveries()`, then `source.close()`) on every adapter against its real local server
//! (RabbitMQ, NATS JetStream, Kafka through `IDEM_KAFKA_BROKERS`, Redis) and on `MemoryQueue`.
//! Each case publishes the same messages (20 credits, 5 of them again, one undecodable body),
//! connects with the adapter's defaults (its dead-letter place among them), and asserts the
//! database, the counts and the broker afterwards: nothing left unsettled, and the one dead
//! letter in the default dead-letter place with the same header, `headers::REASON`, on every
//! broker. Built without a broker's variable (and without `CI`), its case is ignored, saying so
//! (the crate's build script); a server that does not answer fails the case in CI and skips it,
//! saying why, elsewhere.
#![cfg(all(
    feature = "sqlite",
    feature = "rabbitmq",
    feature = "nats",
    feature = "kafka",
    feature = "redis"
))]

mod common;
#[path = "adapters/credentials.rs"]
mod credentials;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::consume::{json, Consumer, Counts, Source};
use idem::{idempotent, Tx};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool};

#[derive(Debug, Serialize, Deserialize)]
struct Credit {
    id: String,
    account: i64,
    amount: i64,
}

#[idempotent(key = "msg.id", scope = "adapters::credit")]
async fn credit(tx: &mut Tx<'_, Sqlite>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO ledger (id, account, amount) VALUES (?, ?, ?)")
        .bind(&msg.id)
        .bind(msg.account)
        .bind(msg.amount)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Distinct credits; amounts 1..=20.
const UNIQUE: usize = 20;
/// Credits published a second time, later.
const COPIES: usize = 5;
/// Everything published: the credits, their copies, one undecodable body.
const PUBLISHED: usize = UNIQUE + COPIES + 1;
const UNDECODABLE: &[u8] = b"{not json";

/// What every case publishes, in this order.
fn messages() -> Vec<Vec<u8>> {
    let credit = |i: usize| {
        serde_json::to_vec(&Credit {
            id: format!("c{i}"),
            account: (i % 3) as i64,
            amount: i as i64 + 1,
        })
        .unwrap()
    };
    let mut all: Vec<Vec<u8>> = (0..UNIQUE).map(credit).collect();
    all.insert(UNIQUE / 2, UNDECODABLE.to_vec());
    all.extend((0..COPIES).map(|i| credit(i * 3)));
    all
}

/// The consumer, the same for every adapter: every delivery taken (counted as it is decoded)
/// is the shutdown signal, so the run ends with each in flight or settled; the loop drains,
/// and `close` leaves the broker.
async fn consume<S: Source>(source: S, pool: &SqlitePool) -> Counts {
    let decoded = Arc::new(AtomicUsize::new(0));
    let decode = {
        let decoded = decoded.clone();
        move |payload: &[u8]| {
            decoded.fetch_add(1, Ordering::SeqCst);
            json::<Credit>(payload)
        }
    };
    let all_taken = async {
        while decoded.load(Ordering::SeqCst) < PUBLISHED {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let counts = within(
        Duration::from_secs(60),
        "the consumer",
        Consumer::new(pool.clone()).batch(10).run(
            source.deliveries(),
            decode,
            async |b, msg| credit(b, msg).await,
            all_taken,
        ),
    )
    .await;
    within(Duration::from_secs(40), "close", source.close())
        .await
        .expect("close leaves the broker cleanly");
    counts
}

/// What every adapter ends with: each credit applied once, each copy a duplicate, the
/// undecodable body dead-lettered, nothing failed.
async fn assert_exactly_once(pool: &SqlitePool, counts: &Counts) {
    assert_eq!(
        (
            counts.applied,
            counts.duplicate,
            counts.dead_lettered,
            counts.failed,
            counts.requeued,
            counts.settle_failures
        ),
        (UNIQUE as u64, COPIES as u64, 1, 0, 0, 0),
        "{counts:?}"
    );
    let (rows, ids, sum): (i64, i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT id), SUM(amount) FROM ledger")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((rows, ids, sum), (UNIQUE as i64, UNIQUE as i64, 210));
}

async fn database() -> SqlitePool {
    common::sqlite_with(&[
        "CREATE TABLE ledger (id TEXT NOT NULL, account INTEGER, amount INTEGER)",
    ])
    .await
}

async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

/// Says why a case does not run (the server of this case is not there); a failure when `CI`
/// is set, since CI must run them all.
fn skip(what: &str, why: impl std::fmt::Display) {
    if std::env::var_os("CI").is_some() {
        panic!("CI must run the adapter tests, but {what}: {why}");
    }
    eprintln!("skipped: {what}: {why}");
}

/// Polls `check` until it returns true, for up to 10 s.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn memory_queue() {
    use idem::consume::memory::MemoryQueue;
    let pool = database().await;
    let queue = MemoryQueue::new();
    for message in messages() {
        queue.publish(message);
    }
    let counts = consume(queue.clone(), &pool).await;
    assert_exactly_once(&pool, &counts).await;
    assert_eq!((queue.acked(), queue.open()), ((UNIQUE + COPIES) as u64, 0));
    let dead = queue.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].0.as_slice(), dead[0].1.as_str()),
        (UNDECODABLE, "undecodable")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_rabbitmq,
    ignore = "set IDEM_RABBITMQ_URL (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) to run"
)]
async fn rabbitmq() {
    use idem::rabbitmq::lapin::options::{
        BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
        ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use idem::rabbitmq::lapin::types::{AMQPValue, FieldTable};
    use idem::rabbitmq::lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
    use idem::rabbitmq::{headers, Source};

    let url = std::env::var("IDEM_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string());
    let connection = match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(connection) => connection,
        Err(err) => return skip("no RabbitMQ at IDEM_RABBITMQ_URL", err),
    };
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let queue = common::unique_name("idem_adapters");
    // The default dead-letter exchange, `<queue>.dead`, and a queue bound to it with the
    // default routing key (the queue's name).
    let (dead, dead_queue) = (format!("{queue}.dead"), format!("{queue}.dead.q"));
    for name in [&queue, &dead_queue] {
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }
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
    channel
        .queue_bind(
            dead_queue.as_str().into(),
            dead.as_str().into(),
            queue.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for message in messages() {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                &message,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
    }
    assert!(channel.wait_for_confirms().await.unwrap().is_empty());

    let pool = database().await;
    let source = Source::builder(url.as_str(), queue.as_str())
        .connect()
        .await
        .unwrap();
    assert_eq!(source.dead_letter_exchange(), dead);
    let counts = consume(source, &pool).await;
    assert_exactly_once(&pool, &counts).await;
    // Nothing ready, nothing unacked (an unacked message would be ready again, its consumer
    // gone), no consumer left.
    eventually("the queue is empty and has no consumer", async || {
        let q = channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        (q.message_count(), q.consumer_count()) == (0, 0)
    })
    .await;
    let letter = channel
        .basic_get(dead_queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the dead letter")
        .delivery;
    assert_eq!(letter.data, UNDECODABLE);
    let reason = letter
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(headers::REASON).cloned());
    assert_eq!(
        reason,
        Some(AMQPValue::LongString(
            "undecodable".as_bytes().to_vec().into()
        ))
    );
    for name in [&queue, &dead_queue] {
        channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
    channel
        .exchange_delete(dead.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    let _ = connection.close(200, "OK".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn nats() {
    use idem::nats::async_nats::{self, jetstream};
    use idem::nats::{headers, Source};

    let url = std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(2));
    let client = match options.connect(url.as_str()).await {
        Ok(client) => client,
        Err(err) => return skip("no NATS server at IDEM_NATS_URL", err),
    };
    let js = jetstream::new(client);
    let stream = common::unique_name("IDEM_ADAPTERS").to_uppercase();
    let subject = format!("{}.credits", stream.to_lowercase().replace('_', "-"));
    // The default dead-letter subject, stored by a stream of its own.
    let dead_subject = format!("idem.dead-letter.{stream}.workers");
    let dead_stream = format!("{stream}_DLQ");
    for (name, subjects) in [(&stream, &subject), (&dead_stream, &dead_subject)] {
        let config = jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![subjects.clone()],
            ..Default::default()
        };
        let mut attempt = 0;
        while let Err(err) = js.create_stream(config.clone()).await {
            attempt += 1;
            assert!(attempt < 5, "creating the stream {name}: {err}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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
    for message in messages() {
        js.publish(subject.clone(), message.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    let pool = database().await;
    let source = Source::builder(url.as_str(), stream.as_str(), "workers")
        .connect()
        .await
        .unwrap();
    assert_eq!(
        (source.dead_letter_subject(), source.dead_letter_stream()),
        (dead_subject.as_str(), Some(dead_stream.as_str()))
    );
    let counts = consume(source, &pool).await;
    assert_exactly_once(&pool, &counts).await;
    let mut consumer: jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream("workers", &stream)
        .await
        .unwrap();
    let info = consumer.info().await.unwrap();
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "{info:?}");
    let mut dead = js.get_stream(&dead_stream).await.unwrap();
    assert_eq!(dead.info().await.unwrap().state.messages, 1);
    let letter = dead.get_raw_message(1).await.unwrap();
    assert_eq!(letter.payload.as_ref(), UNDECODABLE);
    assert_eq!(
        letter.headers.get(headers::REASON).map(|v| v.as_str()),
        Some("undecodable")
    );
    let _ = js.delete_stream(&stream).await;
    let _ = js.delete_stream(&dead_stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_kafka,
    ignore = "set IDEM_KAFKA_BROKERS to run (a Kafka-protocol broker; .ci/run starts one)"
)]
async fn kafka() {
    use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use idem::kafka::rdkafka::client::DefaultClientContext;
    use idem::kafka::rdkafka::config::ClientConfig;
    use idem::kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
    use idem::kafka::rdkafka::message::{Headers as _, Message as _};
    use idem::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
    use idem::kafka::rdkafka::{Offset, TopicPartitionList};
    use idem::kafka::{headers, Source};
    const TIMEOUT: Duration = Duration::from_secs(10);

    let Ok(brokers) = std::env::var("IDEM_KAFKA_BROKERS") else {
        return skip("IDEM_KAFKA_BROKERS is not set", "start a broker (tansu)");
    };
    let topic = common::unique_name("idem_adapters");
    let group = format!("{topic}_group");
    // The default dead-letter topic, `<topic>.dead`.
    let dead = format!("{topic}.dead");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let created = admin
        .create_topics(
            &[
                NewTopic::new(&topic, 1, TopicReplication::Fixed(1)),
                NewTopic::new(&dead, 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
        )
        .await
        .unwrap();
    for result in created {
        result.unwrap();
    }
    // One record per produced batch: tansu 0.6.0 mishandles batches of several.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("batch.num.messages", "1")
        .set("linger.ms", "0")
        .set("acks", "all")
        .create()
        .unwrap();
    for message in messages() {
        producer
            .send(
                FutureRecord::<[u8], [u8]>::to(&topic).payload(&message),
                TIMEOUT,
            )
            .await
            .unwrap();
    }

    let pool = database().await;
    let source = Source::builder(&brokers, &topic, &group)
        .consumer_config("session.timeout.ms", "6000")
        .consumer_config("heartbeat.interval.ms", "500")
        .producer_config("batch.num.messages", "1")
        .commit_interval(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let counts = consume(source, &pool).await;
    assert_exactly_once(&pool, &counts).await;
    // `close` committed every settled offset: the group is at the end of the topic.
    let offsets: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", &group)
        .create()
        .unwrap();
    let letters: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", common::unique_name("idem_adapters_reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (topic_name, dead_name) = (topic.clone(), dead.clone());
    let (committed, end, letter) = tokio::task::spawn_blocking(move || {
        let mut list = TopicPartitionList::new();
        list.add_partition(&topic_name, 0);
        let committed = offsets.committed_offsets(list, TIMEOUT).unwrap();
        let committed = committed.elements()[0].offset();
        let end = offsets.fetch_watermarks(&topic_name, 0, TIMEOUT).unwrap().1;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&dead_name, 0, Offset::Beginning)
            .unwrap();
        letters.assign(&list).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let letter = loop {
            assert!(Instant::now() < deadline, "no dead letter");
            if let Some(Ok(message)) = letters.poll(Duration::from_millis(200)) {
                let fields: BTreeMap<String, String> = message
                    .headers()
                    .iter()
                    .flat_map(|h| h.iter())
                    .map(|h| {
                        let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                        (h.key.to_string(), value.into_owned())
                    })
                    .collect();
                break (message.payload().unwrap_or_default().to_vec(), fields);
            }
        };
        (committed, end, letter)
    })
    .await
    .unwrap();
    assert_eq!(
        (committed, end),
        (Offset::Offset(PUBLISHED as i64), PUBLISHED as i64)
    );
    assert_eq!(letter.0, UNDECODABLE);
    assert_eq!(letter.1[headers::REASON], "undecodable");
    let _ = admin
        .delete_topics(&[&topic, &dead], &AdminOptions::new())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn redis() {
    use idem::redis::redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
    use idem::redis::redis::AsyncCommands as _;
    use idem::redis::{headers, Source};

    let url = std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = idem::redis::redis::Client::open(url.as_str()).unwrap();
    let mut conn = match client.get_multiplexed_async_connection().await {
        Ok(conn) => conn,
        Err(err) => return skip("no Redis at IDEM_REDIS_URL", err),
    };
    let stream = common::unique_name("idem_adapters");
    // The default dead-letter stream, `<stream>:dead`.
    let dead = format!("{stream}:dead");
    for message in messages() {
        let _: String = conn
            .xadd(&stream, "*", &[(headers::PAYLOAD, message)])
            .await
            .unwrap();
    }

    let pool = database().await;
    let source = Source::builder(url.as_str(), stream.as_str(), "billing", "w1")
        .block(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    assert_eq!(source.dead_letter_stream(), dead);
    let counts = consume(source, &pool).await;
    assert_exactly_once(&pool, &counts).await;
    let groups: StreamInfoGroupsReply = conn.xinfo_groups(&stream).await.unwrap();
    let group = groups.groups.iter().find(|g| g.name == "billing").unwrap();
    assert_eq!((group.pending, group.lag), (0, Some(0)), "{group:?}");
    let letters: StreamRangeReply = conn.xrange_all(&dead).await.unwrap();
    assert_eq!(letters.ids.len(), 1);
    let letter = &letters.ids[0];
    assert_eq!(
        letter.get::<Vec<u8>>(headers::PAYLOAD).unwrap(),
        UNDECODABLE
    );
    assert_eq!(
        letter.get::<String>(headers::REASON).as_deref(),
        Some("undecodable")
    );
    let _: i64 = conn.del(&[&stream, &dead]).await.unwrap();
}
