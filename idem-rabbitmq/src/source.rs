//! [`Source`]: a queue consumed with manual acks, from [`SourceBuilder::connect`]; its
//! [`Deliveries`] for the consumer loop.

use std::collections::BTreeSet;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{BoxStream, Stream, StreamExt as _};
use idem_runtime::consume::adapter::{redact, InFlight, Lifecycle, CLOSE_TIMEOUT};
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::delivery::{Delivery, Shared};
use crate::error::Error;

/// The settings of a [`Source`], from [`Source::builder`]; nothing connects until
/// [`connect`](SourceBuilder::connect).
#[derive(Clone)]
pub struct SourceBuilder {
    url: String,
    queue: String,
    prefetch: u16,
    dead_letters: Option<String>,
    dead_letter_routing_key: Option<String>,
    max_hold: Duration,
    properties: Option<ConnectionProperties>,
    tls: Option<OwnedTLSConfig>,
    connect_timeout: Duration,
}

/// The URL without its password; of the TLS settings (which may hold a key's
/// password) only whether there are any.
impl std::fmt::Debug for SourceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceBuilder")
            .field("url", &idem_runtime::consume::adapter::redact(&self.url))
            .field("queue", &self.queue)
            .field("prefetch", &self.prefetch)
            .field("dead_letters", &self.dead_letters)
            .field("dead_letter_routing_key", &self.dead_letter_routing_key)
            .field("max_hold", &self.max_hold)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl SourceBuilder {
    /// How many deliveries the broker hands out ahead, unacked (`basic_qos`, per consumer;
    /// default 100, clamped to 1..=65,535). Set it to the consumer's `batch × concurrency`, plus
    /// room for held retries.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = u16::try_from(n).unwrap_or(u16::MAX).max(1);
        self
    }

    /// The exchange dead letters are published to (default `<queue>.dead`). It must exist:
    /// [`connect`](SourceBuilder::connect) checks it.
    pub fn dead_letters(mut self, exchange: impl Into<String>) -> Self {
        self.dead_letters = Some(exchange.into());
        self
    }

    /// The routing key of dead letters (default: the source queue's name).
    pub fn dead_letter_routing_key(mut self, key: impl Into<String>) -> Self {
        self.dead_letter_routing_key = Some(key.into());
        self
    }

    /// The longest a delivery is held before its delayed requeue (default 5 minutes): a
    /// longer `Requeue { delay }` is shortened to it, since the broker closes a channel that
    /// holds a delivery past its `consumer_timeout` (30 minutes by default).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = max;
        self
    }

    /// lapin's connection properties (connection name, auth provider, ...). Leave automatic
    /// recovery off: a recovered channel's delivery tags are not the old ones.
    pub fn connection_properties(mut self, properties: ConnectionProperties) -> Self {
        self.properties = Some(properties);
        self
    }

    /// TLS settings for an `amqps://` URL: a custom CA chain (PEM) or a client identity.
    pub fn tls(mut self, tls: OwnedTLSConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long [`connect`](SourceBuilder::connect) waits for the broker to open the
    /// connection (default [`CONNECT_TIMEOUT`], 30 s): a node that takes the TCP connection
    /// but does not answer (one starting, one cut off) fails with [`Error::ConnectTimeout`]
    /// instead of holding the caller.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects, checks that the queue and the dead-letter exchange exist
    /// ([`Error::QueueMissing`], [`Error::DeadLetterExchangeMissing`]), sets the prefetch,
    /// turns publisher confirms on for dead letters, and starts consuming with manual acks.
    pub async fn connect(self) -> Result<Source, Error> {
        let exchange = self
            .dead_letters
            .clone()
            .unwrap_or_else(|| format!("{}.dead", self.queue));
        let connection = open(&self.url, self.properties, self.tls, self.connect_timeout).await?;
        let setup = |what: &str| {
            let what = format!("{what} of the queue {:?}", self.queue);
            move |source| Error::Setup { what, source }
        };

        // Passive declares close their channel when the name is missing: use throwaway ones.
        let check = connection
            .create_channel()
            .await
            .map_err(setup("a channel"))?;
        if let Err(source) = check
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
        {
            return Err(Error::QueueMissing {
                queue: self.queue,
                source,
            });
        }
        let check = connection
            .create_channel()
            .await
            .map_err(setup("a channel"))?;
        if let Err(source) = exchange_exists(&check, &exchange).await {
            return Err(Error::DeadLetterExchangeMissing { exchange, source });
        }
        let _ = check.close(200, "OK".into()).await;

        let confirms = connection
            .create_channel()
            .await
            .map_err(setup("the dead-letter channel"))?;
        confirms
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(setup("publisher confirms"))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(setup("the consuming channel"))?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(setup("the prefetch"))?;
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(), // no_ack = false: manual acks
                FieldTable::default(),
            )
            .await
            .map_err(setup("the consumer"))?;
        let routing_key = self
            .dead_letter_routing_key
            .unwrap_or_else(|| self.queue.clone());
        Ok(Source {
            consumer,
            shared: Arc::new(Shared {
                connection,
                channel,
                confirms,
                queue: self.queue,
                dead_letter_exchange: exchange,
                dead_letter_routing_key: routing_key,
                max_hold: self.max_hold,
                unacked_tags: Mutex::new(BTreeSet::new()),
                lifecycle: Lifecycle::new(),
            }),
        })
    }
}

