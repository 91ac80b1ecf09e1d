//! Property tests: random delivery streams, with duplicates, reordering and several concurrent
//! workers, against an oracle that applies each message exactly once in version order.
//!
//! The same properties run on SQLite (a file in WAL mode) and on PostgreSQL (a schema of its own).
//! The body is `tests/reliability/props.rs`, included once per backend with its own `Db`.
//!
//! `PROPTEST_CASES` sets the cases per property (default 32), `IDEM_PROPTEST_SEED` replays a run:
//! a failure prints its seed and the shrunk stream.

mod common;

/// The proptest runner of these tests: modest case counts, a printed seed, no persistence files.
mod runner {
    use proptest::strategy::Strategy;
    use proptest::test_runner::{
        Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
    };

    pub fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(32)
    }

    /// Runs `test` on `cases()` values of `strategy`; on failure panics with the seed and the
    /// shrunk value, printed with its `Debug`.
    pub fn check<S: Strategy>(
        name: &str,
        strategy: S,
        test: impl Fn(S::Value) -> Result<(), TestCaseError>,
    ) where
        S::Value: std::fmt::Debug,
    {
        let seed: u64 = std::env::var("IDEM_PROPTEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        let mut bytes = [0_u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases: cases(),
            max_shrink_iters: 1000,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
        let mut runner = TestRunner::new_with_rng(config, rng);
        match runner.run(&strategy, test) {
            Ok(()) => {}
            Err(TestError::Fail(reason, value)) => panic!(
                "{name}: property failed (replay with IDEM_PROPTEST_SEED={seed})\n\
                 reason: {reason}\nshrunk input: {value:?}"
            ),
            Err(TestError::Abort(reason)) => {
                panic!("{name}: aborted (IDEM_PROPTEST_SEED={seed}): {reason}")
            }
        }
    }
}

mod sqlite {
    type Db = sqlx::Sqlite;

    async fn database() -> Option<sqlx::Pool<Db>> {
        Some(crate::common::sqlite().await)
    }

    async fn release(pool: sqlx::Pool<Db>) {
        pool.close().await;
    }

    include!("reliability/props.rs");
}

#[cfg(feature = "postgres")]
mod postgres {
    type Db = sqlx::Postgres;

    async fn database() -> Option<sqlx::Pool<Db>> {
        crate::common::postgres().await
    }

    async fn release(pool: sqlx::Pool<Db>) {
        crate::common::drop_postgres(pool).await;
    }

    include!("reliability/props.rs");
}
