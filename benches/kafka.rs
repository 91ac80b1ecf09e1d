//! End to end through a Kafka-protocol broker (`IDEM_KAFKA_BROKERS`; here tansu 0.6.0): produce
//! → consume → commit → offset, on SQLite (file, WAL, `synchronous=FULL`) and PostgreSQL. The
//! five consumers of `benches/rabbitmq.rs`, on the same credit messages (key only, one UPDATE as
//! the effect), each in a consumer group of its own on a topic of its own (4 partitions):
//!
//! 1. `hand/1`: a hand-written rdkafka consumer with the classic pattern, as its docs advise for
//!    at-least-once: per record, a transaction that inserts the message id into a processed
//!    table (`ON CONFLICT DO NOTHING`) and applies the effect, a commit, then `store_offset`
//!    (`enable.auto.offset.store=false`), committed by librdkafka every second
//!    (`auto.commit.interval.ms=1000`, idem's default `commit_interval`);
//! 2. `idem b1`: idem's consumer with `batch(1)` on `idem::kafka::Source`;
//! 3. `idem b100 c1` and `idem b100 c4`: `batch(100)` with `concurrency(1)` and `(4)`;
//! 4. `hand/100`: a hand-written batched consumer: up to 100 records (5 ms linger) in one
//!    transaction, the same two statements per record, a commit, then their offsets stored.
//!
//! ```text
//! IDEM_KAFKA_BROKERS=127.0.0.1:9092 cargo bench --bench kafka --features sqlite,postgres,kafka
//! ```
//!
//! Rounds interleave the consumers in an order shuffled each round (`BENCH_ORDER`); each round
//! produces `BENCH_E2E_MSGS` (2,000) new records to each consumer's own topic (one record per
//! produced batch: tansu 0.6.0 mishandles batches of several), then times that consumer from
//! connect (its group join included) to the synchronous commit of its last offset.
//! `BENCH_E2E_ROUNDS` (10) rounds: 20,000 records per consumer. Ratios are over the whole run and
//! the median of the per-round ratios. `BENCH_ONLY=sqlite|postgres`, `IDEM_POSTGRES_URL`. Without
//! `IDEM_KAFKA_BROKERS` it says so and measures nothing. No timing is asserted; this binary only
//! measures.

#[allow(dead_code)] // shared by every bench; this one uses the backends and the e2e helpers
mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use idem::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use idem::kafka::rdkafka::client::DefaultClientContext;
use idem::kafka::rdkafka::config::ClientConfig;
use idem::kafka::rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
use idem::kafka::rdkafka::message::{Message as _, OwnedMessage};
use idem::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use idem::kafka::Source;

use support::e2e::{self, Acked, Backend, Db, Turn, CONSUMERS};
use support::workload::{Credit, Gen};

const PARTITIONS: i32 = 4;
/// The longest one consumer may take for its round: past it the bench fails rather than hang.
const ROUND_LIMIT: Duration = Duration::from_secs(600);
const TIMEOUT: Duration = Duration::from_secs(10);

/// The topic of bench consumer `which`, and its group.
struct Names {
    prefix: String,
}

impl Names {
    fn topic(&self, which: usize) -> String {
        format!("{}_{which}", self.prefix)
    }

    fn group(&self, which: usize) -> String {
        format!("{}_{which}_group", self.prefix)
    }
}

/// Produces each message, keyed by its account, one record per batch, and waits for the acks.
async fn produce(producer: &FutureProducer, topic: &str, msgs: &[Credit]) -> anyhow::Result<()> {
    for chunk in msgs.chunks(200) {
        let sends = chunk.iter().map(|m| async move {
            let key = m.account.to_string();
            let payload = e2e::encode(m);
            producer
                .send(FutureRecord::to(topic).key(&key).payload(&payload), TIMEOUT)
                .await
                .map_err(|(err, _)| err)
        });
        for sent in futures_util::future::join_all(sends).await {
            sent?;
        }
    }
    Ok(())
}

/// The hand-written consumers' client: offsets stored by hand after the commit, committed by
/// librdkafka every second.
fn hand_consumer(brokers: &str, topic: &str, group: &str) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        .set("enable.auto.offset.store", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    Ok(consumer)
}

/// Commits the stored offsets and waits for the broker, then leaves the group (untimed work is
/// the caller's: the leave happens on drop, off the runtime's threads).
async fn commit_and_close(consumer: StreamConsumer) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        let committed = consumer.commit_consumer_state(CommitMode::Sync);
        drop(consumer);
        committed
    })
    .await??;
    Ok(())
}

/// A bench consumer's topic and group.
struct Topic<'a> {
    brokers: &'a str,
    name: &'a str,
    group: &'a str,
}

