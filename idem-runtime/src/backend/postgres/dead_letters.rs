//! PostgreSQL's dead letters, where the recovery tables keep `TIMESTAMPTZ`: bound times are
//! converted from epoch milliseconds, and a bounded delete skips rows another session holds.

use sqlx::Postgres;

use crate::backend::dead_letters::{dead_letter_admin, DeadLetterDialect};

impl DeadLetterDialect for Postgres {
    fn at_ms(param: &str) -> String {
        format!("to_timestamp({param}::BIGINT / 1000.0)")
    }

    fn now_stored() -> String {
        "now()".to_string()
    }

    fn ago(param: &str) -> String {
        format!("(now() - {param} * interval '1 millisecond')")
    }

    fn delete_first(table: &str, condition: &str, order: &str, limit: &str) -> String {
        format!(
            "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {condition} \
             ORDER BY {order} LIMIT {limit} FOR UPDATE SKIP LOCKED)"
        )
    }
}

dead_letter_admin!(Postgres);
