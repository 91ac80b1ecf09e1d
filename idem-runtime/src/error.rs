//! [`Error`] of a generated handler, and [`KeyError`] for keys and versions that cannot be stored.

use std::fmt;

/// Which value of the attribute a [`KeyError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyPart {
    /// `scope = ...` (or the default scope, the fn's path): longer than
    /// [`MAX_SCOPE_LEN`](crate::key::MAX_SCOPE_LEN).
    Scope,
    /// `key = ...`
    Key,
    /// `version = ...`
    Version,
    /// `entity = ...`
    Entity,
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyPart::Scope => "scope",
            KeyPart::Key => "key",
            KeyPart::Version => "version",
            KeyPart::Entity => "entity",
        })
    }
}

/// What is wrong with a key or version.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyProblem {
    /// The key encodes to zero bytes.
    Empty,
    /// The key encodes to more than [`MAX_KEY_LEN`](crate::key::MAX_KEY_LEN) bytes (a scope: more
    /// than [`MAX_SCOPE_LEN`](crate::key::MAX_SCOPE_LEN)).
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The version does not fit in an `i64`; the value as text.
    OutOfRange(String),
    /// A scope holds a NUL character, which PostgreSQL text cannot store (refused on every
    /// backend, so that a scope means the same everywhere).
    Nul,
}

impl fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyProblem::Empty => f.write_str("is empty"),
            KeyProblem::TooLong { len, max } => {
                write!(f, "is {len} bytes long; the maximum is {max}")
            }
            KeyProblem::OutOfRange(value) => write!(f, "{value} does not fit in an i64"),
            KeyProblem::Nul => {
                f.write_str("contains a NUL character, which PostgreSQL cannot store")
            }
        }
    }
}

/// A key, entity or version that idem refuses to store; nothing was written.
///
/// ```
/// use idem::key::{KeyError, KeyPart, KeyProblem};
/// let err = KeyError::new("orders::on_paid", KeyPart::Key, KeyProblem::Empty);
/// assert_eq!(err.to_string(), "idempotent handler `orders::on_paid`: key is empty");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    scope: &'static str,
    part: KeyPart,
    problem: KeyProblem,
}

impl KeyError {
    /// A new error for the handler with this scope.
    pub fn new(scope: &'static str, part: KeyPart, problem: KeyProblem) -> Self {
        KeyError {
            scope,
            part,
            problem,
        }
    }

    /// The scope of the handler that refused the value.
    pub fn scope(&self) -> &'static str {
        self.scope
    }

    /// Which value was refused.
    pub fn part(&self) -> KeyPart {
        self.part
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &KeyProblem {
        &self.problem
    }
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "idempotent handler `{}`: {} {}",
            self.scope, self.part, self.problem
        )
    }
}

impl std::error::Error for KeyError {}

/// The error of a generated handler: the body's own error, the store's, or a refused key.
///
/// In every case the transaction was rolled back: neither the effect nor the record of the
/// message was written, so a redelivery will run the handler again.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error<E> {
    /// The handler body returned `Err`.
    Handler(E),
    /// The database failed while beginning, claiming or committing.
    Store(sqlx::Error),
    /// The key, entity or version cannot be stored (empty, too long, out of range).
    Key(KeyError),
    /// Lease mode: the lease expired before the body finished and another delivery took the
    /// message over, so this delivery's database writes were rolled back (its external calls,
    /// made with [`Context::derive`](crate::Context::derive) keys, are deduplicated by the
    /// other side). Make the lease longer than the handler's slowest run.
    LeaseLost,
    /// `fingerprint = "..."`: this key was applied before with another payload; nothing ran
    /// and nothing was written. The fingerprints are SHA-256 digests in lowercase hex.
    Conflict {
        /// The handler's scope.
        scope: &'static str,
        /// The fingerprint stored by the first delivery.
        stored: String,
        /// This delivery's fingerprint.
        given: String,
    },
    /// `replay = true`: the body's value cannot be kept (it does not serialize to JSON, or is
    /// larger than [`MAX_REPLAY_LEN`](crate::MAX_REPLAY_LEN)), or a stored one no longer
    /// deserializes. Nothing was written.
    Replay {
        /// The handler's scope.
        scope: &'static str,
        /// What went wrong.
        problem: String,
    },
    /// `replay = true`: a duplicate's stored value, which the generated code deserializes
    /// into `Outcome::Replayed`. Never returned by a handler.
    #[doc(hidden)]
    Stored {
        /// The handler's scope.
        scope: &'static str,
        /// The stored JSON.
        json: Vec<u8>,
    },
    /// A batch's first pass gathered this delivery's claim; the batch discards this result and
    /// runs the delivery in its second pass. Never returned to a batch's caller.
    #[doc(hidden)]
    Deferred,
}

impl<E> Error<E> {
    /// The handler's own error, if that is what this is.
    pub fn handler(&self) -> Option<&E> {
        match self {
            Error::Handler(e) => Some(e),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Handler(e) => e.fmt(f),
            Error::Store(e) => write!(f, "idempotency store: {e}"),
            Error::Key(e) => e.fmt(f),
            Error::LeaseLost => f.write_str(
                "the lease expired before the handler finished and another delivery took it over",
            ),
            Error::Conflict {
                scope,
                stored,
                given,
            } => write!(
                f,
                "idempotent handler `{scope}`: this key was applied with another payload \
                 (fingerprint {stored}, this delivery's {given})"
            ),
            Error::Replay { scope, problem } => {
                write!(f, "idempotent handler `{scope}`: replay: {problem}")
            }
            Error::Stored { .. } => f.write_str("a stored result, not yet deserialized"),
            Error::Deferred => f.write_str("claim deferred to the second pass of its batch"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the handler's error is displayed as itself, so its source is next.
            Error::Handler(e) => e.source(),
            Error::Store(e) => Some(e),
            Error::Key(e) => Some(e),
            Error::LeaseLost
            | Error::Conflict { .. }
            | Error::Replay { .. }
            | Error::Stored { .. }
            | Error::Deferred => None,
        }
    }
}
