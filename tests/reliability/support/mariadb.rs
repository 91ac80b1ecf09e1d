//! A private MariaDB server: `mariadb-install-db` into a temporary folder, its own port and
//! socket; as root the server runs as the `mysql` user. The machine's shared server on 3306 is
//! never touched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

use super::{free_port, hand_to, is_root, skip};

/// A MariaDB server of a test's own: its data folder, socket and port. Killed and removed on
/// drop.
pub struct Server {
    dir: PathBuf,
    port: u16,
    process: Option<Child>,
    /// More options of `mariadbd`, at each start.
    options: Vec<String>,
}

impl Server {
    /// Installs and starts a server; `None` (with a line saying why) where this machine has no
    /// MariaDB server binaries, which CI must have to run `test`.
    pub fn start(test: &str) -> Option<Server> {
        Server::start_with(test, &[])
    }

    /// [`start`](Server::start), with more options of `mariadbd` (such as `--ssl-cert=…`).
    pub fn start_with(test: &str, options: &[String]) -> Option<Server> {
        if !(on_path("mariadb-install-db") && on_path("mariadbd")) {
            return skip(
                test,
                "no MariaDB server binaries (mariadb-install-db, mariadbd) on PATH or in /usr/sbin",
            );
        }
        let dir = std::env::temp_dir().join(crate::common::unique_name("idem_mariadb"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Server {
            dir,
            port: free_port(),
            process: None,
            options: options.to_vec(),
        };
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data().display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if is_root() {
            install.arg("--user=mysql");
        }
        let out = install.output().unwrap();
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        hand_to("mysql", &server.dir);
        server.start_server();
        Some(server)
    }

    /// Replaces the more options of `mariadbd`, for its next start.
    pub fn set_options(&mut self, options: &[String]) {
        self.options = options.to_vec();
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its folder (`data/`, `server.log`), removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// How to reach it: user `root`, no database, no TLS.
    pub fn options(&self) -> MySqlConnectOptions {
        MySqlConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("root")
            .ssl_mode(MySqlSslMode::Disabled)
    }

    /// Starts the server (InnoDB recovers after a kill) and waits until it answers.
    pub fn start_server(&mut self) {
        if let Err(log) = self.try_start_server() {
            panic!("{log}");
        }
    }

    /// [`start_server`](Server::start_server), or what the server said as it exited at start.
    pub fn try_start_server(&mut self) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .unwrap();
        let mut command = Command::new(binary("mariadbd"));
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--innodb-buffer-pool-size=32M",
                // Durable commits: the default, said out loud.
                "--innodb-flush-log-at-trx-commit=1",
                "--skip-log-bin",
            ])
            .args(&self.options)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if is_root() {
            command.arg("--user=mysql");
        }
        self.process = Some(command.spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(120);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.process.as_mut().unwrap().try_wait().unwrap() {
                self.process = None;
                return Err(format!(
                    "mariadbd exited with {status} as it started:\n{}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "mariadbd did not answer in 120 s:\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The server's exit status if it exited without being killed by [`crash`](Server::crash)
    /// (mariadbd aborting on an assertion of its own).
    pub fn exited_by_itself(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.process.as_mut()?.try_wait().unwrap()?;
        self.process = None;
        Some(status)
    }

    /// What the server said before it stopped: its errors and failed assertions since it last
    /// started, then the last 40 lines of its log (an abort's backtrace alone fills those).
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines.len().saturating_sub(40);
        let started = lines[..tail]
            .iter()
            .rposition(|line| line.contains("Starting MariaDB"))
            .unwrap_or(0);
        let notable = lines[started..tail].iter().filter(|line| {
            ["[ERROR]", "ssertion", "got signal"]
                .iter()
                .any(|mark| line.contains(mark))
        });
        notable
            .chain(std::iter::once(&"[...]"))
            .chain(&lines[tail..])
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILLs the server: no shutdown, no flush beyond what each commit made durable.
    pub fn crash(&mut self) {
        let mut process = self.process.take().expect("the server runs");
        process.kill().unwrap();
        let status = process.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "{status}"
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where a MariaDB binary is: on PATH, or in /usr/sbin (mariadbd often is, outside root's PATH).
fn binary(name: &str) -> PathBuf {
    let sbin = Path::new("/usr/sbin").join(name);
    if sbin.is_file() {
        return sbin;
    }
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| PathBuf::from(name))
}

fn on_path(name: &str) -> bool {
    binary(name).is_file()
}