/// (1) and (4): the hand-written consumers, up to `batch` records per transaction.
async fn hand<DB: Backend>(
    turn: &Turn<'_, DB>,
    topic: &Topic<'_>,
    batch: usize,
) -> anyhow::Result<()> {
    let consumer = hand_consumer(topic.brokers, topic.name, topic.group)?;
    let mut done = 0;
    while done < turn.n {
        let mut records: Vec<OwnedMessage> = vec![consumer.recv().await?.detach()];
        let linger = tokio::time::Instant::now() + Duration::from_millis(5);
        while records.len() < batch {
            match tokio::time::timeout_at(linger, consumer.recv()).await {
                Ok(record) => records.push(record?.detach()),
                Err(_) => break,
            }
        }
        let mut tx = turn.pool.begin().await?;
        for record in &records {
            let msg = e2e::decode(record.payload().context("a record without payload")?)?;
            DB::classic(&mut tx, "kafka", &msg).await?;
        }
        tx.commit().await?;
        for record in &records {
            consumer.store_offset(topic.name, record.partition(), record.offset())?;
        }
        done += records.len() as u64;
    }
    commit_and_close(consumer).await
}

/// (2) and (3): idem's consumer; its last offsets committed before the clock stops.
async fn idem<DB: Backend>(turn: &Turn<'_, DB>, topic: &Topic<'_>) -> anyhow::Result<()> {
    let source = Source::builder(topic.brokers, topic.name, topic.group)
        .connect()
        .await?;
    let consumed = DB::idem(turn, source.deliveries(), Acked::wrap).await;
    source.commit().await?;
    consumed?;
    // Leaving the group is not timed for the hand-written consumers either.
    tokio::spawn(async move {
        let _ = source.close().await;
    });
    Ok(())
}

/// Runs a consumer's turn on the new records of its topic; its time.
async fn time_one<DB: Backend>(turn: Turn<'_, DB>, topic: &Topic<'_>) -> anyhow::Result<Duration> {
    let hand = async |batch| hand(&turn, topic, batch).await;
    let run = turn.time(hand, async || idem(&turn, topic).await);
    tokio::time::timeout(ROUND_LIMIT, run)
        .await
        .with_context(|| format!("{} did not finish its round", CONSUMERS[turn.which]))?
}

async fn bench_backend(
    brokers: &str,
    backend: &str,
    msgs: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    let db = Db::open(backend).await?;
    let names = Names {
        prefix: format!("idem_bench_{}_{backend}", std::process::id()),
    };
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let topics: Vec<String> = (0..CONSUMERS.len()).map(|i| names.topic(i)).collect();
    // idem's source checks that its dead-letter topic, `<topic>.dead`, exists (nothing here
    // is dead-lettered).
    let dead: Vec<String> = topics.iter().map(|t| format!("{t}.dead")).collect();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1)))
        .chain(
            dead.iter()
                .map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1))),
        )
        .collect();
    let created = admin
        .create_topics(&new, &AdminOptions::new().operation_timeout(Some(TIMEOUT)))
        .await
        .with_context(|| format!("no Kafka-protocol broker answers at {brokers}"))?;
    for topic in created {
        topic.map_err(|(name, err)| anyhow::anyhow!("creating topic {name}: {err}"))?;
    }
    // One record per produced batch: tansu 0.6.0 misreports high watermarks and loses or
    // redelivers records on resume when a batch holds several.
    let producer: Arc<FutureProducer> = Arc::new(
        ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("batch.num.messages", "1")
            .set("linger.ms", "0")
            .set("acks", "all")
            .create()?,
    );

    let mut gen = Gen::new(17);
    let result = e2e::interleave(rounds, |which| {
        let msgs = gen.take(msgs);
        let (names, db, producer) = (&names, &db, producer.clone());
        async move {
            produce(&producer, &names.topic(which), &msgs).await?;
            let (name, group) = (names.topic(which), names.group(which));
            let topic = Topic {
                brokers,
                name: &name,
                group: &group,
            };
            let n = msgs.len() as u64;
            e2e::on_pool!(db, |pool| time_one(Turn { pool, which, n }, &topic).await)
        }
    })
    .await;
    let names: Vec<&str> = topics.iter().chain(&dead).map(String::as_str).collect();
    let _ = admin.delete_topics(&names, &AdminOptions::new()).await;
    db.close().await;
    let (totals, ratios) = result?;
    let heading = format!("Kafka (tansu), {backend}");
    e2e::print_table(&heading, msgs, rounds, &totals, &ratios, true);
    // The spread of the interleaved rounds: each consumer's lowest and highest per-round ratio.
    for (name, per_round) in CONSUMERS.iter().zip(&ratios) {
        let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let high = per_round.iter().copied().fold(0.0, f64::max);
        println!("{name:<14} × hand/1 per round: {low:.2} to {high:.2}");
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let Ok(brokers) = std::env::var("IDEM_KAFKA_BROKERS") else {
        return support::run(|| async {
            println!(
                "skipped: IDEM_KAFKA_BROKERS is not set; start a Kafka-protocol broker (e.g. \
                 `tansu broker --listener-url tcp://127.0.0.1:9092 --advertised-listener-url \
                 tcp://127.0.0.1:9092 --storage-engine memory://tansu/`) and set \
                 IDEM_KAFKA_BROKERS=127.0.0.1:9092"
            );
            Ok(())
        });
    };
    e2e::main(
        "BENCH_E2E_MSGS",
        "BENCH_E2E_ROUNDS",
        async |backend, msgs, rounds| bench_backend(&brokers, backend, msgs, rounds).await,
    )
}
