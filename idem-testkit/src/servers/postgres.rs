//! A private PostgreSQL cluster, and streaming replicas of it.

use std::path::{Path, PathBuf};
use std::process::Command;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use super::{free_port, is_root, unavailable};

/// A PostgreSQL cluster of one test's own: `initdb` into a temporary folder, its own port and
/// socket folder, `fsync` and `synchronous_commit` on. Stopped dead and removed on drop.
///
/// It can be replicated: `wal_level=replica`, WAL senders, `hot_standby`, and the trust entry
/// for replication connections from 127.0.0.1 in `pg_hba.conf`; [`replica_of`](Self::replica_of)
/// makes a streaming standby with `pg_basebackup -R`, and [`promote`](Self::promote) makes it
/// a primary.
///
/// Runs the server's binaries as the `postgres` user when the test runs as root (the server
/// refuses to run as root).
pub struct PostgresServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    name: String,
}

impl PostgresServer {
    /// Initialises and starts a cluster in a new folder named after `name`. `None`, having said
    /// why, where this machine has no PostgreSQL server binaries (`initdb`, `pg_ctl` under
    /// `/usr/lib/postgresql/*/bin`, or the folder `IDEM_PG_BIN` names); with `CI` set that is a
    /// failure, since CI must run what `test` names.
    pub fn start(name: &str, test: &str) -> Option<PostgresServer> {
        PostgresServer::start_with(name, test, &[])
    }

    /// [`start`](Self::start), with `settings` (such as `("ssl", "on")`) written into its
    /// configuration (`postgresql.auto.conf`) before it first starts. A setting's value is
    /// quoted for the file.
    pub fn start_with(name: &str, test: &str, settings: &[(&str, &str)]) -> Option<PostgresServer> {
        let Some(bin) = binaries() else {
            let why = "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin; set IDEM_PG_BIN";
            return unavailable(test, why);
        };
        let mut server = PostgresServer::in_new_folder(bin, name);
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
        // initdb's trust entries already cover replication from 127.0.0.1; said out loud, first.
        let hba = server.dir.join("data").join("pg_hba.conf");
        let entries = std::fs::read_to_string(&hba).unwrap();
        let replication = "host replication all 127.0.0.1/32 trust\n";
        std::fs::write(&hba, format!("{replication}{entries}")).unwrap();
        server.configure(settings);
        server.first_start();
        Some(server)
    }

    /// A new, empty folder for a server named after `name` (owned by `postgres` under root),
    /// and a port of its own.
    fn in_new_folder(bin: PathBuf, name: &str) -> PostgresServer {
        let unique = crate::backends::unique_name(name);
        let dir = std::env::temp_dir().join(&unique);
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(status.success(), "chown of {}", dir.display());
        }
        PostgresServer {
            bin,
            dir,
            port: free_port(),
            name: unique,
        }
    }

    /// A streaming replica of `primary`, started: `pg_basebackup -R` of it into a new folder
    /// named after `name`, on a port of its own, a hot standby that streams from the server at
    /// `127.0.0.1:upstream` (the primary's [`port`](Self::port), or a proxy in front of it) as
    /// [`application_name`](Self::application_name), which `synchronous_standby_names` on the
    /// primary can name.
    pub fn replica_of(primary: &PostgresServer, name: &str, upstream: u16) -> PostgresServer {
        let mut replica = PostgresServer::in_new_folder(primary.bin.clone(), name);
        let data = replica.data();
        let port = primary.port.to_string();
        let backup = [
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-D",
            &data,
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        ];
        replica.run("pg_basebackup", &backup);
        // After what -R wrote: the last setting in the file wins.
        let conninfo = format!(
            "host=127.0.0.1 port={upstream} user=postgres application_name={}",
            replica.name
        );
        replica.configure(&[("primary_conninfo", &conninfo)]);
        replica.first_start();
        replica
    }

    /// Ends recovery on a standby (`pg_ctl promote`), waiting until it accepts writes.
    pub fn promote(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "-t", "60", "promote"]);
    }

    /// The name it streams under as a replica (its `application_name`), unique to it.
    pub fn application_name(&self) -> &str {
        &self.name
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The folder its files are in (`data/`, `server.log`), which it removes on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends `settings` to its `postgresql.auto.conf` (read after `postgresql.conf`, where
    /// `pg_basebackup -R` writes), for its next start: the last occurrence of a setting wins.
    fn configure(&self, settings: &[(&str, &str)]) {
        if settings.is_empty() {
            return;
        }
        let conf = self.dir.join("data").join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&conf).unwrap();
        for (name, value) in settings {
            let value = value.replace('\'', "''");
            text.push_str(&format!("{name} = '{value}'\n"));
        }
        std::fs::write(&conf, text).unwrap();
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

    /// Starts a new server, on another port if its own was taken meanwhile (the port was free
    /// when it was picked, not reserved), three times at most.
    fn first_start(&mut self) {
        for _ in 0..2 {
            let log = self.dir.join("server.log");
            let before = std::fs::metadata(&log).map_or(0, |m| m.len());
            if self.try_start().is_ok() {
                return;
            }
            let text = std::fs::read(&log).unwrap_or_default();
            let since = String::from_utf8_lossy(text.get(before as usize..).unwrap_or_default());
            if !since.contains("could not bind") {
                break;
            }
            self.port = free_port();
        }
        self.restart();
    }

    /// Starts the server again (after [`crash`](Self::crash)), waiting until it answers.
    pub fn restart(&self) {
        if let Err(why) = self.try_start() {
            panic!("{why}");
        }
    }

    /// [`restart`](Self::restart), or why it failed.
    fn try_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on \
             -c wal_level=replica -c max_wal_senders=10 -c wal_keep_size=64MB -c hot_standby=on \
             -c wal_retrieve_retry_interval=100ms",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log").display().to_string();
        let data = self.data();
        let start = [
            "-D", &data, "-o", &options, "-l", &log, "-w", "-t", "60", "start",
        ];
        self.try_run("pg_ctl", &start)
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

    /// Runs one of the server's binaries, which must succeed (else the panic shows the last
    /// lines of the server's log).
    fn run(&self, tool: &str, args: &[&str]) {
        if let Err(why) = self.try_run(tool, args) {
            panic!("{why}");
        }
    }

    /// Runs one of the server's binaries; if it fails, what it said and the last lines of the
    /// server's log.
    fn try_run(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let out = self.command(tool).args(args).output().unwrap();
        if out.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(30)..].join("\n");
        Err(format!(
            "{tool} {args:?} failed: {}\n{}\nserver.log:\n{tail}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
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
