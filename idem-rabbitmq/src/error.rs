//! [`Error`]: what failed, on RabbitMQ.

/// What failed: connecting, a queue or exchange that must exist, consuming, leaving. Each
/// says which thing, and wraps lapin's error as its source. No message holds a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker did not answer or refused the connection.
    #[error("could not connect to RabbitMQ at {url}: {source}")]
    Connect {
        /// The URL, without its password.
        url: String,
        /// lapin's error.
        #[source]
        source: lapin::Error,
    },
    /// The broker took the TCP connection but did not open the AMQP connection within the
    /// builder's `connect_timeout` (a node starting, stopping or cut off).
    #[error("RabbitMQ at {url} did not open the connection within {after:?}")]
    ConnectTimeout {
        /// The URL, without its password.
        url: String,
        /// How long it waited.
        after: std::time::Duration,
    },
    /// The TLS handshake of an `amqps://` URL failed: most often the server's certificate is
    /// not signed by a CA the client trusts (the platform's store, or the chain given with
    /// `.tls(..)`), or it does not name the URL's host.
    #[error(
        "the TLS handshake with RabbitMQ at {url} failed (the server's certificate must be \
         signed by a CA the client trusts, the platform's or one given with .tls(..), and name \
         the URL's host): {source}"
    )]
    Tls {
        /// The URL, without its password.
        url: String,
        /// lapin's error (rustls' reason inside).
        #[source]
        source: lapin::Error,
    },
    /// The queue does not exist (declare it first).
    #[error("the queue {queue:?} does not exist (declare it first): {source}")]
    QueueMissing {
        /// Its name.
        queue: String,
        /// The broker's answer to the passive declare.
        #[source]
        source: lapin::Error,
    },
    /// The dead-letter exchange does not exist (declare it, and a queue bound to it, first).
    #[error(
        "the dead-letter exchange {exchange:?} does not exist (declare it, and bind a \
         dead-letter queue to it, before consuming; or name another with .dead_letters(..)): \
         {source}"
    )]
    DeadLetterExchangeMissing {
        /// Its name.
        exchange: String,
        /// The broker's answer to the passive declare.
        #[source]
        source: lapin::Error,
    },
    /// The exchange an outbox publisher publishes to does not exist (declare it first).
    #[error("the exchange {exchange:?} does not exist (declare it first): {source}")]
    ExchangeMissing {
        /// Its name.
        exchange: String,
        /// The broker's answer to the passive declare.
        #[source]
        source: lapin::Error,
    },
    /// Opening a channel, setting the prefetch, confirms or the consumer failed.
    #[error("setting up {what} failed: {source}")]
    Setup {
        /// What was being set up (`the consumer of queue "orders"`, ...).
        what: String,
        /// lapin's error.
        #[source]
        source: lapin::Error,
    },
    /// The consumer's channel failed while consuming (its stream ends after this).
    #[error("consuming from the queue {queue:?} failed: {source}")]
    Consume {
        /// The queue.
        queue: String,
        /// lapin's error.
        #[source]
        source: lapin::Error,
    },
    /// Leaving the broker (`basic.cancel`, closing the channels and the connection) failed.
    #[error("closing the connection to RabbitMQ failed: {source}")]
    Close {
        /// lapin's error.
        #[source]
        source: lapin::Error,
    },
}
