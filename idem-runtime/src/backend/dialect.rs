//! What each database says its own way, and the statements whose text differs only by
//! placeholders, written once and numbered for each database at compile time.

use std::borrow::Cow;

use sqlx::{Database, Decode, Type};

use crate::store::StampRow;

/// How a database writes a statement's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placeholders {
    /// `?` for each, bound in order (SQLite, MySQL); MySQL cannot name one twice.
    Plain,
    /// `?1`, `?2`, …: SQLite, where a parameter is used twice.
    Question,
    /// `$1`, `$2`, … (PostgreSQL).
    Dollar,
}

impl Placeholders {
    /// The `n`th parameter (from 1).
    pub(crate) fn nth(self, n: usize) -> String {
        match self {
            Placeholders::Plain => "?".to_string(),
            Placeholders::Question => format!("?{n}"),
            Placeholders::Dollar => format!("${n}"),
        }
    }
}

/// A statement written once with `?` for each parameter, in each database's placeholders: the
/// text as written, and numbered `?1, ?2, …` and `$1, $2, …` at compile time ([`numbered`]).
/// Built by [`statement!`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Statement {
    /// `?` for each parameter.
    pub(crate) plain: &'static str,
    /// `?1`, `?2`, ….
    pub(crate) question: &'static str,
    /// `$1`, `$2`, ….
    pub(crate) dollar: &'static str,
}

impl Statement {
    /// The statement with `placeholders`.
    pub(crate) const fn with(self, placeholders: Placeholders) -> &'static str {
        match placeholders {
            Placeholders::Plain => self.plain,
            Placeholders::Question => self.question,
            Placeholders::Dollar => self.dollar,
        }
    }
}

/// The length of `sql` once [`numbered`].
pub(crate) const fn numbered_len(sql: &str) -> usize {
    let bytes = sql.as_bytes();
    let (mut len, mut n, mut at, mut quoted) = (0, 0, 0, false);
    while at < bytes.len() {
        if bytes[at] == b'\'' {
            quoted = !quoted;
        }
        if bytes[at] == b'?' && !quoted {
            n += 1;
            len += 1 + digits(n);
        } else {
            len += 1;
        }
        at += 1;
    }
    len
}

/// How many decimal digits `n` has.
const fn digits(mut n: usize) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// `sql` with its `n`th `?` outside quotes written `{sigil}{n}`: `LEN` is [`numbered_len`].
pub(crate) const fn numbered<const LEN: usize>(sql: &str, sigil: u8) -> [u8; LEN] {
    let bytes = sql.as_bytes();
    let mut out = [0u8; LEN];
    let (mut n, mut at, mut to, mut quoted) = (0, 0, 0, false);
    while at < bytes.len() {
        if bytes[at] == b'\'' {
            quoted = !quoted;
        }
        if bytes[at] == b'?' && !quoted {
            n += 1;
            out[to] = sigil;
            let width = digits(n);
            let mut rest = n;
            let mut digit = width;
            while digit > 0 {
                // A decimal digit: 0..=9 fits a u8.
                out[to + digit] = b'0' + (rest % 10) as u8;
                rest /= 10;
                digit -= 1;
            }
            to += 1 + width;
        } else {
            out[to] = bytes[at];
            to += 1;
        }
        at += 1;
    }
    out
}

/// `$sql` (a constant `&str`, `?` for each parameter) as a [`Statement`], numbered at compile
/// time: a constant, so that the checks below fail the build, never a run.
macro_rules! statement {
    ($sql:expr) => {{
        const PLAIN: &str = $sql;
        const LEN: usize = $crate::backend::dialect::numbered_len(PLAIN);
        const QUESTION: [u8; LEN] = $crate::backend::dialect::numbered::<LEN>(PLAIN, b'?');
        const DOLLAR: [u8; LEN] = $crate::backend::dialect::numbered::<LEN>(PLAIN, b'$');
        const STATEMENT: $crate::backend::dialect::Statement = $crate::backend::dialect::Statement {
            plain: PLAIN,
            question: match std::str::from_utf8(&QUESTION) {
                Ok(sql) => sql,
                Err(_) => panic!("a numbered statement is not UTF-8"),
            },
            dollar: match std::str::from_utf8(&DOLLAR) {
                Ok(sql) => sql,
                Err(_) => panic!("a numbered statement is not UTF-8"),
            },
        };
        STATEMENT
    }};
}
pub(crate) use statement;

