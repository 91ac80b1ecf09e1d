//! The reliability tests, one test binary (`cargo test --test reliability`): idem under crashes
//! of its consumers and of its database, faults, ambiguous commits and bad input, each asserting
//! the database against an exactly-once oracle. RELIABILITY.md says what each proves and with
//! which figures.
//!
//! - `crash`: one consumer process SIGKILLed 30 times (SQLite, PostgreSQL);
//! - `crowd`: 4 consumer processes SIGKILLed together 10 times (PostgreSQL);
//! - `database_postgres`, `database_mariadb`: a private server crashed under 4 consumers, and a
//!   commit cut by a proxy (the caller cannot know whether it went through);
//! - `failover`: a private primary stopped dead under 8 consumers and its streaming replica
//!   promoted, the endpoint they write through moved to it, with synchronous and with
//!   asynchronous replication (PostgreSQL);
//! - `tls`: idem over TLS to private servers, with the authority verified or not, and the
//!   clear failures of a wrong authority and of a server without TLS (PostgreSQL, MariaDB);
//! - `health`: a private server crashed under a running consumer: readiness turns false and
//!   back within two check rounds (PostgreSQL);
//! - `faults`: terminated connections, statement timeouts, serialization failures (PostgreSQL);
//! - `paused`: a lease holder process SIGSTOPped past its lease, then SIGCONTed (PostgreSQL);
//! - `unreachable`: a handler's connection cut when it publishes gets an error (PostgreSQL,
//!   MariaDB);
//! - `bad_input`: scopes at the limit, huge batches, closed pools, dropped handlers (every
//!   backend);
//! - `support`: what they share.
//!
//! Each module needs its backend's feature; without it, it is not built.

#[path = "../common/mod.rs"]
mod common;
mod support;

#[cfg(feature = "sqlite")]
mod bad_input;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod crash;
#[cfg(feature = "postgres")]
mod crowd;
#[cfg(feature = "mysql")]
mod database_mariadb;
#[cfg(feature = "postgres")]
mod database_postgres;
#[cfg(feature = "postgres")]
mod failover;
#[cfg(feature = "postgres")]
mod faults;
#[cfg(feature = "postgres")]
mod health;
#[cfg(feature = "postgres")]
mod paused;
// The certificates come from idem-testkit's servers, which its `postgres` feature brings.
#[cfg(feature = "postgres")]
mod tls;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod unreachable;
