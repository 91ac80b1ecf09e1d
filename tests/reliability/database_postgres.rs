//! PostgreSQL itself fails under idem.
//!
//! - **Server crash**: a private PostgreSQL cluster of the test's own (initdb into a temporary
//!   folder, its own port; the machine's shared server is never touched) is crashed with
//!   `pg_ctl stop -m immediate` (no checkpoint: WAL recovery on restart) at random points while
//!   4 consumers run (paced until the five crashes are made, so that a fast machine does not
//!   finish first), five times, and restarted. Every delivery goes through `idem::retry`; at
//!   the end nothing is lost, nothing was applied twice, and no error was left to a caller.
//! - **Ambiguous commit**: a TCP proxy between idem and the server forwards the `COMMIT` and cuts
//!   the connection before the reply reaches the client (or cuts before forwarding it), so the
//!   caller cannot know whether it committed. The caller gets `idem::Error::Store` classified as
//!   transient; the redelivery is a `Duplicate` when the commit went through and `Applied` when
//!   it did not, and the effect is there exactly once either way. The same for an `idem::batch`
//!   of 20 messages: the batch returns the I/O error, and the redelivered batch is all
//!   `Duplicate` or all `Applied`.
//!
//! The credits, the workers and the checks are `support/credits.rs`, shared with MariaDB.
//! `IDEM_SOAK=1` runs the crash test at 100,000 messages (default 3,000).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_testkit::servers::PostgresServer;
use rand::Rng as _;

use crate::support::credits::{patient, postgres as credits, SetOnPanic, Stream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_loses_nothing_and_applies_nothing_twice() {
    let Some(cluster) = PostgresServer::start("idem_pgcrash", "database crash test") else {
        return;
    };
    let pool = credits::crash_pool(cluster.options()).await;
    let stream = Stream::new();
    let done = Arc::new(AtomicBool::new(false));
    // Until the crasher has made its crashes, the workers pace themselves.
    let crashing = Arc::new(AtomicBool::new(true));
    let aborted = Arc::new(AtomicBool::new(false));
    let workers = credits::workers(&pool, &stream, patient(100), &crashing, &aborted);
    let crasher = {
        let (done, crashing) = (done.clone(), crashing.clone());
        let abort_on_panic = SetOnPanic(aborted);
        tokio::task::spawn_blocking(move || {
            let _abort_on_panic = abort_on_panic;
            let mut rng = rand::rng();
            let mut crashes = 0;
            while crashes < 5 && !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(rng.random_range(150..600)));
                cluster.crash();
                crashes += 1;
                std::thread::sleep(Duration::from_millis(rng.random_range(50..300)));
                cluster.restart();
            }
            crashing.store(false, Ordering::SeqCst);
            (crashes, cluster)
        })
    };
    let seen = credits::finish(workers).await;
    done.store(true, Ordering::SeqCst);
    let (crashes, cluster) = crasher.await.unwrap();
    assert!(
        crashes == 5,
        "the stream ended after {crashes} crashes: make it longer"
    );
    credits::verify_crash_run(&pool, &stream, &seen, "5 crashes").await;
    pool.close().await;
    drop(cluster);
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn an_ambiguous_commit_is_transient_and_the_redelivery_tells_what_happened() {
    crate::common::with_postgres(credits::ambiguous_commit).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
async fn an_ambiguous_batch_commit_is_transient_and_the_redelivery_tells_what_happened() {
    crate::common::with_postgres(credits::ambiguous_batch_commit).await;
}
