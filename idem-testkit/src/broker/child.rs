//! The child-process protocol of the crash rules. A rule re-runs its test binary
//! (`std::env::current_exe()`, `--exact <module>::broker_suite_child --ignored --nocapture`)
//! with these environment variables; the suite's child entry calls [`run`], which rebuilds the
//! broker ([`Broker::attach`]) and the database ([`Reopen::reopen`]) and plays its role until
//! it is done, stopped, or SIGKILLed (by the rule, or by itself at a planned point).
//!
//! | variable | meaning |
//! |---|---|
//! | `IDEM_KIT_CHILD` | the role: `consumer`, `relay-before-publish`, `relay-after-confirm` |
//! | `IDEM_KIT_BROKER` | [`Broker::names`] |
//! | `IDEM_KIT_DB_KIND`, `IDEM_KIT_DB` | [`Reopen::KIND`] and [`Reopen::location`] |
//! | `IDEM_KIT_CONSUMER` | a consumer's name ([`Settings::consumer`]) |
//! | `IDEM_KIT_BATCH`, `IDEM_KIT_PREFETCH` | a consumer's batch and prefetch |
//! | `IDEM_KIT_KILL_AT_ACK` | a consumer SIGKILLs itself at this ack, after its commit |
//! | `IDEM_KIT_RELEASE` | a consumer paces itself until this file exists |
//! | `IDEM_KIT_STOP` | a consumer stops gracefully once this file exists |
//!
//! A consumer stops on its own once [`Broker::unsettled`] is 0 and it holds nothing. A relay
//! relays the database's outbox and SIGKILLs itself before its first publish, or right after
//! the broker confirmed it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::consume::{json, Source as _};
use idem::outbox::{Message, OutboxStore, PublishError, Publisher, Relay};

use super::harness::{self, consumer, kill_at_ack, paced, sigkill_self, track, Reopen, Tally};
use super::model::{self, Event};
use super::{Broker, Settings};

/// The role.
pub const ROLE: &str = "IDEM_KIT_CHILD";
/// The broker's names.
pub const BROKER: &str = "IDEM_KIT_BROKER";
/// The database's kind.
pub const DB_KIND: &str = "IDEM_KIT_DB_KIND";
/// The database's location.
pub const DB: &str = "IDEM_KIT_DB";
/// A consumer's name.
pub const CONSUMER: &str = "IDEM_KIT_CONSUMER";
/// A consumer's batch.
pub const BATCH: &str = "IDEM_KIT_BATCH";
/// A consumer's prefetch.
pub const PREFETCH: &str = "IDEM_KIT_PREFETCH";
/// The ack at which a consumer SIGKILLs itself.
pub const KILL_AT_ACK: &str = "IDEM_KIT_KILL_AT_ACK";
/// The file whose existence ends a consumer's pacing.
pub const RELEASE: &str = "IDEM_KIT_RELEASE";
/// The file whose existence stops a consumer.
pub const STOP: &str = "IDEM_KIT_STOP";

/// How long a paced consumer waits before each delivery.
pub const PACE: Duration = Duration::from_millis(15);

/// The child entry of the suite: plays the role the environment names, or does nothing (a run
/// of the ignored tests by hand).
pub fn run<B: Broker>() {
    let Ok(role) = std::env::var(ROLE) else {
        eprintln!("not a rule: the child process of the broker suite's crash rules");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let kind = var(DB_KIND);
    runtime.block_on(async {
        match kind.as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => play::<B, crate::backends::Sqlite>(&role).await,
            #[cfg(feature = "postgres")]
            "postgres" => play::<B, crate::backends::Postgres>(&role).await,
            other => panic!("a child of the broker suite on an unknown database: {other}"),
        }
    });
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the broker suite's child needs {name}"))
}

fn number(name: &str) -> Option<usize> {
    std::env::var(name).ok().map(|n| {
        n.parse()
            .unwrap_or_else(|_| panic!("{name} is not a number: {n}"))
    })
}

async fn play<B: Broker, D: Reopen>(role: &str)
where
    D::Db: OutboxStore,
{
    let broker = B::attach(&var(BROKER)).await;
    let pool = D::reopen(&var(DB)).await;
    match role {
        "consumer" => consume::<B, D>(&broker, pool).await,
        "relay-before-publish" => relay(&broker, pool, false).await,
        "relay-after-confirm" => relay(&broker, pool, true).await,
        other => panic!("unknown role of a broker suite child: {other}"),
    }
}

