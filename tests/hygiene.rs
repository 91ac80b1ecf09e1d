//! The code `#[idempotent]` generates uses absolute paths and names of its own: it compiles and
//! behaves beside user items that shadow `core`, `idem`, `Result`, `Ok`, `Box` and the like,
//! beside imported traits whose methods share names with its calls (`tracing::Instrument`), in a
//! module without the prelude, and beside parameters named like its internal variables.
//!
//! The crate denies every rustc warning and every clippy lint, pedantic ones included, so
//! `cargo clippy --all-targets` fails if the expansion triggers one in user code.
#![cfg(feature = "sqlite")]
#![deny(warnings, clippy::all, clippy::pedantic)]

use sqlx::sqlite::SqlitePoolOptions;
use sqlx::SqlitePool;

/// One connection, so that every handler and assertion sees the same in-memory database.
async fn pool() -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::query("CREATE TABLE effects (handler TEXT NOT NULL, id INTEGER NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

async fn effects(pool: &SqlitePool, handler: &str) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM effects WHERE handler = ? ORDER BY rowid")
        .bind(handler)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Shadows every name the expansion could reach for without an absolute path.
#[allow(dead_code, non_snake_case)]
mod shadowed {
    // Dummy modules named like the crates the expansion refers to: only `::core` and `::idem`
    // reach the real ones.
    mod core {}
    mod idem {}
    mod sqlx {}
    mod __private {}

    pub struct Box;
    pub struct Some;
    pub struct Option;
    pub struct Claim;
    pub struct Begun;
    pub fn Ok() {}
    pub fn Err() {}
    pub fn drop() {}

    // Traits a user imports whose methods are named like those the expansion calls: a trait
    // method taking `self` by value would win over an inherent one taking `&self`.
    #[allow(unused_imports)]
    use ::futures_util::FutureExt as _;
    #[allow(unused_imports)]
    use ::tracing::Instrument as _;

    /// The crate's own error and `Result`.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Refused;
    pub type Result<T> = ::core::result::Result<T, Refused>;

    pub struct Msg {
        pub id: i64,
        pub version: i64,
        pub order: i64,
    }

    /// Key only; the body writes through the transaction and uses `?`.
    #[::idem::idempotent(key = "msg.id", scope = "hygiene::record")]
    pub async fn record(tx: &mut ::idem::Tx<'_, ::sqlx::Sqlite>, msg: &Msg) -> Result<i64> {
        ::sqlx::query("INSERT INTO effects VALUES ('record', ?)")
            .bind(msg.id)
            .execute(&mut **tx)
            .await
            .map_err(|_| Refused)?;
        if msg.id < 0 {
            return ::core::result::Result::Err(Refused);
        }
        ::core::result::Result::Ok(msg.id)
    }

    /// Key, version and entity, with parameters named like the expansion's own variables.
    #[::idem::idempotent(
        key = "__idem_claim.id",
        version = "__idem_claim.version",
        entity = "__idem_claim.order",
        scope = "hygiene::versioned"
    )]
    pub async fn versioned(
        __idem_tx: &mut ::idem::Tx<'_, ::sqlx::Sqlite>,
        __idem_claim: &Msg,
    ) -> Result<()> {
        let __idem_result = __idem_claim.id;
        ::sqlx::query("INSERT INTO effects VALUES ('versioned', ?)")
            .bind(__idem_result)
            .execute(&mut **__idem_tx)
            .await
            .map_err(|_| Refused)?;
        ::core::result::Result::Ok(())
    }

    pub struct Consumer {
        pub prefix: i64,
    }

    impl Consumer {
        /// A method with the default scope.
        #[::idem::idempotent(key = "self.prefix + id")]
        pub async fn on_id(&self, tx: &mut ::idem::Tx<'_, ::sqlx::Sqlite>, id: i64) -> Result<()> {
            ::sqlx::query("INSERT INTO effects VALUES ('method', ?)")
                .bind(self.prefix + id)
                .execute(&mut **tx)
                .await
                .map_err(|_| Refused)?;
            ::core::result::Result::Ok(())
        }
    }
}

/// A module without the prelude: the expansion may not rely on it either.
#[no_implicit_prelude]
mod no_prelude {
    #[::idem::idempotent(key = "id", scope = "hygiene::no_prelude")]
    pub async fn bare(
        tx: &mut ::idem::Tx<'_, ::sqlx::Sqlite>,
        id: i64,
    ) -> ::core::result::Result<(), ::sqlx::Error> {
        ::sqlx::query("INSERT INTO effects VALUES ('no_prelude', ?)")
            .bind(id)
            .execute(&mut **tx)
            .await?;
        ::core::result::Result::Ok(())
    }
}

#[tokio::test]
async fn key_only_handler_beside_shadowed_names() {
    use idem::Outcome;
    let pool = pool().await;
    let msg = shadowed::Msg {
        id: 7,
        version: 1,
        order: 1,
    };
    assert_eq!(
        shadowed::record(&pool, &msg).await.unwrap(),
        Outcome::Applied(7)
    );
    assert_eq!(
        shadowed::record(&pool, &msg).await.unwrap(),
        Outcome::Duplicate
    );
    let refused = shadowed::Msg { id: -1, ..msg };
    assert!(matches!(
        shadowed::record(&pool, &refused).await,
        Err(idem::Error::Handler(shadowed::Refused))
    ));
    // The refused delivery rolled back its own insert.
    assert_eq!(effects(&pool, "record").await, [7]);
}

#[tokio::test]
async fn internal_names_do_not_capture_the_users() {
    use idem::Outcome;
    let pool = pool().await;
    let msg = |id, version| shadowed::Msg {
        id,
        version,
        order: 1,
    };
    let run = |m| {
        let pool = pool.clone();
        async move { shadowed::versioned(&pool, &m).await.unwrap() }
    };
    assert_eq!(run(msg(1, 5)).await, Outcome::Applied(()));
    assert_eq!(run(msg(1, 5)).await, Outcome::Duplicate);
    assert_eq!(run(msg(2, 4)).await, Outcome::Stale { latest: 5 });
    assert_eq!(run(msg(3, 6)).await, Outcome::Applied(()));
    assert_eq!(effects(&pool, "versioned").await, [1, 3]);
}

#[tokio::test]
async fn methods_and_modules_without_prelude() {
    use idem::Outcome;
    let pool = pool().await;
    let consumer = shadowed::Consumer { prefix: 100 };
    assert_eq!(
        consumer.on_id(&pool, 1).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(consumer.on_id(&pool, 1).await.unwrap(), Outcome::Duplicate);
    assert_eq!(
        no_prelude::bare(&pool, 1).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        no_prelude::bare(&pool, 1).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(effects(&pool, "method").await, [101]);
    assert_eq!(effects(&pool, "no_prelude").await, [1]);
    // A caller's transaction: the handler's effect commits with the caller's.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        no_prelude::bare(&mut tx, 2).await.unwrap(),
        Outcome::Applied(())
    );
    tx.rollback().await.unwrap();
    assert_eq!(effects(&pool, "no_prelude").await, [1]);
    assert_eq!(
        no_prelude::bare(&pool, 2).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(effects(&pool, "no_prelude").await, [1, 2]);
}
