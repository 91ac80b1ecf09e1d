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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::support::credits::{patient, postgres as credits, SetOnPanic, Stream};
use crate::support::{free_port, hand_to, is_root, skip};

/// A PostgreSQL server of this test's own: its data folder, its port, its socket folder.
/// Stopped and removed on drop.
struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl Cluster {
    /// Initialises and starts a cluster; `None` (with a line saying why) where this machine has
    /// no PostgreSQL server binaries, which CI must have.
    fn start() -> Option<Cluster> {
        let Some(bin) = postgres_bin() else {
            return skip(
                "database crash test",
                "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin; set IDEM_PG_BIN",
            );
        };
        let dir = std::env::temp_dir().join(crate::common::unique_name("idem_pgcrash"));
        std::fs::create_dir_all(&dir).unwrap();
        let cluster = Cluster {
            bin,
            dir,
            port: free_port(),
        };
        hand_to("postgres", &cluster.dir);
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-N",
                "-E",
                "UTF8",
            ],
        );
        cluster.start_server();
        Some(cluster)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn url(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
            .ssl_mode(PgSslMode::Disable)
    }

    fn start_server(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// Kills the server without a checkpoint: a restart replays the WAL.
    fn crash(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    /// One of the server's binaries, as the `postgres` user when this process is root (the
    /// server refuses to run as root).
    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        }
    }

    /// Runs one of the server's binaries, which must succeed.
    fn run(&self, tool: &str, args: &[&str]) {
        let out = self.command(tool).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let _ = self.command("pg_ctl").args(args).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `IDEM_PG_BIN`, or the newest `/usr/lib/postgresql/*/bin` that has initdb and pg_ctl.
fn postgres_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("IDEM_PG_BIN") {
        return Some(PathBuf::from(bin));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| has(bin, "initdb") && has(bin, "pg_ctl"))
        .collect();
    found.sort();
    found.pop()
}

fn has(bin: &Path, tool: &str) -> bool {
    bin.join(tool).is_file()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_loses_nothing_and_applies_nothing_twice() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let pool = credits::crash_pool(cluster.url()).await;
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
                cluster.start_server();
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
async fn an_ambiguous_commit_is_transient_and_the_redelivery_tells_what_happened() {
    crate::common::with_postgres(credits::ambiguous_commit).await;
}

#[tokio::test]
async fn an_ambiguous_batch_commit_is_transient_and_the_redelivery_tells_what_happened() {
    crate::common::with_postgres(credits::ambiguous_batch_commit).await;
}
