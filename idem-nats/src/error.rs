//! [`Error`]: what failed, on NATS JetStream.

/// What failed: connecting, a stream or consumer that must exist, a dead-letter subject that
/// cannot work, a pull, leaving. Each says which thing, and wraps async-nats' error as its
/// source. No message holds a password or a token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server did not answer or refused the connection.
    #[error("could not connect to NATS at {url}: {source}")]
    Connect {
        /// The URL, without its password or token.
        url: String,
        /// async-nats' error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The TLS handshake with the server failed: most often the server's certificate is not
    /// signed by an authority the client trusts
    /// (`ConnectOptions::add_root_certificates`), or does not name the host of the URL, or
    /// the server asks for a client certificate (`ConnectOptions::add_client_certificate`).
    /// async-nats reports a failed handshake as an I/O error; this variant says it is TLS.
    #[error("TLS with NATS at {url} failed: {source}")]
    Tls {
        /// The URL, without its password or token.
        url: String,
        /// async-nats' error (its source is rustls' error).
        #[source]
        source: async_nats::ConnectError,
    },
    /// The stream does not exist (create it first).
    #[error("the stream {stream:?} does not exist (create it first): {source}")]
    StreamMissing {
        /// Its name.
        stream: String,
        /// The server's answer.
        #[source]
        source: async_nats::Error,
    },
    /// The durable consumer does not exist on the stream (create it first).
    #[error(
        "the durable consumer {consumer:?} of the stream {stream:?} does not exist (create it \
         first): {source}"
    )]
    ConsumerMissing {
        /// The stream.
        stream: String,
        /// The consumer's name.
        consumer: String,
        /// The server's answer.
        #[source]
        source: async_nats::Error,
    },
    /// The consumer does not ack explicitly, so a delivery cannot be settled after commit.
    #[error(
        "the consumer {consumer:?} of the stream {stream:?} must use AckPolicy::Explicit (it \
         has {policy})"
    )]
    AckPolicy {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// The policy it has.
        policy: String,
    },
    /// The dead-letter subject is empty or has a wildcard.
    #[error("the dead-letter subject {subject:?} must be a subject without wildcards")]
    DeadLetterSubjectInvalid {
        /// The subject.
        subject: String,
    },
    /// The source stream itself captures the dead-letter subject: dead letters would loop
    /// back into the consumer.
    #[error(
        "the dead-letter subject {subject} is captured by the stream {stream} itself (its \
         subject {pattern}), so dead letters would loop back into the consumer; choose a \
         subject outside the stream's subjects"
    )]
    DeadLetterCaptured {
        /// The subject.
        subject: String,
        /// The source stream.
        stream: String,
        /// The stream's subject that matches it.
        pattern: String,
    },
    /// A request to the server failed (reading a stream's or consumer's info, flushing).
    #[error("{what} failed: {source}")]
    Request {
        /// What was asked.
        what: String,
        /// async-nats' error.
        #[source]
        source: async_nats::Error,
    },
    /// A pull request of the consumer failed (the stream goes on after a short pause).
    #[error("pulling from the consumer {consumer:?} of the stream {stream:?} failed: {source}")]
    Pull {
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
        /// async-nats' error.
        #[source]
        source: async_nats::Error,
    },
}

impl Error {
    /// A failed connect to `url`: [`Error::Tls`] when TLS failed (async-nats' `Tls` kind, or an
    /// I/O error whose cause is rustls'), else [`Error::Connect`].
    pub(crate) fn connect(url: &str, source: async_nats::ConnectError) -> Error {
        let url = idem_runtime::consume::adapter::redact(url);
        if is_tls(&source) {
            Error::Tls { url, source }
        } else {
            Error::Connect { url, source }
        }
    }
}

/// Whether a connect failed on TLS: async-nats says so (a TLS configuration it could not
/// build, a server without TLS), or the handshake's I/O error carries rustls' error.
fn is_tls(err: &async_nats::ConnectError) -> bool {
    if err.kind() == async_nats::ConnectErrorKind::Tls {
        return true;
    }
    let mut cause = std::error::Error::source(err);
    while let Some(err) = cause {
        if err.is::<async_nats::rustls::Error>() {
            return true;
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if inner.is::<async_nats::rustls::Error>() {
                return true;
            }
        }
        cause = err.source();
    }
    false
}
