//! [`DeadLetterSql`]: the dead letters' statements
//! ([`DeadLetterAdmin`](crate::admin::DeadLetterAdmin)), written once over each database's
//! [`DeadLetterDialect`], and [`dead_letter_admin!`], which writes a database's
//! `impl DeadLetterAdmin` from them.
//!
//! Like the rest of the operator's queries they are cold, so their text is built per call, with
//! a parameter for every value ([`Binds`]). Every change commits in a transaction of its own
//! whose first statement is a write, so SQLite takes its write lock before it reads (a read
//! first would fail, not wait, when a consumer wrote in between).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use sqlx::Arguments as _;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use super::sql::Sql;
use super::{limit, span_ms, text, AdminDialect, OutboxDialect};
use crate::admin::count;
use crate::admin::dead_letters::{
    replay_id, DeadCounts, DeadLetter, DeadLetterFilter, DeadLetterGroup, DeadLetterInfo,
    DeadLetterState, Page, ParkedCounts, RecoveryCounts, Replay, ReplayOutcome, ReplayTo,
    ABANDONED,
};
use crate::outbox::{
    check_headers, check_names, decode_headers, encode_headers, partition_of, NewRow, OutboxStore,
};
use crate::recover::{group_of, shape};

/// Ids per `IN (…)` list: far below every database's limit of parameters.
const IDS_PER_STATEMENT: usize = 500;

/// What the error of an abandoned parked retry says when it recorded none.
const NO_ERROR: &str = "no error was recorded";

/// How a database writes the times and bounded deletes of the recovery tables, which
/// PostgreSQL keeps as `TIMESTAMPTZ` and the others as epoch milliseconds.
pub(crate) trait DeadLetterDialect: AdminDialect + OutboxDialect {
    /// A bound epoch-milliseconds parameter as the tables store a time.
    fn at_ms(param: &str) -> String {
        param.to_string()
    }

    /// Now, as the tables store a time.
    fn now_stored() -> String {
        Self::NOW_MS.to_string()
    }

    /// The time a bound number of milliseconds before now, as the tables store a time.
    fn ago(param: &str) -> String {
        format!("({} - {param})", Self::NOW_MS)
    }

    /// Deletes at most `limit` (a parameter) rows of `table` where `condition` holds, the
    /// first by `order`, in one statement.
    fn delete_first(table: &str, condition: &str, order: &str, limit: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {condition} \
             ORDER BY {order} LIMIT {limit})"
        )
    }
}

/// The arguments of a statement being written, and the placeholder of each in turn: the text
/// names them in the order they are bound (MySQL's `?` cannot be numbered).
pub(crate) struct Binds<DB: Database> {
    arguments: DB::Arguments,
    bound: usize,
}

impl<DB: DeadLetterDialect> Binds<DB> {
    pub(crate) fn new() -> Self {
        Binds {
            arguments: DB::Arguments::default(),
            bound: 0,
        }
    }

    /// Binds `value` and returns its placeholder, to write where the value goes.
    pub(crate) fn bind<'t, T: Encode<'t, DB> + Type<DB>>(
        &mut self,
        value: T,
    ) -> Result<String, sqlx::Error> {
        self.arguments.add(value).map_err(sqlx::Error::Encode)?;
        self.bound += 1;
        Ok(DB::PARAMETERS.nth(self.bound))
    }

    /// The arguments bound, for the statement.
    pub(crate) fn into_arguments(self) -> DB::Arguments {
        self.arguments
    }

    /// Binds each of `ids` and returns their `IN` list: `(?, ?, …)`.
    pub(crate) fn ids(&mut self, ids: &[i64]) -> Result<String, sqlx::Error>
    where
        for<'q> i64: Encode<'q, DB> + Type<DB>,
    {
        let placeholders = ids
            .iter()
            .map(|id| self.bind(*id))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(format!("({})", placeholders.join(", ")))
    }
}

