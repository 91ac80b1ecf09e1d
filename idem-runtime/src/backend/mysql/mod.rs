//! MySQL / MariaDB (InnoDB).

mod admin;
mod outbox;
mod store;

pub use store::use_returning;
