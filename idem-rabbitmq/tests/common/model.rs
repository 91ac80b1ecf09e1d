//! The order-events handlers, their tables and the check against the oracle, once per backend.

pub mod sqlite {
    pub type Db = sqlx::Sqlite;
    include!("handlers.rs");
}

pub mod postgres {
    pub type Db = sqlx::Postgres;
    include!("handlers.rs");
}
