//! The SQL of the suite's own business tables (accounts, orders, audit rows), which differs across
//! databases: placeholders, the type of a text primary key, upserts, `RETURNING`, and how to fill
//! `idem_records` with many rows for the retention rules.
//!
//! idem's own tables are the backend's business; these are the suite's, so a backend supplies
//! its dialect with [`Backend::dialect`](crate::Backend::dialect). The suite writes its SQL with
//! `$1, $2, …` placeholders, each used once and in order, and [`Dialect::sql`] rewrites them.

/// How a database writes bind parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placeholders {
    /// `$1, $2, …` (PostgreSQL; SQLite accepts them too).
    Dollar,
    /// `?` for each parameter, in order (MySQL, MariaDB; SQLite too).
    Question,
}

/// How a database writes "insert, or update the row with this key".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upsert {
    /// `ON CONFLICT (key) DO UPDATE SET col = excluded.col` (PostgreSQL, SQLite 3.24+).
    OnConflict,
    /// `ON DUPLICATE KEY UPDATE col = VALUES(col)` (MySQL, MariaDB).
    OnDuplicateKey,
}

/// What an upsert does to a column of the existing row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    /// Takes the new row's value.
    New,
    /// Adds the new row's value to the stored one.
    Add,
}

/// One bind parameter of [`FillRecords::sql`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// How many records to insert (an `i64`).
    Count,
    /// Their scope (text).
    Scope,
    /// In how many days their retention ends (an `i64`; negative: already expired).
    Days,
}

/// The SQL that inserts N records of one scope into `idem_records`, all expiring a number of
/// days from now (keys `k1`, `k2`, … as bytes): the retention rules purge 100,000 of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillRecords {
    /// The statement, with placeholders in the dialect's own style (not rewritten).
    pub sql: &'static str,
    /// What each placeholder of `sql` binds, in order.
    pub binds: &'static [Fill],
}

/// The business-table SQL of one database. Build one with [`Dialect::sqlite`],
/// [`Dialect::postgres`] or [`Dialect::mysql`], and change a field where your database differs
/// (the fields are public, so a third-party backend needs no change to the kit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dialect {
    /// How bind parameters are written.
    pub placeholders: Placeholders,
    /// The column type of a text primary key (`TEXT`; MySQL needs a length: `VARCHAR(191)`).
    pub key_type: &'static str,
    /// How an upsert is written.
    pub upsert: Upsert,
    /// Whether `INSERT … RETURNING col` works; without it the suite reads the row back with a
    /// `SELECT` in the same transaction.
    pub returning: bool,
    /// How to fill `idem_records` for the retention rules in one statement. `None`: the suite
    /// fills through the backend's own `Store::insert_records` instead (slower, but it needs to
    /// know nothing of how the backend stores times).
    pub fill_records: Option<FillRecords>,
    /// How a time column of idem's tables reads as epoch milliseconds (a `BIGINT`), `{}`
    /// standing for the column: `{}` where idem stores epoch milliseconds (SQLite, MySQL), a
    /// conversion where it stores timestamps (PostgreSQL). The recovery rules read `due_at`,
    /// `lease_until` and the failure times with it.
    pub stored_ms: &'static str,
}

/// The digits 0 to 9 as a derived table of column `d`, then `$rest` (its name, …): MySQL's
/// fill cross-joins six of them.
macro_rules! digits {
    ($rest:literal) => {
        concat!(
            "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
              UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 \
              UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) ",
            $rest
        )
    };
}

impl Dialect {
    /// SQLite: `$n` placeholders, `ON CONFLICT`, `RETURNING`; times in epoch milliseconds.
    pub const fn sqlite() -> Dialect {
        Dialect {
            placeholders: Placeholders::Dollar,
            key_type: "TEXT",
            upsert: Upsert::OnConflict,
            returning: true,
            fill_records: Some(FillRecords {
                sql:
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
                      INSERT INTO idem_records (scope, msg_key, expires_at) \
                      SELECT $2, CAST('k' || i AS BLOB), \
                      CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + $3 * 86400000 \
                      FROM n",
                binds: &[Fill::Count, Fill::Scope, Fill::Days],
            }),
            stored_ms: "{}",
        }
    }

    /// PostgreSQL: `$n` placeholders, `ON CONFLICT`, `RETURNING`; times are `timestamptz`.
    pub const fn postgres() -> Dialect {
        Dialect {
            fill_records: Some(FillRecords {
                sql: "INSERT INTO idem_records (scope, msg_key, expires_at) \
                      SELECT $2, convert_to('k' || i, 'UTF8'), now() + $3 * interval '1 day' \
                      FROM generate_series(1, $1) AS i",
                binds: &[Fill::Count, Fill::Scope, Fill::Days],
            }),
            stored_ms: "(EXTRACT(EPOCH FROM {}) * 1000)::BIGINT",
            ..Dialect::sqlite()
        }
    }

