//! The outbox's Redis Streams side: [`OutboxPublisher`], an `idem::outbox::Publisher` that
//! `XADD`s each message to its destination stream, a batch in one pipelined round trip.

use std::sync::Mutex;

use idem_runtime::consume::adapter::redact;
use idem_runtime::outbox::{Message, PublishError, Publisher};
use redis::aio::MultiplexedConnection;

use crate::error::Error;
use crate::headers::{self, PAYLOAD};

/// The settings of an [`OutboxPublisher`], from [`OutboxPublisher::builder`]; nothing connects
/// until [`connect`](OutboxPublisherBuilder::connect).
#[derive(Clone)]
pub struct OutboxPublisherBuilder {
    url: String,
}

/// The URL without its password or token.
impl std::fmt::Debug for OutboxPublisherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPublisherBuilder")
            .field("url", &idem_runtime::consume::adapter::redact(&self.url))
            .finish_non_exhaustive()
    }
}

impl OutboxPublisherBuilder {
    /// Connects ([`Error::Connect`]). A broken connection is opened again on the next batch.
    pub async fn connect(self) -> Result<OutboxPublisher, Error> {
        let connect = |source| Error::Connect {
            url: redact(&self.url),
            source,
        };
        let client = redis::Client::open(self.url.as_str()).map_err(connect)?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(connect)?;
        Ok(OutboxPublisher {
            client,
            open: Mutex::new(Some(conn)),
        })
    }
}

/// Publishes outbox messages to Redis Streams for an `idem::outbox::Relay`: each one
/// `XADD <destination> * payload <payload> idem-message-id <id>`, plus `idem-partition-key`
/// and an `idem-header-<name>` field per header when it has them ([`headers`]). The payload is
/// in the field that [`Source`](crate::Source) reads, so an idem consumer reads the stream as
/// is.
///
/// A batch is one pipeline (one round trip; Redis runs a connection's commands in order) and
/// succeeds once every `XADD` replied with its entry id. A reply that is an error (the key holds
/// another type, out of memory) fails the batch, and the relay publishes it again later, so a
/// message the failed batch did add is added twice, under two entry ids with one message id:
/// consumers downstream dedupe on [`headers::MESSAGE_ID`] (read it with
/// [`Delivery::field`](crate::Delivery::field)), as on any at-least-once publish.
/// A broken connection is opened again on the next batch.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
/// use idem::outbox::Relay;
/// use idem::redis::OutboxPublisher;
///
/// let publisher = OutboxPublisher::builder("redis://127.0.0.1:6379").connect().await?;
/// let stats = Relay::new(pool, publisher)
///     .run(std::future::pending::<()>()) // or a shutdown signal such as ctrl_c()
///     .await;
/// println!("published {}", stats.published);
/// # Ok(()) }
/// ```
pub struct OutboxPublisher {
    client: redis::Client,
    /// The connection, while it works.
    open: Mutex<Option<MultiplexedConnection>>,
}

impl std::fmt::Debug for OutboxPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPublisher").finish_non_exhaustive()
    }
}

impl OutboxPublisher {
    /// A publisher to the server at `url` (`redis://...`); nothing connects until
    /// [`OutboxPublisherBuilder::connect`].
    pub fn builder(url: impl Into<String>) -> OutboxPublisherBuilder {
        OutboxPublisherBuilder { url: url.into() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        // Nothing is left half-written under the lock: the value is usable after a panic.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open connection, or a new one.
    async fn connection(&self) -> Result<MultiplexedConnection, PublishError> {
        if let Some(conn) = self.lock().clone() {
            return Ok(conn);
        }
        let conn = self.client.get_multiplexed_async_connection().await?;
        *self.lock() = Some(conn.clone());
        Ok(conn)
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut conn = self.connection().await?;
        let added: Result<Vec<String>, redis::RedisError> =
            pipeline(batch).query_async(&mut conn).await;
        match added {
            Ok(ids) if ids.len() == batch.len() => Ok(()),
            Ok(ids) => Err(format!(
                "Redis answered {} of the batch's {} XADDs",
                ids.len(),
                batch.len()
            )
            .into()),
            Err(err) => {
                // Open a fresh connection next time: this one may be broken.
                self.lock().take();
                Err(format!(
                    "XADD of a batch of {} (first message {} to {:?}): {err}",
                    batch.len(),
                    batch[0].id,
                    batch[0].destination
                )
                .into())
            }
        }
    }

    /// [`BROKER`](crate::BROKER).
    fn broker(&self) -> &str {
        crate::BROKER
    }
}

/// One `XADD` per message, in batch order.
fn pipeline(batch: &[Message]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for message in batch {
        let xadd = pipe
            .cmd("XADD")
            .arg(&message.destination)
            .arg("*")
            .arg(PAYLOAD)
            .arg(&message.payload)
            .arg(headers::MESSAGE_ID)
            .arg(&message.id);
        if !message.partition_key.is_empty() {
            xadd.arg(headers::PARTITION_KEY).arg(&message.partition_key);
        }
        for (name, value) in &message.headers {
            xadd.arg(format!("{}{name}", headers::HEADER_PREFIX))
                .arg(value);
        }
    }
    pipe
}
