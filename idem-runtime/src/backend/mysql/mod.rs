//! MySQL / MariaDB (InnoDB): MySQL 8 and MariaDB 10.5+ (purges use `SKIP LOCKED`: MariaDB
//! 10.6+).
//!
//! sqlx always sets the CLIENT_FOUND_ROWS capability, so rows affected count the rows an
//! upsert *found*, not the rows it changed: `INSERT … ON DUPLICATE KEY UPDATE k = k` reports 1
//! for a fresh insert and 1 for a duplicate. Every upsert here therefore changes idem's own row
//! on the duplicate path (`dup_count = dup_count + 1`, `bumps = bumps + 1`), which InnoDB
//! reports as 2 rows with the flag on and off alike, and the version upsert stores what it
//! replaced (`prev`) to be read back. The user's tables are never touched by a duplicate.
//!
//! In an `ON DUPLICATE KEY UPDATE`, MySQL (and MariaDB without the SIMULTANEOUS_ASSIGNMENT
//! sql_mode) evaluates assignments left to right, each seeing the ones before; MariaDB with it
//! evaluates every one against the old row. Every assignment here that reads a column comes
//! before the assignment of that column, so both readings give the same result.
//!
//! Values are bound twice rather than read through `VALUES()` (deprecated in MySQL 8) or a
//! row alias (`AS new`, which MariaDB rejects). Times are Unix epoch milliseconds of the
//! server's UTC clock (`now_ms!`), in BIGINT columns.
//!
//! Beside the store, admin and outbox: `returning.rs` (whether the server takes `RETURNING`,
//! learned once) and `migrate.rs` (migrations under a named lock, and MySQL 8's form of them).

use sqlx::MySql;

use super::{row_list, InLists};
use crate::backend::sql::Sql;
use crate::store::StampRow;

/// Now, in Unix epoch milliseconds of the server's UTC clock (fixed for one statement).
/// TIMESTAMPDIFF, unlike UNIX_TIMESTAMP on MariaDB before 11.5, goes past 2038.
macro_rules! now_ms {
    () => {
        "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
    };
}

/// A DATETIME(6) in UTC (`processed_at`, or an aggregate of it) as epoch milliseconds.
macro_rules! datetime_ms {
    ($column:expr) => {
        concat!(
            "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', ",
            $column,
            ") DIV 1000)"
        )
    };
}

mod admin;
mod dead_letters;
mod migrate;
mod outbox;
mod recovery;
mod returning;
mod store;

pub use returning::use_returning;

/// Rows per multi-row statement: far below the 65,535 placeholders of a prepared statement.
const MYSQL_ROWS_PER_STATEMENT: usize = 1_000;

impl Sql for MySql {}

impl InLists for MySql {
    const ROWS_PER_STATEMENT: usize = MYSQL_ROWS_PER_STATEMENT;

    const PARTITION_HEAD: &'static str = concat!(
        "SELECT * FROM (SELECT seq, partition_no, id, destination, partition_key, payload, \
         headers, CAST(attempts AS SIGNED) AS attempts, CAST(available_at <= ",
        now_ms!(),
        " AS SIGNED) AS ready FROM idem_outbox WHERE partition_no = ? AND sent_at IS NULL \
         ORDER BY seq LIMIT ?) AS head"
    );

    fn stamps_select(row: StampRow, keys: usize) -> String {
        let select = match row {
            StampRow::Record => {
                "SELECT scope, msg_key, fingerprint, result FROM idem_records \
                 WHERE (scope, msg_key) IN "
            }
            StampRow::Version => {
                "SELECT scope, entity, fingerprint, result FROM idem_versions \
                 WHERE (scope, entity) IN "
            }
        };
        format!("{select}({})", pairs(keys))
    }
}

/// `(?, ?), (?, ?), …` for `n` rows.
fn pairs(n: usize) -> String {
    row_list("(?, ?)", n)
}