/// The statements whose text differs between databases only by their placeholders, written
/// once.
pub(crate) mod text {
    use super::Statement;

    /// `Sql::run_migrations`: the version.
    pub(crate) const RECORD_MIGRATION: Statement =
        statement!("INSERT INTO idem_migrations (version) VALUES (?) ON CONFLICT DO NOTHING");
    /// `Sql::delete_record`: scope, key.
    pub(crate) const DELETE_RECORD: Statement =
        statement!("DELETE FROM idem_records WHERE scope = ? AND msg_key = ?");
    /// `Sql::release_lease`: scope, key, token.
    pub(crate) const RELEASE_LEASE: Statement = statement!(
        "DELETE FROM idem_records \
         WHERE scope = ? AND msg_key = ? AND lease_token = ? AND lease_until IS NOT NULL"
    );
    /// `Sql::save_stamp` on a record: fingerprint, result, scope, key.
    pub(crate) const SAVE_RECORD_STAMP: Statement = statement!(
        "UPDATE idem_records SET fingerprint = ?, result = ? WHERE scope = ? AND msg_key = ?"
    );
    /// `Sql::save_stamp` on a version row: fingerprint, result, scope, entity.
    pub(crate) const SAVE_VERSION_STAMP: Statement = statement!(
        "UPDATE idem_versions SET fingerprint = ?, result = ? WHERE scope = ? AND entity = ?"
    );
    /// `Sql::load_stamp` of a record: scope, key.
    pub(crate) const LOAD_RECORD_STAMP: Statement =
        statement!("SELECT fingerprint, result FROM idem_records WHERE scope = ? AND msg_key = ?");
    /// `Sql::load_stamp` of a version row: scope, entity.
    pub(crate) const LOAD_VERSION_STAMP: Statement =
        statement!("SELECT fingerprint, result FROM idem_versions WHERE scope = ? AND entity = ?");
    /// `Sql::load_attempts`: scope, key.
    pub(crate) const LOAD_ATTEMPTS: Statement =
        statement!("SELECT attempts FROM idem_attempts WHERE scope = ? AND msg_key = ?");
    /// `Sql::clear_attempts` and `Sql::forget_attempts`: scope, key.
    pub(crate) const CLEAR_ATTEMPTS: Statement =
        statement!("DELETE FROM idem_attempts WHERE scope = ? AND msg_key = ?");
    /// `Sql::claim_lease`, once its upsert found the record: scope, key.
    pub(crate) const LEASE_HELD: Statement = statement!(
        "SELECT lease_until IS NOT NULL FROM idem_records WHERE scope = ? AND msg_key = ?"
    );
    /// `Sql::behind`: scope, entity.
    pub(crate) const LATEST_VERSION: Statement =
        statement!("SELECT version FROM idem_versions WHERE scope = ? AND entity = ?");
    /// `Sql::forget`: scope, key.
    pub(crate) const FORGET: Statement = statement!(
        "DELETE FROM idem_records WHERE scope = ? AND msg_key = ? AND lease_until IS NULL"
    );
    /// `Sql::release`: scope, key.
    pub(crate) const RELEASE: Statement = statement!(
        "DELETE FROM idem_records WHERE scope = ? AND msg_key = ? AND lease_until IS NOT NULL"
    );
    /// What `Sql::forget` and `Sql::release` found: scope, key.
    pub(crate) const DONE: Statement =
        statement!("SELECT lease_until IS NULL FROM idem_records WHERE scope = ? AND msg_key = ?");
}

/// The statement that completes a lease, with `$now`: the database's clock as `processed_at`
/// holds it (binds: scope, key, token).
macro_rules! complete_lease {
    ($now:expr) => {
        concat!(
            "UPDATE idem_records SET lease_until = NULL, processed_at = ",
            $now,
            " WHERE scope = ? AND msg_key = ? AND lease_token = ? AND lease_until IS NOT NULL"
        )
    };
}
pub(crate) use complete_lease;

/// What a database's [`Store`](crate::store::Store) statements say their own way.
pub(crate) trait StoreDialect: Database {
    /// How its store statements write parameters.
    const PLACEHOLDERS: Placeholders;

