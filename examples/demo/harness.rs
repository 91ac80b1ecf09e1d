//! What the self-checking demos in this folder share, so that each one says only what is its
//! broker's own. Not a template: the consumers to copy are `examples/<broker>_consumer.rs`.
//!
//! - [`orders`]: the order events, their two `#[idempotent]` handlers, the producer's stream
//!   with copies and swaps, the exactly-once oracle, the SQLite database and the checks. That
//!   is `examples/orders.rs`, the main demo, taken as a module: every demo runs the same events
//!   through the same handlers and checks them the same way.
//! - A run's id and scratch folder ([`Run`]), the exit when no server answers ([`no_server`]),
//!   a delivery wrapper that counts settlements ([`Tally`]), bounded waiting ([`until`]), the
//!   consumer's counts line ([`print_counts`]).
//! - With feature `rabbitmq`: a RabbitMQ demo's queue and dead-letter exchange ([`rabbitmq`]).

#[path = "../orders.rs"]
#[allow(dead_code)] // the orders demo's own `main` and `--metrics` printer
pub mod orders;

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::consume::{Counts, Delivery, Settle, SettleError};

/// `[<seed> [<orders>]]` from the command line: 42 and `orders` when absent.
pub fn args(orders: i64) -> Result<(u64, i64), std::num::ParseIntError> {
    let mut args = std::env::args().skip(1);
    let seed = args.next().map(|s| s.parse()).transpose()?.unwrap_or(42);
    let orders = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(orders);
    Ok((seed, orders))
}

/// One run of a demo: an id no other run on this machine has (for queue, stream and topic
/// names), and a scratch folder for its SQLite files, deleted when the run is dropped.
pub struct Run {
    pub id: String,
    dir: PathBuf,
}

impl Run {
    pub fn new(demo: &str) -> std::io::Result<Run> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let id = format!("{}-{nanos}", std::process::id());
        let dir = std::env::temp_dir().join(format!("idem-{demo}-{id}"));
        std::fs::create_dir_all(&dir)?;
        Ok(Run { id, dir })
    }

    /// The scratch folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A file in the scratch folder.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Says that no `server` answered at `url` (without its password) and how to start one; exit
/// code 2.
pub fn no_server(server: &str, url: &str, why: impl Display, start: &str) -> ExitCode {
    eprintln!(
        "No {server} answered at {} ({why}).",
        idem::consume::adapter::redact(url)
    );
    eprintln!("Start one first: {start}");
    ExitCode::from(2)
}

/// Counts the deliveries settled for good (acked or dead-lettered): how a demo knows that it
/// is done. A service runs until its shutdown signal instead, e.g. `ctrl_c()`.
#[derive(Clone, Default)]
pub struct Tally(Arc<AtomicU64>);

