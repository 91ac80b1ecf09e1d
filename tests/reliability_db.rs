//! The database itself fails under idem.
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
//! `IDEM_SOAK=1` runs the crash test at 100,000 messages (default 3,000).

mod common;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{idempotent, Error, Outcome, RetryPolicy, Transient as _, Tx};
use rand::Rng as _;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{PgPool, Postgres};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone)]
struct Credit {
    id: String,
    account: i64,
    amount: i64,
}

/// Adds to a balance and logs the application, so a second application of one message shows.
#[idempotent(key = "msg.id", scope = "reliability_db::credit")]
async fn credit(tx: &mut Tx<'_, Postgres>, msg: &Credit) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO applied (msg_id) VALUES ($1)")
        .bind(&msg.id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO balances (account, balance) VALUES ($1, $2) \
         ON CONFLICT (account) DO UPDATE SET balance = balances.balance + EXCLUDED.balance",
    )
    .bind(msg.account)
    .bind(msg.amount)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn create_tables(pool: &PgPool) {
    for sql in [
        "CREATE TABLE applied (msg_id TEXT NOT NULL)",
        "CREATE TABLE balances (account BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
    ] {
        sqlx::query(sql).execute(pool).await.unwrap();
    }
}

/// Messages applied more than once, and how many distinct ones were applied.
async fn applications(pool: &PgPool) -> (Vec<(String, i64)>, i64) {
    let twice: Vec<(String, i64)> = sqlx::query_as(
        "SELECT msg_id, COUNT(*) FROM applied GROUP BY msg_id HAVING COUNT(*) > 1 LIMIT 10",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let distinct: i64 = sqlx::query_scalar("SELECT COUNT(DISTINCT msg_id) FROM applied")
        .fetch_one(pool)
        .await
        .unwrap();
    (twice, distinct)
}

async fn balances(pool: &PgPool) -> HashMap<i64, i64> {
    sqlx::query_as::<_, (i64, i64)>("SELECT account, balance FROM balances")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A private PostgreSQL cluster.

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
                panic!("CI must run the database crash test, but there are {why}");
            }
            eprintln!("skipped: {why}");
            return None;
        };
        let dir = std::env::temp_dir().join(common::unique_name("idem_pgcrash"));
        std::fs::create_dir_all(&dir).unwrap();
        let cluster = Cluster {
            bin,
            dir,
            port: free_port(),
        };
        cluster.hand_to_postgres_user();
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

    /// Runs one of the server's binaries, as the `postgres` user when this process is root
    /// (the server refuses to run as root).
    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bin.join(tool);
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let out = command.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn hand_to_postgres_user(&self) {
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&self.dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let program = self.bin.join("pg_ctl");
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let _ = if is_root() {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&program)
                .args(args)
                .output()
        } else {
            Command::new(&program).args(args).output()
        };
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

fn soak() -> bool {
    std::env::var_os("IDEM_SOAK").is_some_and(|v| v == "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_loses_nothing_and_applies_nothing_twice() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(cluster.url())
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    create_tables(&pool).await;

    // The stream: every message once, 30% of them again, shuffled.
    let messages: u32 = if soak() { 100_000 } else { 3_000 };
    let mut rng = rand::rng();
    let mut stream: Vec<Credit> = (0..messages)
        .map(|i| Credit {
            id: format!("m{i}"),
            account: i64::from(i % 50),
            amount: i64::from(i % 9 + 1),
        })
        .collect();
    let mut oracle: HashMap<i64, i64> = HashMap::new();
    for msg in &stream {
        *oracle.entry(msg.account).or_default() += msg.amount;
    }
    let again: Vec<Credit> = stream
        .iter()
        .filter(|_| rng.random_bool(0.3))
        .cloned()
        .collect();
    stream.extend(again);
    for i in (1..stream.len()).rev() {
        stream.swap(i, rng.random_range(0..=i));
    }
    let total = stream.len();
    let queue = Arc::new(Mutex::new(VecDeque::from(stream)));

    // Long enough to wait out a restart and WAL recovery.
    let policy = RetryPolicy {
        attempts: 100,
        first_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(500),
    };
    let done = Arc::new(AtomicBool::new(false));
    // Until the crasher has made its crashes, the workers pace themselves and keep the last
    // tenth of the stream back: on a fast machine the stream would otherwise end first.
    let crashing = Arc::new(AtomicBool::new(true));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (pool, queue, crashing) = (pool.clone(), queue.clone(), crashing.clone());
        workers.push(tokio::spawn(async move {
            let mut outcomes = (0_u64, 0_u64);
            let mut errors = Vec::new();
            loop {
                if crashing.load(Ordering::SeqCst) {
                    let held_back = queue.lock().unwrap().len() <= total / 10;
                    tokio::time::sleep(Duration::from_millis(if held_back { 20 } else { 5 })).await;
                    if held_back {
                        continue;
                    }
                }
                let Some(msg) = queue.lock().unwrap().pop_front() else {
                    break;
                };
                match idem::retry(policy, || credit(&pool, &msg)).await {
                    Ok(Outcome::Applied(())) => outcomes.0 += 1,
                    Ok(_) => outcomes.1 += 1,
                    Err(err) => errors.push(format!("{}: {err}", msg.id)),
                }
            }
            (outcomes, errors)
        }));
    }
    let crasher = {
        let done = done.clone();
        let crashing = crashing.clone();
        tokio::task::spawn_blocking(move || {
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
    let (mut applied, mut skipped, mut errors) = (0, 0, Vec::new());
    for worker in workers {
        let ((a, s), e) = worker.await.unwrap();
        applied += a;
        skipped += s;
        errors.extend(e);
    }
    done.store(true, Ordering::SeqCst);
    let (crashes, cluster) = crasher.await.unwrap();
    assert!(
        crashes == 5,
        "the stream ended after {crashes} crashes: make it longer"
    );
    assert!(errors.is_empty(), "errors left to callers: {errors:?}");
    assert_eq!(applied + skipped, total as u64);

    let (twice, distinct) = applications(&pool).await;
    assert!(twice.is_empty(), "applied more than once: {twice:?}");
    assert_eq!(distinct, i64::from(messages));
    // A commit that went through while the connection died is an ambiguous commit: `retry`
    // runs the delivery again and sees `Duplicate`. So callers saw `Applied` at most once per
    // message, and the database, not the callers' view, says each was applied exactly once.
    assert!(applied <= u64::from(messages));
    eprintln!(
        "{crashes} crashes; {} of {messages} commits were ambiguous (went through, then reported as Duplicate by the retry)",
        u64::from(messages) - applied
    );
    assert_eq!(balances(&pool).await, oracle);
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(records, i64::from(messages));
    pool.close().await;
    drop(cluster);
}

// ---------------------------------------------------------------------------------------------
// A proxy that cuts a connection at its COMMIT.

/// When the proxy cuts the next `COMMIT` it sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Cut {
    Never = 0,
    /// Forward the COMMIT to the server, then cut before its reply reaches the client.
    AfterCommit = 1,
    /// Cut without forwarding the COMMIT: the server rolls the transaction back.
    BeforeCommit = 2,
}

/// Forwards PostgreSQL connections to `upstream`, reading the client's messages so that it can
/// cut one at its `COMMIT` (once per arming).
struct Proxy {
    addr: SocketAddr,
    armed: Arc<AtomicU8>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(AtomicU8::new(Cut::Never as u8));
        let arming = armed.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, arming.clone()));
            }
        });
        Proxy { addr, armed }
    }

    fn arm(&self, cut: Cut) {
        self.armed.store(cut as u8, Ordering::SeqCst);
    }
}

