//! PostgreSQL: many consumer processes on many machines share one database. Every time is a
//! `TIMESTAMPTZ` of the server's clock (`now()`); parameters are numbered (`$1`).

use sqlx::Postgres;

use super::sql::Sql;

/// A `TIMESTAMPTZ` expression as epoch milliseconds.
macro_rules! ms {
    ($column:expr) => {
        concat!("(EXTRACT(EPOCH FROM ", $column, ") * 1000)::BIGINT")
    };
}

mod admin;
mod dead_letters;
mod outbox;
mod recovery;
mod store;

impl Sql for Postgres {}
