//! [`Error`]: what failed, on Redis Streams.

use redis::RedisError;

/// What failed: connecting, creating the consumer group, a dead-letter key of another type,
/// reading. Each says which thing, and wraps redis-rs' error as its source. No message holds a
/// password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not one, or the server did not answer or refused the connection.
    #[error("could not connect to Redis at {url}: {source}")]
    Connect {
        /// The URL without its password; for a [`Server`](crate::Server) made of a client,
        /// its address, or `a Redis Cluster`.
        url: String,
        /// redis-rs' error.
        #[source]
        source: RedisError,
    },
    /// The consumer group could not be created on the stream (the key holds another type, ...).
    #[error("could not create the consumer group {group:?} on the stream {stream:?}: {source}")]
    Group {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// redis-rs' error.
        #[source]
        source: RedisError,
    },
    /// The dead-letter key exists and is not a stream.
    #[error(
        "the dead-letter key {stream:?} holds a {found}, not a stream (delete it, or name \
         another with .dead_letters(..))"
    )]
    DeadLetterNotAStream {
        /// The key.
        stream: String,
        /// The type it holds.
        found: String,
    },
    /// On a Redis Cluster, the dead-letter stream is in another hash slot than the stream: the
    /// script that writes a dead letter and acks its entry, both or neither, needs both keys
    /// on one node, in one slot.
    #[error(
        "on a Redis Cluster the dead-letter stream {dead_letters:?} must be in the hash slot of \
         the stream {stream:?}, and it is not: give both one hash tag, e.g. the stream \
         \"{{orders}}\" with the dead-letter stream \"{{orders}}:dead\" (a stream without \
         braces gets \"{{<stream>}}:dead\" by default)"
    )]
    CrossSlot {
        /// The stream.
        stream: String,
        /// The dead-letter stream.
        dead_letters: String,
    },
    /// A request failed (checking the dead-letter key).
    #[error("{what} failed: {source}")]
    Request {
        /// What was asked.
        what: String,
        /// redis-rs' error.
        #[source]
        source: RedisError,
    },
    /// Reading from the stream failed (the stream of deliveries goes on after a short pause).
    #[error("reading the stream {stream:?} failed: {source}")]
    Read {
        /// The stream.
        stream: String,
        /// redis-rs' error.
        #[source]
        source: RedisError,
    },
}
