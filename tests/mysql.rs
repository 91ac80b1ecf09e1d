//! The behaviour suite (`idem-testkit`) on MySQL / MariaDB (`IDEM_MYSQL_URL`, default the local
//! server), one database per rule. Built without `IDEM_MYSQL_URL` (and without
//! `CI`), the rules are ignored, saying so; a server that does not answer fails them in CI and
//! skips them, saying why, elsewhere.
#![cfg(feature = "mysql")]

mod common;

use idem_testkit::dialect::{Fill, FillRecords};
use idem_testkit::{Backend, Dialect};

// ANCHOR: backend
/// MariaDB (or MySQL 8): a new database per rule from `common::mysql`, dropped afterwards.
struct MariaDb;

impl Backend for MariaDb {
    type Db = sqlx::MySql;

    async fn setup() -> Option<sqlx::MySqlPool> {
        // READ COMMITTED, as on PostgreSQL: the kit's property handlers move an order with
        // `UPDATE … WHERE id = ? AND version < ?` and then `INSERT` it when it was missing.
        // Under InnoDB's default REPEATABLE READ the UPDATE of a missing row takes a gap lock,
        // which handlers of *different* orders share, so their INSERTs deadlock (1213) in the
        // kit's own table, and the kit's handler reports that as a non-transient error.
        // idem's own MySQL tests (tests/mysql_specific.rs) run under REPEATABLE READ.
        common::mysql_with(Some(
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        ))
        .await
    }

    async fn teardown(pool: sqlx::MySqlPool) {
        common::drop_mysql(pool).await;
    }

    fn dialect() -> Dialect {
        Dialect {
            // idem stores `expires_at` on MySQL as epoch milliseconds of the UTC clock, not as
            // the DATETIME(6) the kit's default MySQL fill assumes.
            fill_records: Some(FillRecords {
                sql: concat!(
                    "INSERT INTO idem_records (scope, msg_key, expires_at) \
                     SELECT ?, CAST(CONCAT('k', n.i) AS BINARY), \
                            (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) \
                            + ? * 86400000 \
                     FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d \
                                  + 100000 * g.d + 1 AS i \
                           FROM ", digits!("a"), ", ", digits!("b"), ", ", digits!("c"), ", ",
                    digits!("e"), ", ", digits!("f"), ", ", digits!("g"), ") n \
                     WHERE n.i <= ?"
                ),
                binds: &[Fill::Scope, Fill::Days, Fill::Count],
            }),
            ..Dialect::mysql()
        }
    }
}
// ANCHOR_END: backend

/// The digits 0 to 9 as a derived table named `$name`.
macro_rules! digits {
    ($name:literal) => {
        concat!(
            "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
             UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
             UNION ALL SELECT 8 UNION ALL SELECT 9) ",
            $name
        )
    };
}
use digits;

// ANCHOR: suite
idem_testkit::suite!(MariaDb; absent(
    idem_no_mysql = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
));
// ANCHOR_END: suite
