//! SQLite: the embedded default (a file in WAL mode, or memory).

mod admin;
mod clock;
mod outbox;
mod store;
