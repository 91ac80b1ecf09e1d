//! MariaDB fails under idem.
//!
//! - **Server crash**: a private MariaDB of the test's own (`support/mariadb.rs`: its own
//!   folder, port and socket; the machine's shared server on 3306 is never touched) is
//!   SIGKILLed at random points while 4 consumers run, five times, and restarted (InnoDB crash
//!   recovery). Every delivery goes through `idem::retry`; at the end nothing is lost, nothing
//!   was applied twice, and no error was left to a caller. A run whose server cannot start
//!   again (MariaDB's own corruption) is void and runs again once on a new server.
//! - **Ambiguous commit**: a TCP proxy between idem and the server (the shared one, in a database
//!   of the test's own) forwards the `COMMIT` and cuts the connection before the reply reaches
//!   the client (or cuts before forwarding it), for one message and for an `idem::batch`. The
//!   caller gets an I/O error classified as transient; the redelivery is `Duplicate` when the
//!   commit went through and `Applied` when it did not, and each effect is there exactly once.
//!
//! The credits, the workers and the checks are `support/credits.rs`, shared with PostgreSQL.
//! `IDEM_SOAK=1` runs the crash test at 100,000 messages (default 3,000).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use sqlx::mysql::MySqlPoolOptions;

use crate::support::credits::{mysql as credits, patient, SetOnPanic, Stream};
use crate::support::mariadb::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_crash_loses_nothing_and_applies_nothing_twice() {
    // MariaDB 10.11.19 has, rarely, been unable to start again after one of these kills: it
    // aborted on an InnoDB assertion as it committed, then its crash recovery found its own
    // rollback segments corrupted ("Data structure corruption"; in none of 52 runs here, once in
    // CI). A client's SQL cannot do that, and such a run checks nothing of idem's: it is void and
    // runs again, once, on a new server, saying why. A second lost server fails the test.
    for attempt in 1..=2 {
        let Some(server) = Server::start("MariaDB crash test") else {
            return;
        };
        match crash_run(server).await {
            Ok(()) => return,
            Err(lost) if attempt == 1 => {
                eprintln!("void run, run again on a new server: mariadbd was lost: {lost}");
            }
            Err(lost) => panic!("mariadbd was lost in two runs running: {lost}"),
        }
    }
}

/// One run of the crash test on `server`; `Err` (what the server said) when mariadbd could not
/// be brought back, which makes the run void. Anything idem got wrong panics.
async fn crash_run(server: Server) -> Result<(), String> {
    let admin = MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(server.options())
        .await
        .unwrap();
    sqlx::query("CREATE DATABASE idem_crash")
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let pool = credits::crash_pool(server.options().database("idem_crash")).await;
    let stream = Stream::new();
    let total = stream.total;
    let done = Arc::new(AtomicBool::new(false));
    // Set when mariadbd cannot be brought back: the workers stop instead of retrying forever.
    // A retry waits out a restart (up to ~8 minutes with the pool's 2 s acquire timeout).
    let aborted = Arc::new(AtomicBool::new(false));
    let unpaced = Arc::new(AtomicBool::new(false));
    let workers = credits::workers(&pool, &stream, patient(200), &unpaced, &aborted);
    // Five crashes at random points spread over the stream: the n-th near n/6 of it. Until the
    // stream ends, the crasher also watches for mariadbd exiting by itself (MariaDB 10.11.19
    // once aborted on an InnoDB assertion in its purge, trx0purge.cc:277, after recovering from
    // one of these kills) and starts it again, as a service manager would, twice at most. If the
    // server cannot be brought back (or the crasher panics), it stops the workers' retries.
    let crasher = {
        let (done, queue, aborted) = (done.clone(), stream.queue.clone(), aborted.clone());
        let mut server = server;
        tokio::task::spawn_blocking(move || {
            let abort_on_panic = SetOnPanic(aborted);
            let mut rng = rand::rng();
            let mut crash_point = |crashes: usize| {
                total * (crashes + 1) / 6 + rng.random_range(0..total / 10) - total / 20
            };
            let (mut crashes, mut target) = (0, crash_point(0));
            let mut own_exits: Vec<String> = Vec::new();
            let kept_up = loop {
                if done.load(Ordering::SeqCst) {
                    break Ok(());
                }
                if let Some(status) = server.exited_by_itself() {
                    own_exits.push(format!(
                        "exited by itself with {status}:\n{}",
                        server.log_tail()
                    ));
                    if own_exits.len() > 2 {
                        break Err("it exited by itself three times".to_string());
                    }
                    if let Err(log) = server.try_start_server() {
                        break Err(log);
                    }
                } else if crashes < 5 && total - queue.lock().unwrap().len() >= target {
                    std::thread::sleep(Duration::from_micros(rand::rng().random_range(0..5_000)));
                    server.crash();
                    crashes += 1;
                    target = crash_point(crashes);
                    std::thread::sleep(Duration::from_millis(rand::rng().random_range(50..300)));
                    if let Err(log) = server.try_start_server() {
                        break Err(log);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            if kept_up.is_err() {
                abort_on_panic.0.store(true, Ordering::SeqCst);
            }
            (crashes, own_exits, kept_up, server)
        })
    };
    let seen = credits::finish(workers).await;
    done.store(true, Ordering::SeqCst);
    let (crashes, own_exits, kept_up, server) = crasher.await.unwrap();
    if let Err(why) = kept_up {
        pool.close().await;
        return Err(format!(
            "it could not be brought back: {why}\n---\n{}",
            own_exits.join("\n---\n")
        ));
    }
    if !own_exits.is_empty() {
        eprintln!(
            "mariadbd exited by itself {} time(s) and was started again:\n{}",
            own_exits.len(),
            own_exits.join("\n---\n")
        );
    }
    assert!(
        crashes == 5,
        "the stream ended after {crashes} crashes: make it longer"
    );
    credits::verify_crash_run(
        &pool,
        &stream,
        &seen,
        &format!("{crashes} SIGKILLs of mariadbd"),
    )
    .await;
    pool.close().await;
    drop(server);
    Ok(())
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn an_ambiguous_commit_on_mariadb_is_transient_and_the_redelivery_tells_what_happened() {
    crate::common::with_mysql(credits::ambiguous_commit).await;
}

#[tokio::test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
async fn an_ambiguous_batch_commit_on_mariadb_is_transient_and_the_redelivery_tells_what_happened()
{
    crate::common::with_mysql(credits::ambiguous_batch_commit).await;
}
