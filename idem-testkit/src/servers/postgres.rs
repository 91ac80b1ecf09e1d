//! A private PostgreSQL cluster.

use std::path::{Path, PathBuf};
use std::process::Command;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::{free_port, is_root, unavailable};

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
            return unavailable(test, why);
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
