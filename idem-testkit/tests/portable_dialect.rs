//! The whole suite on SQLite through the portable corners of the dialect: `?` placeholders,
//! `VARCHAR(191)` keys, no `RETURNING` (read back in the transaction), and `idem_records` filled
//! through `Store::insert_records` rather than a statement. SQLite accepts all of these, so the
//! paths a MySQL backend takes are checked here, on a database that needs no server.
#![cfg(feature = "sqlite")]

use idem_testkit::dialect::Placeholders;
use idem_testkit::{backends::Sqlite, Backend, Dialect};

struct PortableSqlite;

impl Backend for PortableSqlite {
    type Db = sqlx::Sqlite;

    async fn setup() -> Option<sqlx::SqlitePool> {
        Sqlite::setup().await
    }

    async fn teardown(pool: sqlx::SqlitePool) {
        Sqlite::teardown(pool).await
    }

    fn dialect() -> Dialect {
        Dialect {
            placeholders: Placeholders::Question,
            key_type: "VARCHAR(191)",
            returning: false,
            fill_records: None,
            ..Dialect::sqlite()
        }
    }
}

idem_testkit::suite!(PortableSqlite);
