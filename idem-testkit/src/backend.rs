//! What a backend gives the suite ([`Backend`]), and the generic SQL plumbing the rules run their
//! business queries through ([`KitDb`], [`Value`], [`Kit`]).

use std::future::Future;
use std::pin::Pin;

use idem::store::Store;
use sqlx::{Arguments, ColumnIndex, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use crate::Dialect;

/// A backend under test: its database type, how to open a fresh database of its own and delete
/// it again, and the SQL dialect of the suite's business tables.
///
/// ```ignore
/// struct MariaDb;
///
/// impl idem_testkit::Backend for MariaDb {
///     type Db = sqlx::MySql;
///     async fn setup() -> Option<sqlx::MySqlPool> { /* a new database, migrated */ }
///     async fn teardown(pool: sqlx::MySqlPool) { /* drop it */ }
///     fn dialect() -> idem_testkit::Dialect { idem_testkit::Dialect::mysql() }
/// }
///
/// idem_testkit::suite!(MariaDb);
/// ```
///
/// `Db` needs [`Store`] only. The rules of a capability beyond it (`Leases`, `Stamps`,
/// `Attempts`, `Admin`) are bounded by it; a backend without one says so to
/// [`suite!`](crate::suite) (`suite!(MyBackend; without(stamps))`), which then emits those rules
/// as ignored tests.
pub trait Backend: Send + Sync + 'static {
    /// The database, with its [`Store`] implementation (and the capabilities it has).
    type Db: KitDb;

    /// Opens a fresh database that no other test uses (a new file, a schema or database with a
    /// unique name), migrated with `idem::migrate`, with room for at least 8 connections. When
    /// the server is not there, prints one line starting with `skipped:` that says why and
    /// returns `None` (the rule then returns without running); when the environment variable
    /// `CI` is set, panics instead, since CI must run the suite. (So that a rule whose server is
    /// known to be absent shows as ignored rather than passed, invoke the suite with
    /// `absent(...)`: see [`suite!`](crate::suite).)
    fn setup() -> impl Future<Output = Option<Pool<Self::Db>>> + Send;

    /// Deletes what [`setup`](Backend::setup) made and closes the pool. Called when a rule
    /// passes; a failed rule leaves its database for inspection (a backend may sweep old ones).
    fn teardown(pool: Pool<Self::Db>) -> impl Future<Output = ()> + Send;

    /// The SQL of the suite's business tables on this database.
    fn dialect() -> Dialect;
}

/// A value bound to, or read from, a business query.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    /// A `BIGINT`.
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes (`BLOB`, `BYTEA`, `VARBINARY`).
    Bytes(Vec<u8>),
}

impl Value {
    /// The integer; panics on another kind.
    pub fn int(&self) -> i64 {
        match self {
            Value::Int(n) => *n,
            other => panic!("expected an integer, got {other:?}"),
        }
    }

    /// The text; panics on another kind.
    pub fn text(&self) -> String {
        match self {
            Value::Text(s) => s.clone(),
            other => panic!("expected text, got {other:?}"),
        }
    }

    /// The bytes; panics on another kind.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Value::Bytes(b) => b.clone(),
            other => panic!("expected bytes, got {other:?}"),
        }
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}

impl From<&String> for Value {
    fn from(s: &String) -> Self {
        Value::Text(s.clone())
    }
}

impl From<&[u8]> for Value {
    fn from(b: &[u8]) -> Self {
        Value::Bytes(b.to_vec())
    }
}

impl From<Vec<u8>> for Value {
    fn from(b: Vec<u8>) -> Self {
        Value::Bytes(b)
    }
}

/// The kind of a column a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// Read as [`Value::Int`].
    Int,
    /// Read as [`Value::Text`].
    Text,
    /// Read as [`Value::Bytes`].
    Bytes,
}

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A [`Store`] database that the suite can run its business SQL on: every sqlx database whose
/// connections execute queries and which encodes and decodes `i64`, `String` and `Vec<u8>` (a
/// blanket implementation; nothing to implement). It bundles the bounds generic sqlx code needs,
/// so the rules need only `DB: KitDb`.
pub trait KitDb: Store {
    /// Executes `sql` (already in the dialect's placeholders) with `binds`. (Rows affected are
    /// not reported: sqlx has no trait for them, and MySQL counts them its own way.)
    fn execute_sql<'c>(
        conn: &'c mut Self::Connection,
        sql: String,
        binds: Vec<Value>,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>>;

    /// Runs `sql` with `binds` and reads each row's first `columns.len()` columns as `columns`
    /// says.
    fn fetch_sql<'c>(
        conn: &'c mut Self::Connection,
        sql: String,
        binds: Vec<Value>,
        columns: &'c [Ty],
    ) -> BoxFuture<'c, Result<Vec<Vec<Value>>, sqlx::Error>>;
}