/// How long opening a connection waits for the broker by default (the builders'
/// `connect_timeout`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a connection to `url` with lapin's default runtime, waiting at most `timeout`.
pub(crate) async fn open(
    url: &str,
    properties: Option<ConnectionProperties>,
    tls: Option<OwnedTLSConfig>,
    timeout: Duration,
) -> Result<Connection, Error> {
    let connect = |source| Error::Connect {
        url: redact(url),
        source,
    };
    let runtime = lapin::runtime::default_runtime().map_err(connect)?;
    let opening = Connection::connect_with_config(
        url,
        properties.unwrap_or_default(),
        tls.unwrap_or_default(),
        runtime,
    );
    let Ok(opened) = tokio::time::timeout(timeout, opening).await else {
        return Err(Error::ConnectTimeout {
            url: redact(url),
            after: timeout,
        });
    };
    opened.map_err(|source| {
        // rustls reports a failed handshake (an untrusted or mismatched certificate, a
        // protocol alert) as invalid data.
        let handshake = matches!(
            source.kind(),
            lapin::ErrorKind::IOError(err) if err.kind() == std::io::ErrorKind::InvalidData
        );
        if handshake && url.trim_start().to_ascii_lowercase().starts_with("amqps:") {
            Error::Tls {
                url: redact(url),
                source,
            }
        } else {
            connect(source)
        }
    })
}

/// A passive declare of `exchange` on `channel` (which the broker closes if it is missing).
pub(crate) async fn exchange_exists(channel: &Channel, exchange: &str) -> Result<(), lapin::Error> {
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
}

/// A RabbitMQ queue consumed with manual acks: hand [`deliveries`](Source::deliveries) to
/// `idem::consume::Consumer::run`, then [`close`](Source::close) it.
pub struct Source {
    /// The queue's consumer; each [`Deliveries`] polls a clone of it (lapin's clones share
    /// the deliveries and wake every poller).
    consumer: lapin::Consumer,
    pub(crate) shared: Arc<Shared>,
}

impl Source {
    /// The queue `queue` on the broker at `url` (`amqp://user:pass@host:5672/%2f`, or
    /// `amqps://...` for TLS). Nothing connects until [`SourceBuilder::connect`].
    pub fn builder(url: impl Into<String>, queue: impl Into<String>) -> SourceBuilder {
        SourceBuilder {
            url: url.into(),
            queue: queue.into(),
            prefetch: 100,
            dead_letters: None,
            dead_letter_routing_key: None,
            max_hold: Duration::from_secs(300),
            properties: None,
            tls: None,
            connect_timeout: CONNECT_TIMEOUT,
        }
    }

    /// The deliveries, for `Consumer::run`. May be called more than once: the streams share
    /// the queue's consumer. Every one of them ends at [`close`](Source::close), or when the
    /// channel or connection closes (an error item comes first then); the caller reconnects
    /// (lapin's automatic recovery is not used: after a recovery the old deliveries' tags are
    /// void).
    pub fn deliveries(&self) -> Deliveries {
        Deliveries {
            inner: self
                .consumer
                .clone()
                .take_until(self.shared.lifecycle.stopped())
                .boxed(),
            shared: self.shared.clone(),
            _alive: self.shared.lifecycle.track(),
        }
    }

