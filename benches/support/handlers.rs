//! The `#[idempotent]` handlers under measurement, for each backend: the same code, with `Db`
//! the backend's sqlx database. The business effect is one UPDATE of `bench_accounts`.

use idem::Outcome;

/// Counts an idem result: applied, or skipped (duplicate / stale); an error stops the bench.
pub fn tally<E: std::error::Error + Send + Sync + 'static>(
    result: Result<Outcome<()>, idem::Error<E>>,
    counts: &mut (u64, u64),
) -> anyhow::Result<()> {
    match result? {
        Outcome::Applied(()) => counts.0 += 1,
        _ => counts.1 += 1,
    }
    Ok(())
}

macro_rules! handlers {
    ($db:ty) => {
        handlers!(
            $db,
            "UPDATE bench_accounts SET balance = balance + $1 WHERE id = $2"
        );
    };
    ($db:ty, $effect:literal) => {
        use idem::{idempotent, Tx};

        use crate::support::workload::Credit;

        pub type Db = $db;

        /// The business effect: one UPDATE.
        pub async fn effect(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
            sqlx::query($effect)
                .bind(msg.amount)
                .bind(msg.account)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// (3) key only.
        #[idempotent(key = "msg.id", scope = "bench::credit")]
        pub async fn credit_key(tx: &mut Tx<'_, Db>, msg: &Credit) -> Result<(), sqlx::Error> {
            effect(tx, msg).await
        }

        /// (4) key + version + entity.
        #[idempotent(
            key = "msg.id",
            version = "msg.version",
            entity = "msg.account",
            scope = "bench::credit_versioned"
        )]
        pub async fn credit_versioned(
            tx: &mut Tx<'_, Db>,
            msg: &Credit,
        ) -> Result<(), sqlx::Error> {
            effect(tx, msg).await
        }
    };
}

pub mod sq {
    handlers!(sqlx::Sqlite);
}

pub mod pg {
    handlers!(sqlx::Postgres);
}

#[cfg(feature = "mysql")]
pub mod my {
    handlers!(
        sqlx::MySql,
        "UPDATE bench_accounts SET balance = balance + ? WHERE id = ?"
    );
}
