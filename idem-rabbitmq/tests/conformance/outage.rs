//! The database stops answering mid-stream while a RabbitMQ consumer runs.
//!
//! A private PostgreSQL cluster of the test's own (initdb into a temporary folder, its own port;
//! the machine's shared server is never touched) is stopped dead (`pg_ctl stop -m immediate`:
//! no checkpoint, WAL recovery on restart) once a quarter of the messages are acked, left down
//! for a few seconds, and started again. The loop must wait the outage out in place: no message
//! is dead-lettered or counted as an attempt for it, and once the database is back every
//! message applies exactly once (the database equals the oracle, the queue is drained, the
//! dead-letter queue is empty). A batch whose COMMIT reached the disk as the server died, but
//! whose reply never came, runs again and finds its records: the loop counts those as
//! duplicates, and the test bounds them (at most one batch per slot). Skipped, saying why, where
//! no PostgreSQL server binaries are installed (CI must have them) or no broker answers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use idem::consume::{json, Consumer};
use idem_testkit::backends::Postgres;
use idem_testkit::broker::harness::{self, track, within, Tally};
use idem_testkit::broker::model::{self, Event};
use idem_testkit::broker::{Broker, Spec};
use idem_testkit::{Dialect, Kit};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

use crate::Rabbit;

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
            let why = "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin; set IDEM_PG_BIN";
            if std::env::var_os("CI").is_some() {
                panic!("CI must run the database outage test, but there are {why}");
            }
            eprintln!("skipped: {why}");
            return None;
        };
        let dir = std::env::temp_dir().join(harness::unique_name("idem_rmq_outage"));
        std::fs::create_dir_all(&dir).unwrap();
        let cluster = Cluster {
            bin,
            dir,
            port: free_port(),
        };
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
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

    fn options(&self) -> PgConnectOptions {
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

    /// Stops the server dead, without a checkpoint.
    fn stop(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    /// Runs one of the server's binaries, as the `postgres` user when this process is root
    /// (the server refuses to run as root).
    fn run(&self, tool: &str, args: &[&str]) {
        let out = self.command(tool).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .args(["-D", data.as_str(), "-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
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

/// A port nothing listens on now (the kernel's pick, released at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Distinct events; with 30% duplicates, about 2,900 messages.
const UNIQUE: usize = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_mid_stream_dead_letters_nothing_and_everything_applies_once_it_is_back()
{
    let spec = Spec {
        counted: true,
        ..Spec::new("outage")
    };
    // A quorum queue counts deliveries: `max_deliveries(2)` dead-letters any message the loop
    // put back even once, so a requeue for the outage would show as a dead letter.
    let Some(b) = Rabbit::create(spec).await else {
        return;
    };
    let Some(cluster) = Cluster::start() else {
        b.teardown().await;
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(cluster.options())
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    // The kit's business tables and queries, on the private cluster's database.
    let kit = Kit::<Postgres> {
        pool: pool.clone(),
        dialect: Dialect::postgres(),
    };
    model::schema(&kit).await;

    let events = model::generate(harness::seed(), UNIQUE);
    let oracle = model::oracle(&events);
    let total = events.len() as u64;
    b.publish(&model::raws(&events)).await;

    let tally = Tally::new();
    let deliveries = b
        .builder()
        .prefetch(80)
        .connect()
        .await
        .unwrap()
        .deliveries();
    let d = kit.dialect;
    let run = Consumer::new(pool.clone())
        .batch(20)
        .concurrency(2)
        .max_deliveries(2)
        .retry_delay(Duration::from_millis(50), Duration::from_millis(500))
        .run(
            track(deliveries, &tally),
            json::<Event>,
            async |batch, e| model::handle(batch, e, &d).await,
            tally
                .clone()
                .until(move |acked, dead| acked + dead >= total),
        );
    let outage = {
        let tally = tally.clone();
        let cluster = &cluster;
        async move {
            tally
                .clone()
                .until(move |acked, _| acked >= total / 4)
                .await;
            let stopped = Instant::now();
            tokio::task::block_in_place(|| cluster.stop());
            let acked_at_stop = tally.acked();
            tokio::time::sleep(Duration::from_secs(3)).await;
            let acked_while_down = tally.acked() - acked_at_stop;
            tokio::task::block_in_place(|| cluster.start_server());
            eprintln!(
                "database down for {:?} at {acked_at_stop} acked; {acked_while_down} acked while down",
                stopped.elapsed()
            );
            acked_while_down
        }
    };
    let (counts, acked_while_down) = within(Duration::from_secs(240), "the consumer", async {
        tokio::join!(run, outage)
    })
    .await;
    eprintln!("{total} messages: {counts:?}");

    // The loop saw the outage and waited it out in place (acks right after the stop belong to
    // commits made before it)...
    eprintln!("acked while the database was down: {acked_while_down}");
    assert!(counts.store_pauses >= 1, "{counts:?}");
    // ...so nothing was dead-lettered for it, and every message applied once it was back.
    assert_eq!(counts.dead_lettered, 0, "{counts:?}");
    assert_eq!(tally.dead_lettered(), 0);
    assert_eq!(tally.acked(), total);
    assert_eq!(counts.applied + counts.duplicate + counts.stale, total);
    model::verify(&kit, &oracle).await;
    // Each message applied once (`verify`); the loop reports as applied all of them but those
    // of a batch whose COMMIT went through as the server stopped and whose reply never came:
    // run again once it was back, that batch found its records (`Duplicate`). At most one
    // batch per slot (2 × 20) can be caught so.
    let in_database = model::applied(&kit).await;
    let ambiguous = in_database.checked_sub(counts.applied).unwrap_or_else(|| {
        panic!(
            "the loop counted {} applied, the database holds {in_database}",
            counts.applied
        )
    });
    eprintln!(
        "{ambiguous} applications committed as the server stopped, then reported as duplicates"
    );
    assert!(
        ambiguous <= counts.duplicate && ambiguous <= 2 * 20,
        "{ambiguous} applications the loop did not count: {counts:?}"
    );
    b.settles_at(&b.queue, 0).await;
    assert_eq!(b.depth(&b.dlq()).await, (0, 0));

    b.teardown().await;
    pool.close().await;
    drop(cluster);
}
