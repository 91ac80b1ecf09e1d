//! The transactional outbox: messages a handler publishes, written in its own transaction and
//! relayed to a broker after the commit, with ids derived from the incoming message.
//!
//! In a handler, [`Context::publish`](crate::Context::publish) (or
//! [`Context::outgoing`](crate::Context::outgoing) for a partition key, a label or headers)
//! inserts a row into `idem_outbox` through the handler's transaction: if the transaction rolls
//! back, nothing was published. Its id is derived from the incoming message's scope, key and
//! version plus a label or the publish's ordinal among the handler's unlabelled publishes, so
//! a handler that runs again (after a rollback, a crash, in a batch that retried) writes the
//! same ids.
//!
//! A [`Relay`], started beside the consumer or on its own, takes committed rows in order per
//! partition (a hash of destination and partition key), hands them to a [`Publisher`] in
//! batches, and marks them sent only after the publisher returned, that is after the broker
//! confirmed them. A crash between the confirm and the mark publishes them again, with the same
//! ids: the outbox is at least once, and the next `#[idempotent(key = ...)]` consumer keyed on
//! the message id applies each exactly once. Several relays on one PostgreSQL or MariaDB
//! database share the partitions, one owner per partition at a time (a session advisory lock),
//! so per-key order holds with any number of relays.

mod message;
mod publish;
mod publisher;
mod relay;
pub(crate) mod store;

pub(crate) use message::{
    check_headers, check_names, decode_headers, encode_headers, partition_of,
};
pub use message::{InvalidMessage, Message, MAX_NAME_LEN};
pub use publish::Outgoing;
pub use publisher::{PublishError, Publisher};
pub use relay::{Relay, RelayStats};
pub use store::{NewRow, OutboxStore, PendingRow, PARTITIONS};