    /// `Sql::save_stamp`'s statements, on a record and on a version row.
    const SAVE_STAMP: [&'static str; 2] = [
        text::SAVE_RECORD_STAMP.with(Self::PLACEHOLDERS),
        text::SAVE_VERSION_STAMP.with(Self::PLACEHOLDERS),
    ];

    /// `Sql::complete_lease`'s statement ([`complete_lease!`] with its clock).
    const COMPLETE_LEASE: &'static str;

    /// How the database types `idem_attempts.attempts` (an `INTEGER`).
    type Attempts: Into<i64> + for<'r> Decode<'r, Self> + Type<Self> + Send + Unpin;

    /// How many rows a statement changed (sqlx has no trait for it).
    fn rows_affected(result: &Self::QueryResult) -> u64;
}

/// The store statements of the databases that upsert with `ON CONFLICT` (SQLite, PostgreSQL):
/// `Sql` runs them alike, each in its database's text.
pub(crate) trait OnConflict: StoreDialect {
    /// The migrations, in order (`Sql::run_migrations`).
    const MIGRATIONS: &'static [(i64, &'static str)];
    /// The table of applied migrations (`idem_migrations`), created if missing.
    const MIGRATIONS_TABLE: &'static str;
    /// `Sql::claim_lease`'s upsert: scope, key, retention (ms), lease (ms), token.
    const CLAIM_LEASE: &'static str;
    /// `Sql::advance_version`'s conditional upsert: scope, entity, version.
    const ADVANCE_VERSION: &'static str;
    /// `Sql::count_attempt`'s upsert, returning the count: scope, key, error.
    const COUNT_ATTEMPT: &'static str;
    /// `Sql::purge_expired`'s delete: the limit.
    const PURGE_EXPIRED: &'static str;
    /// `Sql::purge_versions`'s delete: the age (ms), the limit.
    const PURGE_VERSIONS: &'static str;
}

/// What the databases that send a batch as `IN (?, ?, …)` lists and `VALUES` rows (SQLite,
/// MySQL; PostgreSQL binds arrays) say their own way.
pub(crate) trait InLists: OutboxDialect {
    /// The most rows (or keys) one statement carries, far below its limit of parameters.
    const ROWS_PER_STATEMENT: usize;
    /// The first pending rows of one partition (binds: the partition, how many), selected as
    /// [`RawRow`](crate::outbox::store::RawRow).
    const PARTITION_HEAD: &'static str;
    /// The stamps of `keys` keys read from `row`'s table, keyed by scope and key (two binds a
    /// key), as `(scope, key, fingerprint, result)`.
    fn stamps_select(row: StampRow, keys: usize) -> String;
}

/// What a database's operator queries ([`Admin`](crate::admin::Admin)) say their own way.
pub(crate) trait AdminDialect: StoreDialect {
    /// How its operator queries write parameters.
    const PARAMETERS: Placeholders;
    /// Now, in Unix epoch milliseconds, as an SQL expression.
    const NOW_MS: &'static str;
    /// The cast of a bound text that may be NULL, where the database needs its type.
    const NULLABLE_TEXT: &'static str = "";
    /// The time of a version row's last advance, as epoch milliseconds.
    const VERSION_UPDATED_MS: &'static str;
    /// The time of an attempt row's last failure, as epoch milliseconds.
    const ATTEMPT_UPDATED_MS: &'static str = Self::VERSION_UPDATED_MS;
    /// The query that tells whether each of `tables` exists.
    fn catalog(tables: &[&str]) -> Catalog;
    /// How a query that compares with now names it.
    fn now() -> Now;
    /// The `COUNT` of the rows where `condition` holds, as a BIGINT.
    fn count_where(condition: &str) -> String;
    /// `processed_at` (or an aggregate of it) as epoch milliseconds.
    fn processed_ms(expression: &str) -> String;
    /// A time column of idem's that SQLite and MySQL keep in epoch milliseconds (`expires_at`,
    /// `lease_until`, `created_at`, or an aggregate of one) as epoch milliseconds.
    fn stored_ms(expression: &str) -> String {
        expression.to_string()
    }
    /// An integer expression as a BIGINT.
    fn bigint(expression: &str) -> String {
        expression.to_string()
    }

