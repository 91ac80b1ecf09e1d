//! The outbox's Redis Streams side: [`OutboxPublisher`], an `idem::outbox::Publisher` that
//! `XADD`s each message to its destination stream, a batch in one pipelined round trip.

use std::sync::Mutex;

use idem_runtime::outbox::{Message, PublishError, Publisher};

use crate::error::Error;
use crate::headers::{self, PAYLOAD};
use crate::server::{slot, Conn, Server};

/// The settings of an [`OutboxPublisher`], from [`OutboxPublisher::builder`]; nothing connects
/// until [`connect`](OutboxPublisherBuilder::connect).
/// Its `Debug` shows the URL without its password.
#[derive(Clone, Debug)]
pub struct OutboxPublisherBuilder {
    server: Server,
}

impl OutboxPublisherBuilder {
    /// Connects ([`Error::Connect`]). A broken connection is opened again on the next batch.
    pub async fn connect(self) -> Result<OutboxPublisher, Error> {
        let connect = |source| Error::Connect {
            url: self.server.describe(),
            source,
        };
        let conn = self.server.connect(None).await.map_err(connect)?;
        Ok(OutboxPublisher {
            server: self.server,
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
/// succeeds once every `XADD` replied with its entry id. On a Redis Cluster, where a pipeline
/// goes to one node, a batch is one pipeline per hash slot of its destinations, sent at once
/// (a destination's messages stay in batch order; destinations need no naming rule). A reply
/// that is an error (the key holds another type, out of memory, a node down) fails the batch,
/// and the relay publishes it again later, so a message the failed batch did add is added
/// twice, under two entry ids with one message id: consumers downstream dedupe on
/// [`headers::MESSAGE_ID`] (read it with [`Delivery::field`](crate::Delivery::field)), as on
/// any at-least-once publish. A broken connection is opened again on the next batch.
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
    server: Server,
    /// The connection, while it works.
    open: Mutex<Option<Conn>>,
}

impl std::fmt::Debug for OutboxPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxPublisher").finish_non_exhaustive()
    }
}

impl OutboxPublisher {
    /// A publisher to `server`: a URL (`redis://...`, `rediss://...` for TLS), a
    /// [`redis::Client`], or a Redis Cluster's [`redis::cluster::ClusterClient`] (see
    /// [`Server`]); nothing connects until [`OutboxPublisherBuilder::connect`].
    pub fn builder(server: impl Into<Server>) -> OutboxPublisherBuilder {
        OutboxPublisherBuilder {
            server: server.into(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Conn>> {
        // Nothing is left half-written under the lock: the value is usable after a panic.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open connection, or a new one.
    async fn connection(&self) -> Result<Conn, PublishError> {
        if let Some(conn) = self.lock().clone() {
            return Ok(conn);
        }
        let conn = self.server.connect(None).await?;
        *self.lock() = Some(conn.clone());
        Ok(conn)
    }
}

impl Publisher for OutboxPublisher {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        if batch.is_empty() {
            return Ok(());
        }
        let conn = self.connection().await?;
        let added: Result<Vec<String>, redis::RedisError> = if conn.is_cluster() {
            // One pipeline per slot, at once.
            let mut slots: Vec<(redis::cluster_routing::Slot, Vec<&Message>)> = Vec::new();
            for message in batch {
                let of = slot(message.destination.as_bytes());
                match slots.iter_mut().find(|(s, _)| *s == of) {
                    Some((_, messages)) => messages.push(message),
                    None => slots.push((of, vec![message])),
                }
            }
            let sent = slots.into_iter().map(|(_, messages)| {
                let mut conn = conn.clone();
                async move {
                    pipeline(messages)
                        .query_async::<Vec<String>>(&mut conn)
                        .await
                }
            });
            futures_util::future::join_all(sent)
                .await
                .into_iter()
                .collect::<Result<Vec<Vec<String>>, _>>()
                .map(|ids| ids.into_iter().flatten().collect())
        } else {
            let mut conn = conn;
            pipeline(batch).query_async(&mut conn).await
        };
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
fn pipeline<'a>(batch: impl IntoIterator<Item = &'a Message>) -> redis::Pipeline {
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
