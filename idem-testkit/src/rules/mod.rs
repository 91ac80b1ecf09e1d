//! The rules, one public async fn each, grouped by capability. Each opens a fresh database of
//! the backend, asserts the database's state (not only what a handler returned), and deletes
//! the database when it passes. [`suite!`](crate::suite) runs them all, store rules first.

pub mod admin;
pub mod attempts;
pub mod bad_input;
pub mod batch;
pub mod batch_props;
pub mod claim;
pub mod concurrency;
pub mod entity;
pub mod fingerprint;
pub mod gauges;
pub mod lease;
pub mod lease_versions;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod pause;
pub mod props;
pub mod recovery;
pub mod replay;
pub mod retention;
pub mod savepoints;
pub mod scopes;
pub mod spans;
pub mod store;
pub mod versions;