    // The operator's statements, written once from the parts above. A filter's value
    // (`optional`) is bound first, as `Sql::filter_arguments` binds it, then the others.

    /// `column IS NULL OR …` of a bound, optional value.
    fn optional(column: &str) -> String {
        let p = Self::PARAMETERS.nth(1);
        format!("{p}{} IS NULL OR {column} = {p}", Self::NULLABLE_TEXT)
    }

    /// `Admin::stats`: the records' counts by scope, then the version rows', both filtered.
    fn stats_sql() -> (String, String) {
        let Now { with, from, at } = Self::now();
        let records = format!(
            "{with}SELECT scope, COUNT(*), {}, {}, {}, {}, {} FROM idem_records{from} \
             WHERE {} GROUP BY scope",
            Self::count_where(&format!("lease_until >= {at}")),
            Self::count_where(&format!("lease_until < {at}")),
            Self::count_where(&format!(
                "expires_at < {at} AND (lease_until IS NULL OR lease_until < {at})"
            )),
            Self::processed_ms("MIN(processed_at)"),
            Self::processed_ms("MAX(processed_at)"),
            Self::optional("scope"),
        );
        let versions = format!(
            "SELECT scope, COUNT(*) FROM idem_versions WHERE {} GROUP BY scope",
            Self::optional("scope")
        );
        (records, versions)
    }

    /// `Admin::scope_known`: the scope, as a filter's value.
    fn scope_known_sql() -> String {
        let p = Self::PARAMETERS.nth(1);
        format!(
            "SELECT EXISTS (SELECT 1 FROM idem_records WHERE scope = {p}) \
             OR EXISTS (SELECT 1 FROM idem_versions WHERE scope = {p})"
        )
    }

    /// `Admin::record`: scope, key.
    fn record_sql() -> String {
        format!(
            "SELECT {}, {}, {} FROM idem_records WHERE scope = {} AND msg_key = {}",
            Self::processed_ms("processed_at"),
            Self::stored_ms("expires_at"),
            Self::stored_ms("lease_until"),
            Self::PARAMETERS.nth(1),
            Self::PARAMETERS.nth(2),
        )
    }

    /// `Admin::version`: scope, entity.
    fn version_sql() -> String {
        format!(
            "SELECT version, {} FROM idem_versions WHERE scope = {} AND entity = {}",
            Self::VERSION_UPDATED_MS,
            Self::PARAMETERS.nth(1),
            Self::PARAMETERS.nth(2),
        )
    }

    /// `Admin::count_expired`.
    fn count_expired_sql() -> String {
        let Now { with, from, at } = Self::now();
        format!(
            "{with}SELECT COUNT(*) FROM idem_records{from} \
             WHERE expires_at < {at} AND (lease_until IS NULL OR lease_until < {at})"
        )
    }

    /// `Admin::attempts`: the scope filter's value, then the limit.
    fn attempts_sql() -> String {
        format!(
            "SELECT scope, msg_key, {}, last_error, {} FROM idem_attempts WHERE {} \
             ORDER BY attempts DESC, scope, msg_key LIMIT {}",
            Self::bigint("attempts"),
            Self::ATTEMPT_UPDATED_MS,
            Self::optional("scope"),
            Self::PARAMETERS.nth(2),
        )
    }
}

/// How a database answers whether tables exist.
pub(crate) enum Catalog {
    /// A query of how many of them exist.
    Count(String),
    /// A query of whether all of them exist.
    Present(String),
}

/// `= 'a'` or `IN ('a', 'b')`: a catalog's test of a table name.
pub(crate) fn named(tables: &[&str]) -> String {
    match tables {
        [one] => format!("= '{one}'"),
        _ => {
            let names: Vec<String> = tables.iter().map(|t| format!("'{t}'")).collect();
            format!("IN ({})", names.join(", "))
        }
    }
}

/// How a query reads the database's now once: a `WITH` before it and a table after its `FROM`
/// (or nothing), and the expression that names it.
pub(crate) struct Now {
    /// Before the `SELECT` (`WITH now(ms) AS (…) `), or empty.
    pub(crate) with: String,
    /// After `FROM idem_records` (`, now`), or empty.
    pub(crate) from: String,
    /// Now in the statement (`now.ms`, `now()`).
    pub(crate) at: &'static str,
}

