//! idem's SQL backends, grouped by database.
//!
//! The contracts stay by concern, and none of them imports this module: `Store`
//! (`store/mod.rs`), `Admin` (`admin/mod.rs`), `OutboxAdmin` (`admin/outbox.rs`) and
//! `OutboxStore` (`outbox/store.rs`). The implementations are here, one folder per database
//! (`sqlite/`, `postgres/`, `mysql/`), each with `store.rs`, `admin.rs`, `outbox.rs` (the outbox
//! and its operator queries) and what only that database needs (SQLite's clock, MySQL's
//! `RETURNING` probe and migrations); a folder imports the contracts and this module, never
//! another database's.
//!
//! What the databases share is in this module:
//! - `dialect.rs`: what each database says its own way (`StoreDialect`, `AdminDialect`,
//!   `OutboxDialect`, and `OnConflict` and `InLists` for what two of them share: its
//!   placeholders, its clock, its casts and aggregates), and the statements whose text differs
//!   only by placeholders, written once;
//! - `sql.rs`: `Sql`, the statements every database runs alike, written once over its
//!   dialect (the migration loop among them); a database's `impl Store` (or `Admin`,
//!   `OutboxStore`, `OutboxAdmin`) takes them in one line (`sql_methods!`);
//! - `recovery.rs`: `RecoverySql`, the parked retries' and dead letters' statements
//!   (`RecoveryStore`), written once over a `RecoveryDialect` of the times and the few statements
//!   each database writes its own way; a database's `impl RecoveryStore` is `recovery_store!`;
//! - `batched.rs`: the in-memory halves of batched statements;
//! - below: the conversions every backend binds with.

// What only some databases run is unused in a build without the others (every feature builds
// all of it).
#![cfg_attr(
    not(all(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(dead_code, unused_imports)
)]

use std::time::Duration;

use crate::store::millis;

mod batched;
pub(crate) mod dead_letters;
mod dialect;
pub(crate) mod recovery;
pub(crate) mod sql;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub(crate) use batched::{
    compare, fingerprinted, mark_inserted, mark_inserted_keys, one_scope, sequential_checks,
    StampColumns, StampRowOf, StampRows,
};
pub(crate) use dialect::{
    complete_lease, named, ranked_last_errors, statement, text, AdminDialect, Catalog, InLists,
    Now, OnConflict, OutboxDialect, Placeholders, Statement, StoreDialect,
};

/// `row` `n` times, comma-separated: the rows of a multi-row statement, built from a constant
/// fragment (every value in it is a bound parameter).
pub(crate) fn row_list(row: &str, n: usize) -> String {
    vec![row; n].join(", ")
}

/// A duration in whole milliseconds, capped so that the database's now plus it fits a BIGINT.
pub(crate) fn span_ms(duration: Duration) -> i64 {
    millis(duration).min(i64::MAX / 2)
}

/// A count as a bound parameter.
pub(crate) fn limit(limit: u64) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_list_repeats_a_fragment() {
        assert_eq!(row_list("(?, ?)", 3), "(?, ?), (?, ?), (?, ?)");
        assert_eq!(row_list("(?)", 1), "(?)");
        assert_eq!(row_list("(?)", 0), "");
    }
}
