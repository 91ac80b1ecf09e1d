//! One delivery of a message, from its key to its outcome: what the generated code calls.
//!
//! The expansion of `#[idempotent]` builds a [`Claim`] (`builder`), [`begins`](Claim::begin)
//! it on a [`Transact`] (`begin`, `transact`), which decides in the delivery's transaction
//! (`decide`), runs the body on the transaction it gets back, then [`finishes`](Run::finish)
//! (`run`). Lease mode claims in a statement of its own first (`lease`); a batched delivery
//! leaves its stamp for its batch to write with the others' (`kept`). The handler options reach
//! the capabilities they need ([`Stamps`](crate::store::Stamps), ...) through tables of the
//! backend's methods that the claim carries (`ops`). Each file imports only the ones before it
//! in this list: seen, ops, builder, decide, kept, transact, lease, span, run, begin. A
//! consumer with recovery on learns which message failed through `seen`.

mod begin;
mod builder;
mod decide;
mod kept;
mod lease;
mod ops;
mod run;
mod seen;
pub(crate) mod span;
mod transact;

pub use begin::Begun;
pub use builder::{Claim, DEFAULT_LEASE, DEFAULT_RETENTION};
pub use decide::Skip;
pub use kept::Kept;
pub use run::{
    catch_unwind, replayed, DisplayText, ErrorText, Handled, HandlerResult, NameText, Replayable,
    Run, MAX_REPLAY_LEN,
};
pub use transact::{Claimed, Held, LeaseTransact, PooledTransact, Transact, TxCast};

pub(crate) use decide::{decide, settled, Decision, Prefetched};
pub(crate) use lease::random_u64;
pub(crate) use seen::{watching, Seen};
pub(crate) use transact::{claim_alone, CLAIM_ATTEMPTS};