/// The state stored as `text`, or an error that names it.
fn state_of(text: &str) -> Result<DeadLetterState, sqlx::Error> {
    DeadLetterState::parse(text).ok_or_else(|| {
        sqlx::Error::Protocol(format!(
            "idem: a dead letter in the unknown state `{text}` (dead, replayed or discarded)"
        ))
    })
}

/// A count of failures as `u32`: 0 below, `u32::MAX` above.
fn attempts(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// Headers as stored, checked for a publish: `Ok(None)` when there are none, `Err(why)` when
/// they are not `[name, value]` pairs or a broker could not carry them.
fn publishable_headers(stored: Option<&str>) -> Result<Option<String>, String> {
    let Some(stored) = stored else {
        return Ok(None);
    };
    let headers: Vec<(String, String)> = serde_json::from_str(stored)
        .map_err(|_| "its headers are not a JSON array of [name, value] pairs".to_string())?;
    check_headers(&headers).map_err(|err| err.to_string())?;
    Ok(encode_headers(&headers))
}

/// A dead letter as [`DeadLetterSql::replay`] reads it before its transaction.
pub(crate) struct ToReplay {
    state: String,
    destination: String,
    payload: Vec<u8>,
    headers: Option<String>,
    scope: Option<String>,
    key: Option<Vec<u8>>,
    replayed_as: Option<String>,
    consumer: String,
}

/// A parked retry as [`DeadLetterSql::bury_abandoned`] reads it before its transaction.
pub(crate) struct Abandoned {
    id: i64,
    consumer: String,
    payload: Vec<u8>,
    headers: Option<String>,
    broker: String,
    source: String,
    coordinates: String,
    destination: String,
    attempts: i64,
    last_error: Option<String>,
    first_failed_ms: i64,
}

/// The dead letters' statements, written once over the database's dialect: each method is the
/// [`DeadLetterAdmin`](crate::admin::DeadLetterAdmin) method of its name for a database whose
/// `impl` takes it with [`dead_letter_admin!`]. The bounds are sqlx's, for the values idem
/// binds and reads.
pub(crate) trait DeadLetterSql: Sql + DeadLetterDialect + OutboxStore
where
    for<'c> &'c mut Self::Connection: Executor<'c, Database = Self>,
    Self::Arguments: IntoArguments<Self>,
    for<'q> &'q str: Encode<'q, Self> + Type<Self>,
    for<'q> &'q [u8]: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q str>: Encode<'q, Self> + Type<Self>,
    for<'q> Option<&'q [u8]>: Encode<'q, Self> + Type<Self>,
    for<'q> i64: Encode<'q, Self> + Decode<'q, Self> + Type<Self>,
    for<'q> i32: Encode<'q, Self> + Decode<'q, Self> + Type<Self>,
    for<'r> bool: Decode<'r, Self> + Type<Self>,
    for<'r> String: Decode<'r, Self> + Type<Self>,
    for<'r> Vec<u8>: Decode<'r, Self> + Type<Self>,
    usize: ColumnIndex<Self::Row>,
{
    /// The columns of a [`DeadLetterInfo`], in [`info_of`](DeadLetterSql::info_of)'s order.
    fn info_columns() -> String {
        format!(
            "id, {}, {}, msg_key, reason, error, error_group, broker, {}, {}, {}, {}, {}, {}, \
             state, {}, replayed_as",
            Self::text("consumer"),
            Self::text("scope"),
            Self::text("source"),
            Self::text("coordinates"),
            Self::text("destination"),
            Self::bigint("attempts"),
            Self::stored_ms("first_failed_at"),
            Self::stored_ms("last_failed_at"),
            Self::stored_ms("settled_at"),
        )
    }

    /// A row of [`info_columns`](DeadLetterSql::info_columns).
    fn info_of(row: &Self::Row) -> Result<DeadLetterInfo, sqlx::Error> {
        let state: String = row.try_get(14)?;
        Ok(DeadLetterInfo {
            id: row.try_get(0)?,
            consumer: row.try_get(1)?,
            scope: row.try_get(2)?,
            key: row.try_get(3)?,
            reason: row.try_get(4)?,
            error: row.try_get(5)?,
            group: row.try_get(6)?,
            broker: row.try_get(7)?,
            source: row.try_get(8)?,
            coordinates: row.try_get(9)?,
            destination: row.try_get(10)?,
            attempts: attempts(row.try_get(11)?),
            first_failed_ms: row.try_get(12)?,
            last_failed_ms: row.try_get(13)?,
            state: state_of(&state)?,
            settled_ms: row.try_get(15)?,
            replayed_as: row.try_get(16)?,
        })
    }

    /// The conditions of `filter`, its values bound to `binds`.
    fn filter_sql(
        binds: &mut Binds<Self>,
        filter: &DeadLetterFilter,
    ) -> Result<String, sqlx::Error> {
        let mut conditions = Vec::new();
        if !filter.ids.is_empty() {
            conditions.push(format!("id IN {}", binds.ids(&filter.ids)?));
        }
        if let Some(state) = filter.state {
            conditions.push(format!("state = {}", binds.bind(state.as_str())?));
        }
        for (column, value) in [
            ("consumer", &filter.consumer),
            ("scope", &filter.scope),
            ("error_group", &filter.group),
            ("reason", &filter.reason),
            ("source", &filter.source),
        ] {
            if let Some(value) = value {
                conditions.push(format!("{column} = {}", binds.bind(value.as_str())?));
            }
        }
        if let Some(since) = filter.since_ms {
            let at = Self::at_ms(&binds.bind(since)?);
            conditions.push(format!("last_failed_at >= {at}"));
        }
        if let Some(until) = filter.until_ms {
            let at = Self::at_ms(&binds.bind(until)?);
            conditions.push(format!("last_failed_at < {at}"));
        }
        Ok(if conditions.is_empty() {
            "1 = 1".to_string()
        } else {
            conditions.join(" AND ")
        })
    }

    /// [`DeadLetterAdmin::dead_letters_present`](
    /// crate::admin::DeadLetterAdmin::dead_letters_present).
    fn dead_letters_present<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send + 'a {
        <Self as Sql>::present(pool, &["idem_dead_letters", "idem_parked"])
    }

    /// [`DeadLetterAdmin::groups`](crate::admin::DeadLetterAdmin::groups).
    fn groups<'a>(
        pool: &'a Pool<Self>,
        filter: &'a DeadLetterFilter,
    ) -> impl Future<Output = Result<Vec<DeadLetterGroup>, sqlx::Error>> + Send + 'a {
        async move {
            let mut binds = Binds::new();
            let sql = format!(
                "SELECT error_group, {}, {}, reason, error_shape, COUNT(*), {}, {} \
                 FROM idem_dead_letters WHERE {} \
                 GROUP BY error_group, consumer, scope, reason, error_shape \
                 ORDER BY COUNT(*) DESC, error_group",
                Self::text("consumer"),
                Self::text("scope"),
                Self::stored_ms("MIN(first_failed_at)"),
                Self::stored_ms("MAX(last_failed_at)"),
                Self::filter_sql(&mut binds, filter)?,
            );
            type GroupRow = (
                String,
                String,
                Option<String>,
                String,
                String,
                i64,
                i64,
                i64,
            );
            let rows: Vec<GroupRow> =
                sqlx::query_as_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                    .fetch_all(pool)
                    .await?;
            Ok(rows
                .into_iter()
                .map(
                    |(group, consumer, scope, reason, shape, n, first, last)| DeadLetterGroup {
                        group,
                        consumer,
                        scope,
                        reason,
                        shape,
                        count: count(n),
                        first_failed_ms: first,
                        last_failed_ms: last,
                    },
                )
                .collect())
        }
    }

    /// [`DeadLetterAdmin::list`](crate::admin::DeadLetterAdmin::list).
    fn list<'a>(
        pool: &'a Pool<Self>,
        filter: &'a DeadLetterFilter,
        page: Page,
    ) -> impl Future<Output = Result<Vec<DeadLetterInfo>, sqlx::Error>> + Send + 'a {
        async move {
            let mut binds = Binds::new();
            let mut condition = Self::filter_sql(&mut binds, filter)?;
            if let Some(after) = page.after {
                condition.push_str(&format!(" AND id > {}", binds.bind(after)?));
            }
            let sql = format!(
                "SELECT {} FROM idem_dead_letters WHERE {condition} ORDER BY id LIMIT {}",
                Self::info_columns(),
                binds.bind(limit(page.limit))?,
            );
            let rows = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                .fetch_all(pool)
                .await?;
            rows.iter().map(Self::info_of).collect()
        }
    }

    /// [`DeadLetterAdmin::dead_letter`](crate::admin::DeadLetterAdmin::dead_letter).
    fn dead_letter<'a>(
        pool: &'a Pool<Self>,
        id: i64,
    ) -> impl Future<Output = Result<Option<DeadLetter>, sqlx::Error>> + Send + 'a {
        async move {
            let mut binds = Binds::new();
            let sql = format!(
                "SELECT {}, error_shape, payload, headers FROM idem_dead_letters WHERE id = {}",
                Self::info_columns(),
                binds.bind(id)?,
            );
            let Some(row) = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                .fetch_optional(pool)
                .await?
            else {
                return Ok(None);
            };
            let headers: Option<String> = row.try_get(19)?;
            Ok(Some(DeadLetter {
                info: Self::info_of(&row)?,
                shape: row.try_get(17)?,
                payload: row.try_get(18)?,
                headers: decode_headers(headers.as_deref()),
            }))
        }
    }

    /// [`DeadLetterAdmin::replay`](crate::admin::DeadLetterAdmin::replay): the rows are read
    /// in chunks, then each is replayed in a transaction that changes it only if it is as it
    /// was read (still dead, not replayed since), so its outbox id is the one [`replay_id`]
    /// gives for that state.
    fn replay<'a>(
        pool: &'a Pool<Self>,
        ids: &'a [i64],
        to: ReplayTo,
    ) -> impl Future<Output = Result<Vec<Replay>, sqlx::Error>> + Send + 'a {
        async move {
            let mut out = Vec::with_capacity(ids.len());
            for chunk in ids.chunks(IDS_PER_STATEMENT) {
                let mut binds = Binds::new();
                let sql = format!(
                    "SELECT id, state, {}, payload, headers, {}, msg_key, replayed_as, {} \
                     FROM idem_dead_letters WHERE id IN {}",
                    Self::text("destination"),
                    Self::text("scope"),
                    Self::text("consumer"),
                    binds.ids(chunk)?,
                );
                let rows = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                    .fetch_all(pool)
                    .await?;
                let mut found = HashMap::with_capacity(rows.len());
                for row in &rows {
                    let id: i64 = row.try_get(0)?;
                    found.insert(
                        id,
                        ToReplay {
                            state: row.try_get(1)?,
                            destination: row.try_get(2)?,
                            payload: row.try_get(3)?,
                            headers: row.try_get(4)?,
                            scope: row.try_get(5)?,
                            key: row.try_get(6)?,
                            replayed_as: row.try_get(7)?,
                            consumer: row.try_get(8)?,
                        },
                    );
                }
                for &id in chunk {
                    let outcome = match found.remove(&id) {
                        None => ReplayOutcome::Missing,
                        Some(row) => Self::replay_one(pool, id, row, to).await?,
                    };
                    out.push(Replay { id, outcome });
                }
            }
            Ok(out)
        }
    }

    /// Replays one dead letter read as `row`, in a transaction of its own.
    fn replay_one<'a>(
        pool: &'a Pool<Self>,
        id: i64,
        row: ToReplay,
        to: ReplayTo,
    ) -> impl Future<Output = Result<ReplayOutcome, sqlx::Error>> + Send + 'a {
        async move {
            let state = state_of(&row.state)?;
            if state != DeadLetterState::Dead {
                return Ok(ReplayOutcome::NotDead(state));
            }
            // No partition key: the row keeps none, and a replay is one message, not a
            // sequence whose order must hold. A replay to the consumer publishes nothing.
            let outbox = to == ReplayTo::Outbox;
            if let (true, Err(err)) = (outbox, check_names(&row.destination, "")) {
                return Ok(ReplayOutcome::Refused(err.to_string()));
            }
            let headers = match publishable_headers(row.headers.as_deref()) {
                Ok(headers) => headers,
                Err(why) if outbox => return Ok(ReplayOutcome::Refused(why)),
                Err(_) => None,
            };
            let outbox_id = replay_id(id, row.replayed_as.as_deref());
            let mut tx = pool.begin().await?;
            let mut binds = Binds::new();
            let sql = format!(
                "UPDATE idem_dead_letters SET state = 'replayed', settled_at = {}, \
                 replayed_as = {} WHERE id = {} AND state = 'dead' \
                 AND COALESCE(replayed_as, '') = {}",
                Self::now_stored(),
                binds.bind(outbox_id.as_str())?,
                binds.bind(id)?,
                binds.bind(row.replayed_as.as_deref().unwrap_or(""))?,
            );
            let marked = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                .execute(&mut *tx)
                .await?;
            if Self::rows_affected(&marked) != 1 {
                tx.rollback().await?;
                return Self::changed(pool, id).await;
            }
            if outbox {
                <Self as OutboxStore>::insert_outbox(
                    &mut *tx,
                    NewRow {
                        id: &outbox_id,
                        destination: &row.destination,
                        partition_key: "",
                        partition_no: partition_of(&row.destination, ""),
                        payload: &row.payload,
                        headers: headers.as_deref(),
                    },
                )
                .await?;
            } else {
                // Its own columns, copied: the parked row is the dead letter as it was parked.
                let mut binds = Binds::new();
                let sql = format!(
                    "INSERT INTO idem_parked (consumer, payload, headers, broker, source, \
                     coordinates, destination, attempts, last_error, first_failed_at, due_at) \
                     SELECT consumer, payload, headers, broker, source, coordinates, \
                     destination, 0, error, first_failed_at, {} FROM idem_dead_letters \
                     WHERE id = {}",
                    Self::now_stored(),
                    binds.bind(id)?,
                );
                sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                    .execute(&mut *tx)
                    .await?;
            }
            if let (Some(scope), Some(key)) = (row.scope.as_deref(), row.key.as_deref()) {
                sqlx::query(text::CLEAR_ATTEMPTS.with(Self::PARAMETERS))
                    .bind(scope)
                    .bind(key)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            #[cfg(feature = "metrics")]
            crate::metrics::dead_letter_replayed(if outbox { "outbox" } else { "consumer" });
            Ok(if outbox {
                ReplayOutcome::Replayed {
                    outbox_id,
                    destination: row.destination,
                }
            } else {
                ReplayOutcome::Parked {
                    consumer: row.consumer,
                }
            })
        }
    }

    /// What a dead letter that changed since it was read has become.
    fn changed<'a>(
        pool: &'a Pool<Self>,
        id: i64,
    ) -> impl Future<Output = Result<ReplayOutcome, sqlx::Error>> + Send + 'a {
        async move {
            let mut binds = Binds::new();
            let sql = format!(
                "SELECT state FROM idem_dead_letters WHERE id = {}",
                binds.bind(id)?
            );
            let state: Option<String> =
                sqlx::query_scalar_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                    .fetch_optional(pool)
                    .await?;
            Ok(match state.as_deref().map(state_of).transpose()? {
                None => ReplayOutcome::Missing,
                Some(DeadLetterState::Dead) => ReplayOutcome::Refused(
                    "it changed while it was being replayed; replay it again".to_string(),
                ),
                Some(state) => ReplayOutcome::NotDead(state),
            })
        }
    }

    /// [`DeadLetterAdmin::discard`](crate::admin::DeadLetterAdmin::discard).
    fn discard<'a>(
        pool: &'a Pool<Self>,
        ids: &'a [i64],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        async move {
            let mut discarded = 0;
            for chunk in ids.chunks(IDS_PER_STATEMENT) {
                let mut binds = Binds::new();
                let sql = format!(
                    "UPDATE idem_dead_letters SET state = 'discarded', settled_at = {} \
                     WHERE state = 'dead' AND id IN {}",
                    Self::now_stored(),
                    binds.ids(chunk)?,
                );
                let done = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                    .execute(pool)
                    .await?;
                discarded += Self::rows_affected(&done);
            }
            Ok(discarded)
        }
    }

    /// [`DeadLetterAdmin::purge_dead_letters`](
    /// crate::admin::DeadLetterAdmin::purge_dead_letters). A settled row's last failure is
    /// before its settling, so the condition on `last_failed_at` (its index) holds for every
    /// row the retention removes.
    fn purge_dead_letters<'a>(
        pool: &'a Pool<Self>,
        retention: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        async move {
            let age = span_ms(retention);
            let mut binds = Binds::new();
            let condition = format!(
                "last_failed_at < {} AND (state = 'dead' OR settled_at < {})",
                Self::ago(&binds.bind(age)?),
                Self::ago(&binds.bind(age)?),
            );
            let sql = Self::delete_first(
                "idem_dead_letters",
                &condition,
                "last_failed_at",
                &binds.bind(self::limit(limit))?,
            );
            let deleted = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                .execute(pool)
                .await?;
            Ok(Self::rows_affected(&deleted))
        }
    }

    /// Where a parked retry is abandoned: due more than a bound age ago, and not held under a
    /// running lease.
    fn abandoned_sql(binds: &mut Binds<Self>, age: i64) -> Result<String, sqlx::Error> {
        Ok(format!(
            "due_at < {} AND (lease_until IS NULL OR lease_until < {})",
            Self::ago(&binds.bind(age)?),
            Self::now_stored(),
        ))
    }

    /// [`DeadLetterAdmin::bury_abandoned`](crate::admin::DeadLetterAdmin::bury_abandoned): the
    /// rows are read first; in the transaction, each is deleted only if it is still abandoned
    /// (a consumer that took or re-parked it meanwhile keeps it), and written as a dead letter
    /// only if it was deleted.
    fn bury_abandoned<'a>(
        pool: &'a Pool<Self>,
        retention: Duration,
        limit: u64,
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
        async move {
            let age = span_ms(retention);
            let mut binds = Binds::new();
            let sql = format!(
                "SELECT id, {}, payload, headers, broker, {}, {}, {}, {}, last_error, {} \
                 FROM idem_parked WHERE {} ORDER BY id LIMIT {}",
                Self::text("consumer"),
                Self::text("source"),
                Self::text("coordinates"),
                Self::text("destination"),
                Self::bigint("attempts"),
                Self::stored_ms("first_failed_at"),
                Self::abandoned_sql(&mut binds, age)?,
                binds.bind(self::limit(limit))?,
            );
            let rows = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                .fetch_all(pool)
                .await?;
            if rows.is_empty() {
                return Ok(0);
            }
            let mut abandoned = Vec::with_capacity(rows.len());
            for row in &rows {
                abandoned.push(Abandoned {
                    id: row.try_get(0)?,
                    consumer: row.try_get(1)?,
                    payload: row.try_get(2)?,
                    headers: row.try_get(3)?,
                    broker: row.try_get(4)?,
                    source: row.try_get(5)?,
                    coordinates: row.try_get(6)?,
                    destination: row.try_get(7)?,
                    attempts: row.try_get(8)?,
                    last_error: row.try_get(9)?,
                    first_failed_ms: row.try_get(10)?,
                });
            }
            let mut tx = pool.begin().await?;
            let mut buried = 0;
            for row in &abandoned {
                let mut binds = Binds::new();
                let sql = format!(
                    "DELETE FROM idem_parked WHERE id = {} AND {}",
                    binds.bind(row.id)?,
                    Self::abandoned_sql(&mut binds, age)?,
                );
                let deleted = sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                    .execute(&mut *tx)
                    .await?;
                if Self::rows_affected(&deleted) != 1 {
                    continue;
                }
                let error = row.last_error.as_deref().unwrap_or(NO_ERROR);
                let error_shape = shape(error);
                let group = group_of(&row.consumer, None, ABANDONED, &error_shape);
                let mut binds = Binds::new();
                let sql = format!(
                    "INSERT INTO idem_dead_letters (consumer, scope, msg_key, reason, error, \
                     error_shape, error_group, payload, headers, broker, source, coordinates, \
                     destination, attempts, first_failed_at, last_failed_at, state) \
                     VALUES ({}, NULL, NULL, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, \
                     'dead')",
                    binds.bind(row.consumer.as_str())?,
                    binds.bind(ABANDONED)?,
                    binds.bind(error)?,
                    binds.bind(error_shape.as_str())?,
                    binds.bind(group.as_str())?,
                    binds.bind(row.payload.as_slice())?,
                    binds.bind(row.headers.as_deref())?,
                    binds.bind(row.broker.as_str())?,
                    binds.bind(row.source.as_str())?,
                    binds.bind(row.coordinates.as_str())?,
                    binds.bind(row.destination.as_str())?,
                    binds.bind(i32::try_from(row.attempts.max(0)).unwrap_or(i32::MAX))?,
                    Self::at_ms(&binds.bind(row.first_failed_ms)?),
                    Self::now_stored(),
                );
                sqlx::query_with(sqlx::AssertSqlSafe(sql), binds.arguments)
                    .execute(&mut *tx)
                    .await?;
                buried += 1;
            }
            tx.commit().await?;
            Ok(buried)
        }
    }

    /// [`DeadLetterAdmin::recovery_counts`](crate::admin::DeadLetterAdmin::recovery_counts).
    fn recovery_counts<'a>(
        pool: &'a Pool<Self>,
    ) -> impl Future<Output = Result<RecoveryCounts, sqlx::Error>> + Send + 'a {
        async move {
            let parked = format!(
                "SELECT {}, COUNT(*), {}, {} FROM idem_parked GROUP BY consumer",
                Self::text("consumer"),
                Self::count_where(&format!("lease_until >= {}", Self::now_stored())),
                Self::stored_ms("MIN(due_at)"),
            );
            let parked: Vec<(String, i64, i64, Option<i64>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(parked))
                    .fetch_all(pool)
                    .await?;
            let dead = format!(
                "SELECT {}, {}, reason, COUNT(*) FROM idem_dead_letters WHERE state = 'dead' \
                 GROUP BY consumer, scope, reason",
                Self::text("consumer"),
                Self::text("scope"),
            );
            let dead: Vec<(String, Option<String>, String, i64)> =
                sqlx::query_as(sqlx::AssertSqlSafe(dead))
                    .fetch_all(pool)
                    .await?;
            let mut counts = RecoveryCounts {
                parked: parked
                    .into_iter()
                    .map(|(consumer, parked, held, oldest)| ParkedCounts {
                        consumer,
                        parked: count(parked),
                        held: count(held),
                        oldest_due_ms: oldest,
                    })
                    .collect(),
                dead: dead
                    .into_iter()
                    .map(|(consumer, scope, reason, dead)| DeadCounts {
                        consumer,
                        scope,
                        reason,
                        dead: count(dead),
                    })
                    .collect(),
            };
            // Sorted here: the databases order NULL (an unknown scope) each their own way.
            counts.parked.sort_by(|a, b| a.consumer.cmp(&b.consumer));
            counts.dead.sort_by(|a, b| {
                (&a.consumer, &a.scope, &a.reason).cmp(&(&b.consumer, &b.scope, &b.reason))
            });
            Ok(counts)
        }
    }
}

