//! MySQL's operator queries, where `expires_at`, `lease_until` and `updated_ms` are epoch
//! milliseconds and `processed_at` is a DATETIME(6) in UTC.

use sqlx::MySql;

use crate::admin::Admin;
use crate::backend::sql::sql_methods;
use crate::backend::{named, AdminDialect, Catalog, Now, Placeholders};

impl AdminDialect for MySql {
    const PARAMETERS: Placeholders = Placeholders::Plain;
    const NOW_MS: &'static str = now_ms!();
    const VERSION_UPDATED_MS: &'static str = "updated_ms";

    fn catalog(tables: &[&str]) -> Catalog {
        // In the connection's current database, where idem's own queries look.
        Catalog::Count(format!(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() \
             AND table_name {}",
            named(tables)
        ))
    }

    fn now() -> Now {
        Now {
            with: String::new(),
            from: format!(", (SELECT {} AS ms) now", now_ms!()),
            at: "now.ms",
        }
    }

    fn count_where(condition: &str) -> String {
        // COUNT of a CASE without ELSE counts the rows it holds for: a BIGINT, where SUM would
        // be a DECIMAL.
        format!("COUNT(CASE WHEN {condition} THEN 1 END)")
    }

    fn processed_ms(expression: &str) -> String {
        format!(datetime_ms!("{}"), expression)
    }

    fn bigint(expression: &str) -> String {
        format!("CAST({expression} AS SIGNED)")
    }
}

impl Admin for MySql {
    sql_methods!(admin);
}
