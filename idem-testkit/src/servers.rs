//! Private servers a test starts, crashes and restarts on its own (PostgreSQL, NATS with
//! JetStream): never the machine's shared ones.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// A PostgreSQL cluster of one test's own: `initdb` into a temporary folder, its own port and
/// socket folder, `fsync` and `synchronous_commit` on. Stopped dead and removed on drop.
///
/// Runs the server's binaries as the `postgres` user when the test runs as root (the server
/// refuses to run as root).
pub struct PostgresServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl PostgresServer {
    /// Initialises and starts a cluster in a new folder named after `name`. `None`, having said
    /// why, where this machine has no PostgreSQL server binaries (`initdb`, `pg_ctl` under
    /// `/usr/lib/postgresql/*/bin`, or the folder `IDEM_PG_BIN` names); with `CI` set that is a
    /// failure, since CI must run what `test` names.
    pub fn start(name: &str, test: &str) -> Option<PostgresServer> {
        let Some(bin) = binaries() else {
            let why = "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin; set IDEM_PG_BIN";
            if std::env::var_os("CI").is_some() {
                panic!("CI must run the {test}, but there are {why}");
            }
            eprintln!("skipped: {why}");
            return None;
        };
        let dir = std::env::temp_dir().join(crate::backends::unique_name(name));
        std::fs::create_dir_all(&dir).unwrap();
        let server = PostgresServer {
            bin,
            dir,
            port: free_port(),
        };
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&server.dir)
                .status()
                .unwrap();
            assert!(status.success(), "chown of {}", server.dir.display());
        }
        let data = server.data();
        let init = [
            "-D",
            &data,
            "-U",
            "postgres",
            "--auth=trust",
            "-N",
            "-E",
            "UTF8",
        ];
        server.run("initdb", &init);
        server.restart();
        Some(server)
    }

    /// How to reach it: user `postgres`, database `postgres`, no TLS.
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
            .ssl_mode(PgSslMode::Disable)
    }

    /// Starts the server again (after [`crash`](Self::crash)), waiting until it answers.
    pub fn restart(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        let data = self.data();
        let start = [
            "-D", &data, "-o", &options, "-l", &log, "-w", "-t", "60", "start",
        ];
        self.run("pg_ctl", &start);
    }

    /// Stops the server dead, without a checkpoint: a restart replays the WAL.
    pub fn crash(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
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

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let data = self.data();
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let _ = self.command("pg_ctl").args(args).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A NATS server with JetStream of one test's own: its own port and store folder (kept across
/// a [`kill`](Self::kill) and [`restart`](Self::restart), so streams and consumers survive).
/// Killed and its folder removed on drop.
pub struct NatsServer {
    program: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Mutex<Option<Child>>,
}

impl NatsServer {
    /// Starts a server with its store in a new folder named after `name`, waiting until it
    /// takes connections. `None`, having said why, where this machine has no `nats-server`
    /// (on the `PATH`, in `/usr/sbin`, or where `IDEM_NATS_SERVER` says); with `CI` set that is
    /// a failure, since CI must run what `test` names.
    pub fn start(name: &str, test: &str) -> Option<NatsServer> {
        let Some(program) = nats_server() else {
            let why = "no nats-server on the PATH or in /usr/sbin; set IDEM_NATS_SERVER";
            if std::env::var_os("CI").is_some() {
                panic!("CI must run the {test}, but there is {why}");
            }
            eprintln!("skipped: {why}");
            return None;
        };
        let dir = std::env::temp_dir().join(crate::backends::unique_name(name));
        std::fs::create_dir_all(&dir).unwrap();
        let server = NatsServer {
            program,
            dir,
            port: free_port(),
            child: Mutex::new(None),
        };
        server.restart();
        Some(server)
    }

    /// Its URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the server again on the same port and store (after [`kill`](Self::kill)),
    /// waiting (up to 30 s) until it takes connections.
    pub fn restart(&self) {
        let log = std::fs::File::create(self.dir.join("server.log")).unwrap();
        let child = Command::new(&self.program)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.dir.join("store"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        *self.child.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not take connections on port {} within 30 s (log in {})",
                self.port,
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server dead (SIGKILL) and waits for it to be gone.
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `IDEM_NATS_SERVER`, or `nats-server` on the `PATH` or in `/usr/sbin`.
fn nats_server() -> Option<PathBuf> {
    if let Some(program) = std::env::var_os("IDEM_NATS_SERVER") {
        return Some(PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("nats-server"))
        .find(|program| program.is_file())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `IDEM_PG_BIN`, or the newest `/usr/lib/postgresql/*/bin` that has initdb and pg_ctl.
fn binaries() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("IDEM_PG_BIN") {
        return Some(PathBuf::from(bin));
    }
    let has = |bin: &Path, tool: &str| bin.join(tool).is_file();
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| has(bin, "initdb") && has(bin, "pg_ctl"))
        .collect();
    found.sort();
    found.pop()
}