/// Consumes until nothing is left unsettled and it holds nothing, or the stop file exists;
/// paced until the release file exists; SIGKILLs itself at the planned ack.
async fn consume<B: Broker, D: Reopen>(broker: &B, pool: sqlx::Pool<D::Db>) {
    let settings = Settings::new(number(PREFETCH).unwrap_or(40), &var(CONSUMER));
    let batch = number(BATCH).unwrap_or(20);
    let release = std::env::var_os(RELEASE).map(PathBuf::from);
    let stop = std::env::var_os(STOP).map(PathBuf::from);
    let slow = Arc::new(AtomicBool::new(release.is_some()));
    if let Some(release) = release {
        let slow = slow.clone();
        tokio::spawn(async move {
            while !release.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            slow.store(false, Ordering::Relaxed);
        });
    }
    let source = broker.source(settings).await;
    let tally = Tally::new();
    let deliveries = kill_at_ack(
        paced(track(source.deliveries(), &tally), PACE, slow),
        number(KILL_AT_ACK),
    );
    let done = async {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if stop.as_deref().is_some_and(Path::exists) {
                return;
            }
            if tally.idle() && broker.unsettled().await == 0 && tally.idle() {
                return;
            }
        }
    };
    let dialect = D::dialect();
    let counts = consumer(pool, batch)
        .run(
            deliveries,
            json::<Event>,
            async |b, e| model::handle(b, e, &dialect).await,
            done,
        )
        .await;
    harness::within(Duration::from_secs(60), "close", source.close())
        .await
        .expect("the source closes cleanly");
    eprintln!("consumer {}: {counts:?}", var(CONSUMER));
}

/// Relays the outbox, and SIGKILLs itself in its first publish.
async fn relay<B: Broker, DB: OutboxStore>(broker: &B, pool: sqlx::Pool<DB>, after_confirm: bool) {
    let publisher = KillAt {
        inner: broker.publisher().await,
        after_confirm,
    };
    let mut relay = Relay::new(pool, publisher).batch(1_000);
    let stepped = relay.step().await;
    panic!("the relay child was to kill itself in its first publish: {stepped:?}");
}

/// Kills its process with SIGKILL before publishing, or after the broker confirmed.
struct KillAt<P> {
    inner: P,
    after_confirm: bool,
}

impl<P: Publisher> Publisher for KillAt<P> {
    async fn publish(&self, batch: &[Message]) -> Result<(), PublishError> {
        if self.after_confirm {
            self.inner.publish(batch).await?;
        }
        sigkill_self()
    }
}

/// A child process, SIGKILLed when dropped (a rule that fails leaves none behind); its
/// standard error goes to a file of its own, shown when it ends otherwise than planned.
pub struct Life {
    child: Child,
    log: PathBuf,
}

impl Life {
    /// Its process id (to pause it with SIGSTOP and resume it with SIGCONT).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited, and how.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("the child's status")
    }

    /// Waits for it to exit (up to `limit`: then it is killed and the rule fails).
    pub async fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "a child did not exit within {limit:?}; its log:\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILLs it and waits for it; panics (with its log) if it had exited by itself.
    pub fn kill(&mut self) {
        if let Some(status) = self.try_wait() {
            panic!(
                "a child exited by itself ({status}); its log:\n{}",
                self.log()
            );
        }
        self.child.kill().expect("SIGKILL");
        let status = self.child.wait().expect("the child's status");
        assert_eq!(signal(status), Some(libc::SIGKILL), "{}", self.log());
    }

    /// The last 4 KiB of what it wrote to standard error.
    pub fn log(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let tail = &text[text.len().saturating_sub(4096)..];
        String::from_utf8_lossy(tail).into_owned()
    }

    /// Panics with its log unless `status` says SIGKILL.
    pub fn assert_killed(&self, status: ExitStatus) {
        assert_eq!(
            signal(status),
            Some(libc::SIGKILL),
            "the child was to die by SIGKILL but ended with {status}; its log:\n{}",
            self.log()
        );
    }

    /// Panics with its log unless `status` is a success.
    pub fn assert_success(&self, status: ExitStatus) {
        assert!(
            status.success(),
            "the child failed: {status}; its log:\n{}",
            self.log()
        );
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The signal that ended a process, if one did.
pub fn signal(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

/// A child process to start: its role and environment.
#[derive(Debug, Clone)]
pub struct Spawn {
    envs: Vec<(&'static str, String)>,
}

impl Spawn {
    /// A child in `role` on the rule's broker `broker` and database `pool`.
    pub async fn new<B: Broker, D: Reopen>(
        role: &str,
        broker: &B,
        pool: &sqlx::Pool<D::Db>,
    ) -> Spawn {
        Spawn {
            envs: vec![
                (ROLE, role.to_string()),
                (BROKER, broker.names()),
                (DB_KIND, D::KIND.to_string()),
                (DB, D::location(pool).await),
            ],
        }
    }

    /// Sets `name` to `value`.
    pub fn env(mut self, name: &'static str, value: impl ToString) -> Spawn {
        self.envs.push((name, value.to_string()));
        self
    }

    /// Starts it.
    pub fn spawn(&self) -> Life {
        let test = super::__private::CHILD_TEST
            .try_with(Clone::clone)
            .unwrap_or_else(|_| "broker_suite_child".to_string());
        let log =
            std::env::temp_dir().join(format!("{}.log", harness::unique_name("idem_kit_child")));
        let stderr = std::fs::File::create(&log).expect("the child's log file");
        let mut command = Command::new(std::env::current_exe().expect("the test binary"));
        command
            .args([test.as_str(), "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        for name in [
            ROLE,
            BROKER,
            DB_KIND,
            DB,
            CONSUMER,
            BATCH,
            PREFETCH,
            KILL_AT_ACK,
        ]
        .into_iter()
        .chain([RELEASE, STOP])
        {
            command.env_remove(name);
        }
        for (name, value) in &self.envs {
            command.env(name, value);
        }
        Life {
            child: command.spawn().expect("a child process"),
            log,
        }
    }
}