async fn relay(client: TcpStream, server: TcpStream, armed: Arc<AtomicU8>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let cut = Arc::new(AtomicBool::new(false));
    // Server to client: plain copy, until the cut.
    let replies = {
        let cut = cut.clone();
        tokio::spawn(async move {
            let mut buf = vec![0_u8; 16 * 1024];
            loop {
                let n = match server_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if cut.load(Ordering::SeqCst) || client_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            // Dropping the write half closes the client's side.
        })
    };
    // Client to server, message by message: the startup message has no type byte.
    let mut started = false;
    loop {
        let mut head = [0_u8; 5];
        let header = if started {
            &mut head[..]
        } else {
            &mut head[1..]
        };
        if client_rx.read_exact(header).await.is_err() {
            break;
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0_u8; len.saturating_sub(4)];
        if client_rx.read_exact(&mut body).await.is_err() {
            break;
        }
        let typed = started;
        let is_commit = typed && head[0] == b'Q' && body.starts_with(b"COMMIT\0");
        started = true;
        if is_commit {
            let how = armed.swap(Cut::Never as u8, Ordering::SeqCst);
            if how == Cut::AfterCommit as u8 {
                cut.store(true, Ordering::SeqCst);
                let _ = server_tx.write_all(&head).await;
                let _ = server_tx.write_all(&body).await;
                // Let the server commit; its reply is dropped by the other half.
                tokio::time::sleep(Duration::from_millis(300)).await;
                break;
            }
            if how == Cut::BeforeCommit as u8 {
                cut.store(true, Ordering::SeqCst);
                break;
            }
        }
        let frame: &[u8] = if typed { &head } else { &head[1..] };
        if server_tx.write_all(frame).await.is_err() || server_tx.write_all(&body).await.is_err() {
            break;
        }
    }
    replies.abort();
}

#[tokio::test]
async fn an_ambiguous_commit_is_transient_and_the_redelivery_tells_what_happened() {
    let Some(pool) = common::postgres().await else {
        return;
    };
    create_tables(&pool).await;
    let direct = common::postgres_options(&pool, &[]).await;
    let upstream: SocketAddr = format!("{}:{}", direct.get_host(), direct.get_port())
        .parse()
        .unwrap_or_else(|_| "127.0.0.1:5432".parse().unwrap());
    let proxy = Proxy::start(upstream).await;
    let proxied = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            direct
                .host("127.0.0.1")
                .port(proxy.addr.port())
                .ssl_mode(PgSslMode::Disable),
        )
        .await
        .unwrap();

    for (cut, id, committed) in [
        (Cut::AfterCommit, "amb-after", true),
        (Cut::BeforeCommit, "amb-before", false),
    ] {
        let msg = Credit {
            id: id.into(),
            account: if committed { 1 } else { 2 },
            amount: 10,
        };
        proxy.arm(cut);
        let err = credit(&proxied, &msg)
            .await
            .expect_err("the commit was cut");
        assert!(
            matches!(err, Error::Store(_)),
            "{cut:?}: expected a store error, got {err:?}"
        );
        assert!(err.is_transient(), "{cut:?}: {err:?} must be transient");
        eprintln!("{cut:?}: the caller sees: {err}");

        // What the server did, read directly.
        let record: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_records WHERE scope = 'reliability_db::credit' AND msg_key = $1",
        )
        .bind(id.as_bytes())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(record, i64::from(committed), "{cut:?}");

        // The redelivery (through the proxy, disarmed) tells the caller which it was.
        let again = idem::retry(RetryPolicy::default(), || credit(&proxied, &msg))
            .await
            .unwrap();
        let expected = if committed {
            Outcome::Duplicate
        } else {
            Outcome::Applied(())
        };
        assert_eq!(again, expected, "{cut:?}");
    }
    let (twice, distinct) = applications(&pool).await;
    assert!(twice.is_empty());
    assert_eq!(distinct, 2);
    assert_eq!(balances(&pool).await, HashMap::from([(1, 10), (2, 10)]));
    proxied.close().await;
    common::drop_postgres(pool).await;
}