impl Tally {
    /// `delivery`, counted here once it is settled for good.
    pub fn wrap<D>(&self, delivery: D) -> Settled<D> {
        Settled {
            inner: delivery,
            tally: self.clone(),
        }
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A delivery that counts its settlement in a [`Tally`].
pub struct Settled<D> {
    inner: D,
    tally: Tally,
}

impl<D: Delivery> Delivery for Settled<D> {
    fn payload(&self) -> &[u8] {
        self.inner.payload()
    }
    fn deliveries(&self) -> Option<u32> {
        self.inner.deliveries()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn headers(&self) -> Vec<(String, String)> {
        self.inner.headers()
    }
    fn origin(&self) -> idem::recover::Origin {
        self.inner.origin()
    }
    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let for_good = matches!(settle, Settle::Ack | Settle::DeadLetter { .. });
        let result = self.inner.settle(settle).await;
        if result.is_ok() && for_good {
            self.tally.0.fetch_add(1, Ordering::SeqCst);
        }
        result
    }
    /// Forwarded, so that an adapter's one ack for a batch (RabbitMQ's `multiple`) is kept.
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let Some(tally) = deliveries.first().map(|d| d.tally.clone()) else {
            return Vec::new();
        };
        let results = D::ack_all(deliveries.into_iter().map(|d| d.inner).collect()).await;
        let acked = results.iter().filter(|r| r.is_ok()).count() as u64;
        tally.0.fetch_add(acked, Ordering::SeqCst);
        results
    }
}

/// Completes once `done` answers true (asked every 50 ms), or after 120 s with a message, so
/// that a bug ends a demo (whose checks then fail) instead of hanging it.
pub async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        if started.elapsed() > Duration::from_secs(120) {
            eprintln!("gave up waiting for {what} after 120 s");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The consumer's counts, and how long it took.
pub fn print_counts(counts: &Counts, elapsed: Duration) {
    println!(
        "applied {}, duplicate {}, stale {}, failed {}, dead-lettered {}, settle failures {} in {elapsed:.2?}",
        counts.applied,
        counts.duplicate,
        counts.stale,
        counts.failed,
        counts.dead_lettered,
        counts.settle_failures,
    );
}

/// A RabbitMQ demo's broker side: its connection, and each consumed queue with the source's
/// default dead-letter exchange, `<queue>.dead`, routing to a queue `<queue>.dead-letters`.
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq {
    use std::process::ExitCode;
    use std::time::Duration;

    use idem::rabbitmq::lapin::options::{
        ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use idem::rabbitmq::lapin::types::FieldTable;
    use idem::rabbitmq::lapin::{Channel, Connection, ConnectionProperties, Error, ExchangeKind};

    /// `IDEM_RABBITMQ_URL`, or the local broker.
    pub fn url() -> String {
        std::env::var("IDEM_RABBITMQ_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
    }

    /// A connection and a channel with publisher confirms; exit code 2 when no broker answers.
    pub async fn connect(url: &str) -> Result<Result<(Connection, Channel), ExitCode>, Error> {
        let connection = match Connection::connect(url, ConnectionProperties::default()).await {
            Ok(connection) => connection,
            Err(err) => {
                let start = "`rabbitmq-server -detached` (Debian/Ubuntu: `apt-get install \
                             rabbitmq-server`), or `docker run -d -p 5672:5672 rabbitmq:3`; or \
                             point IDEM_RABBITMQ_URL at another broker.";
                return Ok(Err(super::no_server("RabbitMQ", url, err, start)));
            }
        };
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Ok((connection, channel)))
    }

    /// Declares `queue`, its dead-letter exchange and the queue its dead letters go to.
    pub async fn declare(channel: &Channel, queue: &str) -> Result<(), Error> {
        let (exchange, dead) = (format!("{queue}.dead"), format!("{queue}.dead-letters"));
        for queue in [queue, &dead] {
            channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await?;
        }
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let kind = ExchangeKind::Direct;
        channel
            .exchange_declare(
                exchange.as_str().into(),
                kind,
                durable,
                FieldTable::default(),
            )
            .await?;
        // Dead letters are published with the source queue's name as routing key.
        let (options, arguments) = (QueueBindOptions::default(), FieldTable::default());
        channel
            .queue_bind(
                dead.into(),
                exchange.into(),
                queue.into(),
                options,
                arguments,
            )
            .await
    }

    /// Deletes what [`declare`] declared.
    pub async fn delete(channel: &Channel, queue: &str) -> Result<(), Error> {
        for queue in [queue.to_string(), format!("{queue}.dead-letters")] {
            channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await?;
        }
        channel
            .exchange_delete(
                format!("{queue}.dead").into(),
                ExchangeDeleteOptions::default(),
            )
            .await
    }

    /// The messages ready in `queue` and in its dead-letter queue, once both are empty or after
    /// two seconds (a consumer's closed connection gives its unacked messages back a moment
    /// later).
    pub async fn left(channel: &Channel, queue: &str) -> Result<(u32, u32), Error> {
        let ready = async |queue: String| {
            let passive = QueueDeclareOptions::default().passive();
            let declared = channel
                .queue_declare(queue.into(), passive, FieldTable::default())
                .await?;
            Ok::<_, Error>(declared.message_count())
        };
        let mut left = (0, 0);
        for _ in 0..20 {
            left = (
                ready(queue.to_string()).await?,
                ready(format!("{queue}.dead-letters")).await?,
            );
            if left == (0, 0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(left)
    }
}
