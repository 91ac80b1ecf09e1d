//! What the reliability tests share: sizes and seeds, this test binary started again as a child
//! process, what a private server needs from the machine, the TCP proxy that cuts a COMMIT
//! (`proxy`), a connection cut from the server's side (`cut`), a TCP endpoint a failover moves
//! from one server to another (`endpoint`), a private MariaDB server (`mariadb`), the durable
//! log of the consumer-crash tests and its oracle (`log`), the credits of the database-crash
//! tests (`credits`).
#![allow(dead_code)] // each feature set uses a part of this module

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod credits;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod cut;
#[cfg(feature = "postgres")]
pub mod endpoint;
pub mod log;
#[cfg(feature = "mysql")]
pub mod mariadb;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub mod proxy;

use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

/// Whether `IDEM_SOAK=1` asks for the large sizes.
pub fn soak() -> bool {
    std::env::var_os("IDEM_SOAK").is_some_and(|v| v == "1")
}

/// The seed of a randomised test: `var` when it is set (to replay a run), else a random one,
/// printed either way.
pub fn seed(var: &str, test: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test} seed: {var}={seed}");
    seed
}

/// Fails, saying how many and showing a few, unless `items` is empty: `what` happened to them.
pub fn assert_none<T: std::fmt::Debug>(what: &str, items: impl IntoIterator<Item = T>) {
    let items: Vec<T> = items.into_iter().collect();
    let few: Vec<&T> = items.iter().take(5).collect();
    assert!(items.is_empty(), "{} {what}, e.g. {few:?}", items.len());
}

/// This test binary started again to run only the test `test` (its path in this binary, such as
/// `crash::consumer_child`), with no stdin; the caller adds the environment that makes that
/// test act, and where stdout and stderr go.
pub fn child(test: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null());
    command
}

/// The signal that ended a process, if one did.
pub fn killed_by(status: ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(&status)
}

/// Kills this process the way `kill -9` would: no destructor, no flush, no rollback.
pub fn sigkill_self() -> ! {
    // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!("SIGKILL did not kill the process")
}

/// Whether this process runs as root (a database server then runs as its own user).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Gives `dir` to `user` when this process is root, for a server that runs as that user.
pub fn hand_to(user: &str, dir: &Path) {
    if is_root() {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{user}:{user}"))
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "chown -R {user} {}", dir.display());
    }
}

/// A port nothing listens on now (the kernel's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `None`, with a line saying why `test` is skipped: there are `why` (what it needs is missing).
/// In CI (`CI` set) a failure instead, since CI must run it.
pub fn skip<T>(test: &str, why: &str) -> Option<T> {
    if std::env::var_os("CI").is_some() {
        panic!("CI must run the {test}, but there are {why}");
    }
    eprintln!("skipped: {why}");
    None
}