/// What a database's outbox statements say their own way.
pub(crate) trait OutboxDialect: AdminDialect {
    /// `Sql::insert_outbox`'s insert: id, destination, partition key, partition, payload,
    /// headers.
    const INSERT_OUTBOX: &'static str;
    /// `Sql::purge_sent`'s delete: the age (ms), the limit.
    const PURGE_SENT: &'static str;
    /// The partitions with a pending row whose time has come (`Sql::pending_partitions`
    /// binds the limit).
    const PENDING_PARTITIONS: &'static str;
    /// A text column as the database returns it as text (MySQL's binary `destination`).
    fn text(column: &str) -> String {
        column.to_string()
    }
    /// The aggregate `function` of `column` over the rows where `condition` holds.
    fn aggregate_where(function: &str, column: &str, condition: &str) -> String {
        format!("{function}(CASE WHEN {condition} THEN {column} END)")
    }
    /// The last error of each destination's most-failed pending message, from the pending
    /// rows that failed and pass `filter` (binds: the filter's).
    fn last_errors(filter: &str) -> String;
    /// `OutboxAdmin::outbox_stats`: each destination's counts, then the last error of its
    /// most-failed pending message, both filtered by destination.
    fn outbox_stats_sql() -> (String, String) {
        let pending = "sent_at IS NULL";
        let counts = format!(
            "SELECT {}, {}, {}, {}, {}, {} FROM idem_outbox WHERE {} \
             GROUP BY destination ORDER BY destination",
            Self::text("destination"),
            Self::count_where(pending),
            Self::stored_ms(&Self::aggregate_where("MIN", "created_at", pending)),
            Self::count_where("sent_at IS NULL AND attempts > 0"),
            Self::bigint(&format!(
                "COALESCE({}, 0)",
                Self::aggregate_where("MAX", "attempts", pending)
            )),
            Self::count_where("sent_at IS NOT NULL"),
            Self::optional("destination"),
        );
        (counts, Self::last_errors(&Self::optional("destination")))
    }

    /// `OutboxAdmin::outbox_backlog`: each destination's pending rows and the oldest one's
    /// time, from the pending rows alone (migration 5's index covers it).
    fn outbox_backlog_sql() -> String {
        format!(
            "SELECT {}, COUNT(*), {} FROM idem_outbox WHERE sent_at IS NULL \
             GROUP BY destination ORDER BY destination",
            Self::text("destination"),
            Self::stored_ms("MIN(created_at)"),
        )
    }

    /// What `Sql::mark_failed` writes of an error.
    fn failure(error: &str) -> Cow<'_, str> {
        Cow::Borrowed(error)
    }
}

/// The last error of each destination's most-failed pending message, ranked by a window:
/// `OutboxDialect::last_errors` where a derived table takes `alias` (`""` or ` name`).
pub(crate) fn ranked_last_errors<DB: OutboxDialect>(filter: &str, alias: &str) -> String {
    format!(
        "SELECT {}, last_error FROM (SELECT destination, last_error, \
         ROW_NUMBER() OVER (PARTITION BY destination ORDER BY attempts DESC, seq) AS n \
         FROM idem_outbox WHERE sent_at IS NULL AND attempts > 0 \
         AND ({filter})){alias} WHERE n = 1",
        DB::text("destination")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_numbered_at_compile_time() {
        const SQL: Statement =
            statement!("SELECT '?', a FROM t WHERE a = ? AND b IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
        assert_eq!(
            SQL.with(Placeholders::Plain),
            "SELECT '?', a FROM t WHERE a = ? AND b IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        );
        assert_eq!(
            SQL.with(Placeholders::Question),
            "SELECT '?', a FROM t WHERE a = ?1 AND b IN (?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        );
        assert_eq!(
            SQL.with(Placeholders::Dollar),
            "SELECT '?', a FROM t WHERE a = $1 AND b IN ($2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
        );
        assert_eq!(Placeholders::Dollar.nth(12), "$12");
        assert_eq!(Placeholders::Plain.nth(12), "?");
    }

    #[test]
    fn a_catalog_names_one_table_or_a_list() {
        assert_eq!(named(&["a"]), "= 'a'");
        assert_eq!(named(&["a", "b"]), "IN ('a', 'b')");
    }
}
