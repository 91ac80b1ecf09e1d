//! MySQL's dead letters: times are epoch milliseconds of the server's UTC clock, as the
//! dialect's defaults write them, and a bounded delete is `DELETE … ORDER BY … LIMIT` on the
//! table itself (MySQL cannot delete from a table its subquery reads).

use sqlx::MySql;

use crate::backend::dead_letters::{dead_letter_admin, DeadLetterDialect};

impl DeadLetterDialect for MySql {
    fn delete_first(table: &str, condition: &str, order: &str, limit: &str) -> String {
        format!("DELETE FROM {table} WHERE {condition} ORDER BY {order} LIMIT {limit}")
    }
}

dead_letter_admin!(MySql);