/// `impl DeadLetterAdmin for $db`, each method the [`DeadLetterSql`] method of its name.
macro_rules! dead_letter_admin {
    ($db:ty) => {
        impl $crate::backend::dead_letters::DeadLetterSql for $db {}

        impl $crate::admin::DeadLetterAdmin for $db {
            fn dead_letters_present(
                pool: &sqlx::Pool<Self>,
            ) -> impl std::future::Future<Output = Result<bool, sqlx::Error>> + Send + '_ {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::dead_letters_present(pool)
            }

            fn groups<'a>(
                pool: &'a sqlx::Pool<Self>,
                filter: &'a $crate::admin::DeadLetterFilter,
            ) -> impl std::future::Future<
                Output = Result<Vec<$crate::admin::DeadLetterGroup>, sqlx::Error>,
            > + Send
                   + 'a {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::groups(pool, filter)
            }

            fn list<'a>(
                pool: &'a sqlx::Pool<Self>,
                filter: &'a $crate::admin::DeadLetterFilter,
                page: $crate::admin::Page,
            ) -> impl std::future::Future<
                Output = Result<Vec<$crate::admin::DeadLetterInfo>, sqlx::Error>,
            > + Send
                   + 'a {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::list(pool, filter, page)
            }

            fn dead_letter(
                pool: &sqlx::Pool<Self>,
                id: i64,
            ) -> impl std::future::Future<
                Output = Result<Option<$crate::admin::DeadLetter>, sqlx::Error>,
            > + Send
                   + '_ {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::dead_letter(pool, id)
            }

            fn replay_to<'a>(
                pool: &'a sqlx::Pool<Self>,
                ids: &'a [i64],
                to: $crate::admin::ReplayTo,
            ) -> impl std::future::Future<
                Output = Result<Vec<$crate::admin::Replay>, sqlx::Error>,
            > + Send
                   + 'a {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::replay(pool, ids, to)
            }

            fn discard<'a>(
                pool: &'a sqlx::Pool<Self>,
                ids: &'a [i64],
            ) -> impl std::future::Future<Output = Result<u64, sqlx::Error>> + Send + 'a {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::discard(pool, ids)
            }

            fn purge_dead_letters(
                pool: &sqlx::Pool<Self>,
                retention: std::time::Duration,
                limit: u64,
            ) -> impl std::future::Future<Output = Result<u64, sqlx::Error>> + Send + '_ {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::purge_dead_letters(
                    pool, retention, limit,
                )
            }

            fn bury_abandoned(
                pool: &sqlx::Pool<Self>,
                retention: std::time::Duration,
                limit: u64,
            ) -> impl std::future::Future<Output = Result<u64, sqlx::Error>> + Send + '_ {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::bury_abandoned(
                    pool, retention, limit,
                )
            }

            fn recovery_counts(
                pool: &sqlx::Pool<Self>,
            ) -> impl std::future::Future<
                Output = Result<$crate::admin::RecoveryCounts, sqlx::Error>,
            > + Send
                   + '_ {
                <Self as $crate::backend::dead_letters::DeadLetterSql>::recovery_counts(pool)
            }
        }
    };
}
pub(crate) use dead_letter_admin;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked_before_a_replay() {
        assert_eq!(publishable_headers(None), Ok(None));
        assert_eq!(publishable_headers(Some("[]")), Ok(None));
        assert_eq!(
            publishable_headers(Some(r#"[["trace-id","t-1"]]"#)),
            Ok(Some(r#"[["trace-id","t-1"]]"#.to_string()))
        );
        assert!(publishable_headers(Some("{}"))
            .unwrap_err()
            .contains("[name, value] pairs"));
        assert!(publishable_headers(Some(r#"[["a b","v"]]"#))
            .unwrap_err()
            .contains("visible ASCII"));
    }

    #[test]
    fn unknown_states_are_errors_that_name_them() {
        assert_eq!(state_of("dead").unwrap(), DeadLetterState::Dead);
        let err = state_of("zombie").unwrap_err().to_string();
        assert!(err.contains("`zombie`"), "{err}");
    }
}
