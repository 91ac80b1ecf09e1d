//! Whether the server takes `INSERT … RETURNING` (MariaDB 10.5+), learned from the first
//! upsert that tries it.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::mysql::MySqlDatabaseError;

/// ER_PARSE_ERROR: the server does not know the statement's syntax (here: `RETURNING` on MySQL).
const ER_PARSE_ERROR: u16 = 1064;

/// Whether upserts may read their rows back with `RETURNING` (MariaDB 10.5+; MySQL has no
/// `INSERT ... RETURNING`): one statement instead of an upsert and a `SELECT`. Learned from
/// the first upsert that tries it and kept for the process. A server that refuses it answers
/// with a syntax error, which leaves the transaction as it was, and the two-statement form runs
/// instead, from then on (in a process that talks to MariaDB and MySQL alike, both get it:
/// still correct, one round trip slower on MariaDB).
static RETURNING: AtomicBool = AtomicBool::new(true);

/// Runs `returning` while the server is not known to refuse `RETURNING`; on its syntax error,
/// remembers that and gives `None`, as without.
pub(super) async fn try_returning<T>(
    returning: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<Option<T>, sqlx::Error> {
    if !RETURNING.load(Ordering::Relaxed) {
        return Ok(None);
    }
    match returning.await {
        Ok(rows) => Ok(Some(rows)),
        Err(sqlx::Error::Database(db))
            if db
                .try_downcast_ref::<MySqlDatabaseError>()
                .is_some_and(|db| db.number() == ER_PARSE_ERROR) =>
        {
            RETURNING.store(false, Ordering::Relaxed);
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

/// Turns `RETURNING` off (or back on) for this process, as a server without it would, and
/// returns whether it was on: tests use it to run the two-statement upserts on MariaDB, and to
/// tell that the `RETURNING` form ran without falling back.
#[doc(hidden)]
pub fn use_returning(on: bool) -> bool {
    RETURNING.swap(on, Ordering::Relaxed)
}
