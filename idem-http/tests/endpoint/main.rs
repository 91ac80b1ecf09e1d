//! Idempotent endpoints against a real axum server on a local port and a real HTTP client, on
//! SQLite, PostgreSQL and MariaDB: the draft's cases (`draft`), concurrency (`races`), lease
//! mode (`lease`), a server killed between its commit and its response (`crash`), and the
//! metrics (`observed`).

mod crash;
mod draft;
mod lease;
mod observed;
mod races;
mod support;
