//! MySQL's migrations: DDL commits as it runs, so a named lock makes migrators take turns, and
//! MySQL 8 gets its own form of each file.

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{MySql, MySqlConnection, Pool};

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        include_str!("../../../migrations/mysql/0001_idempotency.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/mysql/0002_handler_features.sql"),
    ),
    (3, include_str!("../../../migrations/mysql/0003_outbox.sql")),
    (
        4,
        include_str!("../../../migrations/mysql/0004_recovery.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/mysql/0005_outbox_backlog.sql"),
    ),
];

/// The named lock (`GET_LOCK`) that serializes concurrent `migrate` calls on one database:
/// `idem_migrate_` and the MD5 of the database's name (a lock name has at most 64 characters,
/// a database's name as many). Named locks are server-wide, so a lock per database keeps the
/// migrations of two databases on one server from waiting on each other.
macro_rules! migrate_lock {
    () => {
        "CONCAT('idem_migrate_', MD5(COALESCE(DATABASE(), '')))"
    };
}

/// How long a `migrate` waits for another one to finish, in seconds.
const MIGRATE_LOCK_WAIT_SECS: i64 = 300;

/// ER_DUP_FIELDNAME: an `ADD COLUMN` of a column that exists (MySQL 8 re-running a migration
/// that a stopped migrator had applied but not recorded).
const ER_DUP_FIELDNAME: u16 = 1060;

/// ER_DUP_KEYNAME: a `CREATE INDEX` of an index that exists (MySQL 8 re-running a migration
/// that a stopped migrator had applied but not recorded).
const ER_DUP_KEYNAME: u16 = 1061;

/// Runs the migrations not yet recorded, holding the migration lock.
pub(super) async fn migrate(pool: &Pool<MySql>) -> Result<(), sqlx::Error> {
    // DDL commits implicitly on MySQL, so no transaction can hold the DDL and its version
    // row together. A named lock makes concurrent migrators take turns instead, and a
    // version is recorded only after its DDL ran; every statement of a migration may run
    // again (IF NOT EXISTS) if a migrator stopped between the two.
    let mut conn = pool.acquire().await?;
    let locked: Option<i64> =
        sqlx::query_scalar(concat!("SELECT GET_LOCK(", migrate_lock!(), ", ?)"))
            .bind(MIGRATE_LOCK_WAIT_SECS)
            .fetch_one(&mut *conn)
            .await?;
    if locked != Some(1) {
        return Err(sqlx::Error::Protocol(format!(
            "idem: another migration of this database held its lock (`idem_migrate_` and the \
             MD5 of the database's name) for {MIGRATE_LOCK_WAIT_SECS} s"
        )));
    }
    let migrated = run_migrations(&mut conn).await;
    let released = sqlx::query(concat!("SELECT RELEASE_LOCK(", migrate_lock!(), ")"))
        .execute(&mut *conn)
        .await;
    if released.is_err() {
        // A connection that may still hold the lock must not go back to the pool.
        conn.detach();
    }
    migrated.and(released.map(drop))
}

/// Runs each migration not yet recorded in `idem_migrations`, then records it. The caller holds
/// the migration lock.
async fn run_migrations(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS idem_migrations (version BIGINT PRIMARY KEY) ENGINE = InnoDB",
    )
    .execute(&mut *conn)
    .await?;
    // The migrations name MariaDB's exact (binary, NO PAD) collation for scope; MySQL 8 calls
    // it utf8mb4_0900_bin.
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await?;
    let mariadb = version.contains("MariaDB");
    for &(version, sql) in MIGRATIONS {
        let done: Option<i64> =
            sqlx::query_scalar("SELECT version FROM idem_migrations WHERE version = ?")
                .bind(version)
                .fetch_optional(&mut *conn)
                .await?;
        if done.is_some() {
            continue;
        }
        if mariadb {
            sqlx::raw_sql(sql).execute(&mut *conn).await?;
        } else {
            run_on_mysql8(conn, sql).await?;
        }
        // Only after its DDL (which committed as it ran).
        sqlx::query("INSERT INTO idem_migrations (version) VALUES (?)")
            .bind(version)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Runs a migration on MySQL 8, which has no `ADD COLUMN IF NOT EXISTS` nor `CREATE INDEX IF
/// NOT EXISTS` and names the binary NO PAD collation `utf8mb4_0900_bin`: statement by
/// statement, taking "duplicate column" or "duplicate key name" as a column or an index an
/// earlier, unrecorded run added (an `ALTER TABLE` is atomic on MySQL 8).
async fn run_on_mysql8(conn: &mut MySqlConnection, sql: &str) -> Result<(), sqlx::Error> {
    let sql = sql
        .replace("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
        .replace("ADD COLUMN IF NOT EXISTS", "ADD COLUMN")
        .replace("CREATE INDEX IF NOT EXISTS", "CREATE INDEX");
    for statement in statements(&sql) {
        match sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *conn)
            .await
        {
            Err(sqlx::Error::Database(db))
                if db
                    .try_downcast_ref::<MySqlDatabaseError>()
                    .is_some_and(|db| {
                        [ER_DUP_FIELDNAME, ER_DUP_KEYNAME].contains(&db.number())
                    }) => {}
            Err(err) => return Err(err),
            Ok(_) => {}
        }
    }
    Ok(())
}

/// The statements of a migration file: its `--` comment lines dropped, split at `;`.
fn statements(sql: &str) -> Vec<String> {
    let code: Vec<&str> = sql
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect();
    code.join("\n")
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_files_split_into_statements_without_comments() {
        for (_, sql) in MIGRATIONS {
            let statements = statements(sql);
            assert!(!statements.is_empty());
            assert!(statements.iter().all(|s| !s.contains("--")));
        }
        assert_eq!(statements(MIGRATIONS[1].1).len(), 3);
    }
}