    /// MySQL 8 and MariaDB 10.5+: `?` placeholders, `VARCHAR(191)` keys (a utf8mb4 index fits),
    /// `ON DUPLICATE KEY UPDATE`, no `RETURNING`. The fill assumes `expires_at` is a
    /// `DATETIME(6)` (checked on MariaDB 10.11); a backend that stores epoch milliseconds replaces
    /// `fill_records`, or sets it to `None`. It builds the numbers by cross-joining digits (up to
    /// 1,000,000), since MySQL caps recursive CTEs at 1,000 rows by default. `stored_ms` assumes
    /// epoch milliseconds, as idem's own MySQL backend stores the times of its recovery tables.
    pub const fn mysql() -> Dialect {
        Dialect {
            placeholders: Placeholders::Question,
            key_type: "VARCHAR(191)",
            upsert: Upsert::OnDuplicateKey,
            returning: false,
            fill_records: Some(FillRecords {
                sql: concat!(
                    "INSERT INTO idem_records (scope, msg_key, expires_at) \
                     SELECT ?, CAST(CONCAT('k', n.i) AS BINARY), \
                            TIMESTAMPADD(DAY, ?, UTC_TIMESTAMP(6)) \
                     FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d \
                                  + 100000 * g.d + 1 AS i \
                           FROM ",
                    digits!("a, "),
                    digits!("b, "),
                    digits!("c, "),
                    digits!("e, "),
                    digits!("f, "),
                    digits!("g) n "),
                    "WHERE n.i <= ?"
                ),
                binds: &[Fill::Scope, Fill::Days, Fill::Count],
            }),
            stored_ms: "{}",
        }
    }

    /// Rewrites the suite's `$1, $2, …` placeholders (each used once, in order) into this
    /// dialect's. `$` never appears in the suite's SQL otherwise (values are always bound).
    pub fn sql(&self, sql: &str) -> String {
        match self.placeholders {
            Placeholders::Dollar => sql.to_string(),
            Placeholders::Question => {
                let mut out = String::with_capacity(sql.len());
                let mut chars = sql.chars().peekable();
                let mut expected = 1;
                while let Some(c) = chars.next() {
                    if c != '$' {
                        out.push(c);
                        continue;
                    }
                    let mut n = String::new();
                    while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                        n.push(*d);
                        chars.next();
                    }
                    assert_eq!(
                        n.parse::<usize>().ok(),
                        Some(expected),
                        "the suite's SQL must use $1, $2, … once each, in order: {sql}"
                    );
                    expected += 1;
                    out.push('?');
                }
                out
            }
        }
    }

    /// `column`, a time column of idem's tables, read as epoch milliseconds
    /// ([`stored_ms`](Dialect::stored_ms)).
    pub fn ms(&self, column: &str) -> String {
        self.stored_ms.replace("{}", column)
    }

    /// `INSERT INTO table (columns) VALUES ($1, …)` that on a conflict of `key` updates `set`.
    /// Placeholders are the suite's (`$n`), to pass through [`sql`](Dialect::sql).
    pub fn upsert(
        &self,
        table: &str,
        columns: &[&str],
        key: &[&str],
        set: &[(&str, Set)],
    ) -> String {
        let values: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
        let new = |col: &str| match self.upsert {
            Upsert::OnConflict => format!("excluded.{col}"),
            Upsert::OnDuplicateKey => format!("VALUES({col})"),
        };
        let assignments: Vec<String> = set
            .iter()
            .map(|(col, how)| match how {
                Set::New => format!("{col} = {}", new(col)),
                Set::Add => format!("{col} = {table}.{col} + {}", new(col)),
            })
            .collect();
        let head = format!(
            "INSERT INTO {table} ({}) VALUES ({})",
            columns.join(", "),
            values.join(", ")
        );
        match self.upsert {
            Upsert::OnConflict => format!(
                "{head} ON CONFLICT ({}) DO UPDATE SET {}",
                key.join(", "),
                assignments.join(", ")
            ),
            Upsert::OnDuplicateKey => {
                format!("{head} ON DUPLICATE KEY UPDATE {}", assignments.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_placeholders_replace_dollar_ones_in_order() {
        let sql = Dialect::mysql().sql("SELECT a FROM t WHERE b = $1 AND c = $2");
        assert_eq!(sql, "SELECT a FROM t WHERE b = ? AND c = ?");
    }

    #[test]
    #[should_panic(expected = "once each, in order")]
    fn out_of_order_placeholders_are_a_bug_in_the_suite() {
        Dialect::mysql().sql("SELECT $2, $1");
    }

    #[test]
    fn times_read_as_epoch_milliseconds() {
        assert_eq!(Dialect::sqlite().ms("due_at"), "due_at");
        assert_eq!(Dialect::mysql().ms("due_at"), "due_at");
        assert_eq!(
            Dialect::postgres().ms("due_at"),
            "(EXTRACT(EPOCH FROM due_at) * 1000)::BIGINT"
        );
    }

    #[test]
    fn upserts_per_dialect() {
        let cols = ["id", "balance"];
        let set = [("balance", Set::Add)];
        assert_eq!(
            Dialect::postgres().upsert("accounts", &cols, &["id"], &set),
            "INSERT INTO accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET \
             balance = accounts.balance + excluded.balance"
        );
        let mysql = Dialect::mysql();
        assert_eq!(
            mysql.sql(&mysql.upsert("accounts", &cols, &["id"], &set)),
            "INSERT INTO accounts (id, balance) VALUES (?, ?) ON DUPLICATE KEY UPDATE \
             balance = accounts.balance + VALUES(balance)"
        );
    }
}
