//! Parked retries and dead letters on PostgreSQL. Times are `TIMESTAMPTZ` of the server's clock
//! (`now()`), read back as epoch milliseconds. Consumers on many machines take due rows with
//! `FOR UPDATE SKIP LOCKED`, so two of them never take the same row, nor wait on each other.

use sqlx::Postgres;

use crate::backend::recovery::{recovery_store, RecoveryDialect, RecoverySql};

impl RecoveryDialect for Postgres {
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";

    fn later(param: &str) -> String {
        format!("now() + {param} * INTERVAL '1 millisecond'")
    }

    /// Exact to the millisecond.
    fn at_or_now(param: &str) -> String {
        format!("COALESCE(TIMESTAMPTZ 'epoch' + {param} * INTERVAL '1 millisecond', now())")
    }
}

impl RecoverySql for Postgres {}

recovery_store!(Postgres);