impl<DB> KitDb for DB
where
    DB: Store,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn execute_sql<'c>(
        conn: &'c mut DB::Connection,
        sql: String,
        binds: Vec<Value>,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let args = arguments::<DB>(binds)?;
            // Built by the suite from its own constant fragments and the dialect's constant
            // fragments (placeholders, types, upsert syntax); every value is bound.
            sqlx::query_with(sqlx::AssertSqlSafe(sql), args)
                .execute(conn)
                .await?;
            Ok(())
        })
    }

    fn fetch_sql<'c>(
        conn: &'c mut DB::Connection,
        sql: String,
        binds: Vec<Value>,
        columns: &'c [Ty],
    ) -> BoxFuture<'c, Result<Vec<Vec<Value>>, sqlx::Error>> {
        Box::pin(async move {
            let args = arguments::<DB>(binds)?;
            // As in `execute_sql`: constant fragments only, every value bound.
            let rows = sqlx::query_with(sqlx::AssertSqlSafe(sql), args)
                .fetch_all(conn)
                .await?;
            rows.iter()
                .map(|row| {
                    columns
                        .iter()
                        .enumerate()
                        .map(|(i, ty)| {
                            Ok(match ty {
                                Ty::Int => Value::Int(row.try_get::<i64, usize>(i)?),
                                Ty::Text => Value::Text(row.try_get::<String, usize>(i)?),
                                Ty::Bytes => Value::Bytes(row.try_get::<Vec<u8>, usize>(i)?),
                            })
                        })
                        .collect()
                })
                .collect()
        })
    }
}

fn arguments<DB>(binds: Vec<Value>) -> Result<DB::Arguments, sqlx::Error>
where
    DB: sqlx::Database,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Type<DB>,
{
    let mut args = DB::Arguments::default();
    for value in binds {
        match value {
            Value::Int(n) => args.add(n),
            Value::Text(s) => args.add(s),
            Value::Bytes(b) => args.add(b),
        }
        .map_err(sqlx::Error::Encode)?;
    }
    Ok(args)
}

/// One rule's database and dialect, with helpers that run the suite's business SQL (written
/// with `$n` placeholders) on a connection of the pool.
pub struct Kit<B: Backend> {
    /// The fresh database of this rule.
    pub pool: Pool<B::Db>,
    /// The backend's dialect.
    pub dialect: Dialect,
}

impl<B: Backend> Kit<B> {
    /// Opens the rule's database, or `None` when the backend skips (it printed why).
    pub async fn open() -> Option<Kit<B>> {
        let pool = B::setup().await?;
        Some(Kit {
            pool,
            dialect: B::dialect(),
        })
    }

    /// Deletes the rule's database.
    pub async fn close(self) {
        B::teardown(self.pool).await;
    }

    /// Executes `sql` on a connection of the pool.
    pub async fn exec(&self, sql: &str, binds: &[Value]) {
        exec::<B::Db>(&mut *self.conn().await, &self.dialect, sql, binds)
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    /// Reads rows.
    pub async fn rows(&self, sql: &str, binds: &[Value], columns: &[Ty]) -> Vec<Vec<Value>> {
        fetch::<B::Db>(&mut *self.conn().await, &self.dialect, sql, binds, columns)
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    /// Reads one integer (a `COUNT(*)`, a `BIGINT` column): panics unless there is one row.
    pub async fn int(&self, sql: &str, binds: &[Value]) -> i64 {
        self.opt_int(sql, binds)
            .await
            .unwrap_or_else(|| panic!("{sql}: no row"))
    }

    /// Reads one integer, if there is a row.
    pub async fn opt_int(&self, sql: &str, binds: &[Value]) -> Option<i64> {
        let rows = self.rows(sql, binds, &[Ty::Int]).await;
        assert!(rows.len() <= 1, "{sql}: {} rows", rows.len());
        rows.first().map(|row| row[0].int())
    }

    /// Reads the one column of every row, as `ty` says.
    pub async fn column(&self, sql: &str, binds: &[Value], ty: Ty) -> Vec<Value> {
        let rows = self.rows(sql, binds, &[ty]).await;
        rows.into_iter().map(|mut row| row.swap_remove(0)).collect()
    }

    /// Reads rows of two columns, a text and an integer.
    pub async fn text_ints(&self, sql: &str, binds: &[Value]) -> Vec<(String, i64)> {
        let rows = self.rows(sql, binds, &[Ty::Text, Ty::Int]).await;
        rows.iter()
            .map(|row| (row[0].text(), row[1].int()))
            .collect()
    }

    /// Reads rows of two text columns.
    pub async fn text_pairs(&self, sql: &str, binds: &[Value]) -> Vec<(String, String)> {
        let rows = self.rows(sql, binds, &[Ty::Text, Ty::Text]).await;
        rows.iter()
            .map(|row| (row[0].text(), row[1].text()))
            .collect()
    }

    /// A connection of the pool.
    pub async fn conn(&self) -> sqlx::pool::PoolConnection<B::Db> {
        self.pool.acquire().await.expect("a connection")
    }
}

/// Executes the suite's `sql` (`$n` placeholders) on `conn` in `dialect`.
pub async fn exec<DB: KitDb>(
    conn: &mut DB::Connection,
    dialect: &Dialect,
    sql: &str,
    binds: &[Value],
) -> Result<(), sqlx::Error> {
    DB::execute_sql(conn, dialect.sql(sql), binds.to_vec()).await
}

/// Reads rows of the suite's `sql` (`$n` placeholders) on `conn` in `dialect`.
pub async fn fetch<DB: KitDb>(
    conn: &mut DB::Connection,
    dialect: &Dialect,
    sql: &str,
    binds: &[Value],
    columns: &[Ty],
) -> Result<Vec<Vec<Value>>, sqlx::Error> {
    DB::fetch_sql(conn, dialect.sql(sql), binds.to_vec(), columns).await
}
