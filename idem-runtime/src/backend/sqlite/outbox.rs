//! The outbox on SQLite: one writer at a time and no session locks, so one relay per database
//! (ownership of a partition is always granted). Times are epoch milliseconds.

use sqlx::{Sqlite, SqliteConnection};

use crate::admin::OutboxAdmin;
use crate::backend::sql::sql_methods;
use crate::backend::{ranked_last_errors, OutboxDialect};
use crate::outbox::OutboxStore;

impl OutboxDialect for Sqlite {
    const INSERT_OUTBOX: &'static str = concat!(
        "INSERT INTO idem_outbox (id, destination, partition_key, partition_no, payload, \
         headers, created_at, available_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ",
        now_ms!(),
        ", ",
        now_ms!(),
        ") ON CONFLICT (id) DO NOTHING"
    );

    const PURGE_SENT: &'static str = concat!(
        "DELETE FROM idem_outbox WHERE seq IN (SELECT seq FROM idem_outbox \
         WHERE sent_at < ",
        now_ms!(),
        " - ?1 ORDER BY sent_at LIMIT ?2)"
    );

    const PENDING_PARTITIONS: &'static str = concat!(
        "SELECT DISTINCT partition_no FROM idem_outbox WHERE sent_at IS NULL AND available_at <= ",
        now_ms!(),
        " LIMIT ?1"
    );

    fn last_errors(filter: &str) -> String {
        ranked_last_errors::<Self>(filter, "")
    }
}

impl OutboxStore for Sqlite {
    sql_methods!(outbox, outbox_in_lists, pending_partitions);

    async fn try_own<'c>(
        conn: &'c mut SqliteConnection,
        partitions: &'c [i32],
    ) -> Result<Vec<i32>, sqlx::Error> {
        let _ = conn;
        Ok(partitions.to_vec())
    }

    async fn disown<'c>(
        conn: &'c mut SqliteConnection,
        partitions: &'c [i32],
    ) -> Result<(), sqlx::Error> {
        let _ = (conn, partitions);
        Ok(())
    }
}

impl OutboxAdmin for Sqlite {
    sql_methods!(outbox_admin);
}
