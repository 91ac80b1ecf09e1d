//! The outbox's Redis Streams side: [`OutboxPublisher`], an [`idem_runtime::outbox::Publisher`]
//! that `XADD`s each message to its destination stream, a batch in one pipelined round trip.

use std::sync::Mutex;

use idem_runtime::outbox::{Message, PublishError, Publisher};
use redis::aio::MultiplexedConnection;

use crate::delivery::PAYLOAD;

/// The entry field that carries the message id.
pub const FIELD_ID: &str = "idem-id";
/// The entry field that carries the partition key (absent when the message has none).
pub const FIELD_PARTITION_KEY: &str = "idem-partition-key";
/// The prefix of the entry fields that carry the message's headers: `header:<name>`.
pub const FIELD_HEADER_PREFIX: &str = "header:";

/// Publishes outbox messages to Redis Streams for an [`idem::outbox::Relay`](idem_runtime::outbox::Relay):
/// each one `XADD <destination> * payload <payload> idem-id <id>`, plus `idem-partition-key`
/// and a `header:<name>` field per header when it has them. The payload is in the field that
/// [`StreamSource`](crate::StreamSource) reads, so an idem consumer reads the stream as is.
///
/// A batch is one pipeline (one round trip; Redis runs a connection's commands in order) and
/// succeeds once every `XADD` replied with its entry id. A reply that is an error (the key holds
/// another type, out of memory) fails the batch, and the relay publishes it again later, so a
/// message the failed batch did add is added twice, under two entry ids with one `idem-id`:
/// consumers downstream dedupe on [`FIELD_ID`] (read it with
/// [`RedisDelivery::field`](crate::RedisDelivery::field)), as on any at-least-once publish.
/// A broken connection is opened again on the next batch.
///
/// ```no_run
/// # async fn demo(pool: sqlx::SqlitePool) {
/// use idem_redis::OutboxPublisher;
/// use idem_runtime::outbox::Relay;
///
/// let publisher = OutboxPublisher::new("redis://127.0.0.1:6379");
/// let stats = Relay::new(pool, publisher)
///     .run(std::future::pending::<()>()) // or a shutdown signal such as ctrl_c()
///     .await;
/// println!("published {}", stats.published);
/// # }
/// ```
pub struct OutboxPublisher {
    url: String,
    /// The connection, while it works.
    open: Mutex<Option<MultiplexedConnection>>,
}

impl OutboxPublisher {
    /// A publisher to the server at `url` (`redis://...`); it connects on its first batch.
    pub fn new(url: impl Into<String>) -> Self {
        OutboxPublisher {
            url: url.into(),
            open: Mutex::new(None),
        }
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
        let client = redis::Client::open(self.url.as_str())?;
        let conn = client.get_multiplexed_async_connection().await?;
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
            .arg(FIELD_ID)
            .arg(&message.id);
        if !message.partition_key.is_empty() {
            xadd.arg(FIELD_PARTITION_KEY).arg(&message.partition_key);
        }
        for (name, value) in &message.headers {
            xadd.arg(format!("{FIELD_HEADER_PREFIX}{name}")).arg(value);
        }
    }
    pipe
}