    /// Leaves the broker: stops taking (every stream of this source ends), sends
    /// `basic.cancel`, rejects held requeues at once (their hold cut short), waits up to
    /// [`CLOSE_TIMEOUT`] (30 s) for the streams and the deliveries still out to be settled or
    /// dropped, then closes the channels and the connection (200 OK). What the broker sent
    /// ahead and nobody took goes back to the queue when the channel closes.
    pub async fn close(self) -> Result<(), Error> {
        let Source { consumer, shared } = self;
        shared.lifecycle.stop();
        // A channel or connection the broker closed already has nothing left to leave.
        let cancelled = if shared.channel.status().connected() {
            shared
                .channel
                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                .await
        } else {
            Ok(())
        };
        drop(consumer);
        if !shared.lifecycle.drained(CLOSE_TIMEOUT).await {
            tracing::warn!(
                queue = %shared.queue,
                out = shared.lifecycle.in_flight(),
                "deliveries still out {CLOSE_TIMEOUT:?} after close began; closing the connection anyway (the broker requeues them)"
            );
        }
        let closed = if shared.connection.status().connected() {
            let _ = shared.confirms.close(200, "OK".into()).await;
            let _ = shared.channel.close(200, "OK".into()).await;
            shared.connection.close(200, "OK".into()).await
        } else {
            Ok(())
        };
        cancelled
            .and(closed)
            .map_err(|source| Error::Close { source })
    }

    /// The connection, e.g. to watch its status.
    pub fn connection(&self) -> &Connection {
        &self.shared.connection
    }

    /// The queue consumed.
    pub fn queue(&self) -> &str {
        &self.shared.queue
    }

    /// The exchange dead letters are published to.
    pub fn dead_letter_exchange(&self) -> &str {
        &self.shared.dead_letter_exchange
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("queue", &self.shared.queue)
            .field("consumer_tag", &self.consumer.tag())
            .field("dead_letter_exchange", &self.shared.dead_letter_exchange)
            .finish()
    }
}

impl idem_runtime::consume::Source for Source {
    type Delivery = Delivery;
    type Error = Error;
    type Deliveries = Deliveries;

    fn deliveries(&self) -> Deliveries {
        Source::deliveries(self)
    }

    async fn lag(&self) -> Result<Vec<idem_runtime::consume::Lag>, Error> {
        Source::lag(self).await
    }

    async fn close(self) -> Result<(), Error> {
        Source::close(self).await
    }

    fn probe(&self) -> idem_runtime::consume::Probe {
        Source::probe(self)
    }
}

/// The deliveries of a [`Source`]: a `Stream<Item = Result<Delivery, Error>>` for
/// `Consumer::run`. It ends at [`Source::close`], or when the consumer is cancelled or its
/// channel closes (an error item comes first in that case).
pub struct Deliveries {
    inner: BoxStream<'static, Result<lapin::message::Delivery, lapin::Error>>,
    shared: Arc<Shared>,
    /// A stream is out until dropped: `close` waits for it.
    _alive: InFlight,
}

impl fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("queue", &self.shared.queue)
            .finish_non_exhaustive()
    }
}

impl Stream for Deliveries {
    type Item = Result<Delivery, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let next = match self.inner.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(next) => next,
        };
        let shared = &self.shared;
        Poll::Ready(match next {
            Some(Ok(delivery)) => {
                shared.unacked().insert(delivery.delivery_tag);
                Some(Ok(Delivery::new(delivery, shared.clone())))
            }
            Some(Err(source)) => Some(Err(Error::Consume {
                queue: shared.queue.clone(),
                source,
            })),
            None => {
                // Cancelled or closed: lapin ends one clone of the consumer only, so end them
                // all (this also cuts held requeues short: the channel is likely gone).
                shared.lifecycle.stop();
                None
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that takes TCP connections and never answers: the connect ends at its
    /// time-out, with the URL redacted.
    #[tokio::test]
    async fn a_broker_that_never_answers_is_given_up_at_the_connect_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let url = format!("amqp://guest:secret@127.0.0.1:{port}/%2f");
        let source = Source::builder(url, "q").connect_timeout(Duration::from_millis(300));
        let connect = tokio::time::timeout(Duration::from_secs(10), source.connect());
        let err = connect
            .await
            .expect("given up at its time-out")
            .unwrap_err();
        assert!(matches!(err, Error::ConnectTimeout { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("guest:***@127.0.0.1") && !text.contains("secret"),
            "{text}"
        );
        assert!(
            text.contains("did not open the connection within 300ms"),
            "{text}"
        );
    }
}
