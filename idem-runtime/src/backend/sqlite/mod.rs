//! SQLite: the embedded default (a file in WAL mode, or memory). Times are Unix epoch
//! milliseconds of SQLite's clock (`now_ms!`), but for `processed_at` and `updated_at`, kept
//! as ISO-8601 text for people reading the tables (`iso_now!`).

use sqlx::Sqlite;

use super::InLists;
use crate::backend::sql::Sql;
use crate::store::StampRow;

/// Now, in Unix epoch milliseconds (julianday works on every SQLite version sqlx supports).
macro_rules! now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    };
}

/// Now, as `processed_at` and `updated_at` hold it: ISO-8601 text.
macro_rules! iso_now {
    () => {
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    };
}

/// ISO-8601 text (`processed_at`, `updated_at`, or an aggregate of one) as epoch milliseconds.
macro_rules! text_ms {
    ($column:expr) => {
        concat!(
            "CAST(ROUND((julianday(",
            $column,
            ") - 2440587.5) * 86400000) AS INTEGER)"
        )
    };
}

mod admin;
mod clock;
mod dead_letters;
mod outbox;
mod recovery;
mod store;

impl Sql for Sqlite {}

impl InLists for Sqlite {
    /// Five or six parameters a row, far below SQLite's limit of 32,766.
    const ROWS_PER_STATEMENT: usize = 500;

    const PARTITION_HEAD: &'static str = concat!(
        "SELECT * FROM (SELECT seq, partition_no, id, destination, partition_key, payload, \
         headers, attempts, available_at <= ",
        now_ms!(),
        " AS ready FROM idem_outbox WHERE partition_no = ? AND sent_at IS NULL \
         ORDER BY seq LIMIT ?) AS head"
    );

    fn stamps_select(row: StampRow, keys: usize) -> String {
        match row {
            StampRow::Record => store::stamps_select("idem_records", "msg_key", keys),
            StampRow::Version => store::stamps_select("idem_versions", "entity", keys),
        }
    }
}
