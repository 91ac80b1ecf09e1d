//! PostgreSQL: many consumer processes on many machines share one database.

mod admin;
mod outbox;
mod store;
