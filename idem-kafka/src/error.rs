//! [`Error`]: what failed, on Kafka.

use rdkafka::error::KafkaError;

/// What failed: settings librdkafka refuses, brokers that do not answer, a topic that must
/// exist, consuming, committing. Each says which thing, and wraps rdkafka's error as its
/// source where there is one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The settings cannot work (librdkafka refused them, or they turn off what idem needs).
    #[error("{what}")]
    Config {
        /// What is wrong.
        what: String,
        /// librdkafka's refusal, if it was its.
        #[source]
        source: Option<KafkaError>,
    },
    /// The brokers did not answer a metadata request.
    #[error("could not reach the Kafka brokers at {brokers}: {source}")]
    Connect {
        /// The bootstrap servers.
        brokers: String,
        /// rdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// The topic does not exist (create it first).
    #[error("the topic {topic:?} does not exist (create it first)")]
    TopicMissing {
        /// Its name.
        topic: String,
    },
    /// The dead-letter topic does not exist (create it, or name another with
    /// `.dead_letters(..)`).
    #[error(
        "the dead-letter topic {topic:?} does not exist (create it before consuming, or name \
         another with .dead_letters(..))"
    )]
    DeadLetterTopicMissing {
        /// Its name.
        topic: String,
    },
    /// Receiving from the topic failed (the stream goes on after a short pause).
    #[error("consuming from the topic {topic:?} failed: {source}")]
    Consume {
        /// The topic.
        topic: String,
        /// rdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// Reading the lag (the topic's partitions, the group's committed offsets, the
    /// watermarks) failed.
    #[error("reading the lag of the topic {topic:?} failed: {source}")]
    Lag {
        /// The topic.
        topic: String,
        /// rdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// Committing the watermarks failed.
    #[error("committing the offsets of the topic {topic:?} failed: {source}")]
    Commit {
        /// The topic.
        topic: String,
        /// rdkafka's error.
        #[source]
        source: KafkaError,
    },
}
