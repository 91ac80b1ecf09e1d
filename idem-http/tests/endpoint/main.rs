//! Idempotent endpoints against a real axum server on a local port and a real HTTP client, on
//! SQLite, PostgreSQL and MariaDB: the draft's cases (`draft`), concurrency (`races`), lease
//! mode (`lease`), and a server killed between its commit and its response (`crash`).

mod crash;
mod draft;
mod lease;
mod races;
mod support;
