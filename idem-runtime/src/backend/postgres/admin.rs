//! PostgreSQL's operator queries, where every time is a `TIMESTAMPTZ`.

use sqlx::Postgres;

use crate::admin::Admin;
use crate::backend::sql::sql_methods;
use crate::backend::{AdminDialect, Catalog, Now, Placeholders};

impl AdminDialect for Postgres {
    const PARAMETERS: Placeholders = Placeholders::Dollar;
    const NOW_MS: &'static str = ms!("now()");
    const NULLABLE_TEXT: &'static str = "::TEXT";
    const VERSION_UPDATED_MS: &'static str = ms!("updated_at");

    fn catalog(tables: &[&str]) -> Catalog {
        // to_regclass follows the search_path, as idem's own queries do.
        let present: Vec<String> = tables
            .iter()
            .map(|table| format!("to_regclass('{table}') IS NOT NULL"))
            .collect();
        Catalog::Present(format!("SELECT {}", present.join(" AND ")))
    }

    fn now() -> Now {
        Now {
            with: String::new(),
            from: String::new(),
            at: "now()",
        }
    }

    fn count_where(condition: &str) -> String {
        format!("COUNT(*) FILTER (WHERE {condition})")
    }

    fn processed_ms(expression: &str) -> String {
        format!(ms!("{}"), expression)
    }

    fn stored_ms(expression: &str) -> String {
        format!(ms!("{}"), expression)
    }

    fn bigint(expression: &str) -> String {
        format!("{expression}::BIGINT")
    }
}

impl Admin for Postgres {
    sql_methods!(admin);
}