#[tokio::test]
async fn an_ambiguous_batch_commit_is_transient_and_the_redelivery_tells_what_happened() {
    let Some(pool) = common::postgres().await else {
        return;
    };
    create_tables(&pool).await;
    let direct = common::postgres_options(&pool, &[]).await;
    let upstream: SocketAddr = format!("{}:{}", direct.get_host(), direct.get_port())
        .parse()
        .unwrap_or_else(|_| "127.0.0.1:5432".parse().unwrap());
    let proxy = Proxy::start(upstream).await;
    let proxied = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(
            direct
                .host("127.0.0.1")
                .port(proxy.addr.port())
                .ssl_mode(PgSslMode::Disable),
        )
        .await
        .unwrap();

    for (cut, prefix, account, committed) in [
        (Cut::AfterCommit, "bat-after", 1, true),
        (Cut::BeforeCommit, "bat-before", 2, false),
    ] {
        let batch: Vec<Credit> = (0..20)
            .map(|i| Credit {
                id: format!("{prefix}-{i}"),
                account,
                amount: 1,
            })
            .collect();
        proxy.arm(cut);
        let err = idem::batch(&proxied, &batch, async |b, msg| credit(b, msg).await)
            .await
            .expect_err("the commit was cut");
        assert!(
            matches!(err, sqlx::Error::Io(_)),
            "{cut:?}: expected an I/O error, got {err:?}"
        );
        assert!(err.is_transient(), "{cut:?}: {err:?} must be transient");
        eprintln!("{cut:?} (batch of 20): the caller sees: {err}");
        let ids: Vec<Vec<u8>> = batch.iter().map(|m| m.id.as_bytes().to_vec()).collect();
        let recorded: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM idem_records WHERE scope = 'reliability_db::credit' AND msg_key = ANY($1)",
        )
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(recorded, if committed { 20 } else { 0 }, "{cut:?}");

        // The redelivered batch tells which it was, message by message.
        let again = idem::batch(&proxied, &batch, async |b, msg| credit(b, msg).await)
            .await
            .unwrap();
        for (msg, result) in batch.iter().zip(again) {
            let expected = if committed {
                Outcome::Duplicate
            } else {
                Outcome::Applied(())
            };
            assert_eq!(result.unwrap(), expected, "{cut:?} {}", msg.id);
        }
    }
    let (twice, distinct) = applications(&pool).await;
    assert!(twice.is_empty(), "{twice:?}");
    assert_eq!(distinct, 40);
    assert_eq!(balances(&pool).await, HashMap::from([(1, 20), (2, 20)]));
    proxied.close().await;
    common::drop_postgres(pool).await;
}
