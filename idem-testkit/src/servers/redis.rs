//! Private Redis servers: a Redis Cluster of masters, and one server that speaks TLS only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::tls::Certs;
use super::{free_port, program, unavailable};

/// How long a server may take to take connections, and a cluster to be `ok`.
const START_LIMIT: Duration = Duration::from_secs(30);

/// `redis-server` (on the `PATH`, in `/usr/sbin` or `/usr/bin`, or where `IDEM_REDIS_SERVER`
/// says), or `None` having said why (a failure with `CI` set).
fn redis_server(test: &str) -> Option<PathBuf> {
    let found = program(
        "IDEM_REDIS_SERVER",
        "redis-server",
        &["/usr/sbin", "/usr/bin"],
    );
    if found.is_none() {
        let why = "no redis-server on the PATH or in /usr/sbin; set IDEM_REDIS_SERVER";
        return unavailable(test, why);
    }
    found
}

/// A `redis-server` of its own in `dir`, logging to `<dir>/redis.log`, with `args`; waits until
/// `port` takes connections.
fn spawn(program: &Path, dir: &Path, port: u16, args: &[String]) -> Child {
    std::fs::create_dir_all(dir).unwrap();
    let child = Command::new(program)
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = child;
    let deadline = Instant::now() + START_LIMIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() >= deadline || child.try_wait().is_ok_and(|exit| exit.is_some()) {
            stop(&mut child);
            let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
            panic!("redis-server did not take connections on port {port} within {START_LIMIT:?}: {log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn stop(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A Redis Cluster of a test's own: `masters` masters and no replicas, each a `redis-server`
/// in cluster mode on its own port (and cluster bus port) with its own folder, joined with
/// `redis-cli --cluster create` and `ok` before [`start`](Self::start) returns. Each master
/// writes its append-only file at every write (`appendfsync always`), so that one
/// [`kill`](Self::kill)ed and [`restart`](Self::restart)ed loses nothing. Killed and its
/// folders removed on drop.
pub struct RedisCluster {
    dir: PathBuf,
    server: PathBuf,
    cli: PathBuf,
    ports: Vec<u16>,
    /// Each master's `redis-server` arguments.
    args: Vec<Vec<String>>,
    /// Replicas of each master.
    replicas: usize,
    children: Mutex<Vec<Option<Child>>>,
}

impl RedisCluster {
    /// Starts `masters` (at least 3, as Redis asks) servers in folders under a new one named
    /// after `name`, joins them and waits (up to 30 s) until every node says `cluster_state:ok`.
    /// `None`, having said why, where this machine has no `redis-server` or `redis-cli` (see
    /// [`RedisServer::start_tls`]; `IDEM_REDIS_CLI` names the latter); with `CI` set that is a
    /// failure, since CI must run what `test` names.
    pub fn start(name: &str, test: &str, masters: usize) -> Option<RedisCluster> {
        RedisCluster::start_with_replicas(name, test, masters, 0)
    }

    /// [`start`](Self::start) with `replicas` replicas of each master (`redis-cli` picks which
    /// nodes; [`urls`](Self::urls) lists them all), and a node time-out of 1 s, so that a master
    /// [`kill`](Self::kill)ed fails over to one of its replicas within a few seconds.
    pub fn start_with_replicas(
        name: &str,
        test: &str,
        masters: usize,
        replicas: usize,
    ) -> Option<RedisCluster> {
        let server = redis_server(test)?;
        let Some(cli) = program("IDEM_REDIS_CLI", "redis-cli", &["/usr/bin"]) else {
            let why = "no redis-cli on the PATH or in /usr/bin; set IDEM_REDIS_CLI";
            return unavailable(test, why);
        };
        let dir = std::env::temp_dir().join(crate::backends::unique_name(name));
        let mut cluster = RedisCluster {
            dir,
            server,
            cli,
            ports: Vec::new(),
            args: Vec::new(),
            replicas,
            children: Mutex::new(Vec::new()),
        };
        let timeout = if replicas > 0 { "1000" } else { "5000" };
        for _ in 0..masters.max(3) * (1 + replicas) {
            let port = free_port();
            let node = cluster.dir.join(port.to_string());
            let args = [
                "--port".to_string(),
                port.to_string(),
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                node.join("nodes.conf").display().to_string(),
                "--cluster-port".into(),
                free_port().to_string(),
                "--cluster-node-timeout".into(),
                timeout.into(),
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                "always".into(),
            ];
            let child = spawn(&cluster.server, &node, port, &args);
            cluster.ports.push(port);
            cluster.args.push(args.to_vec());
            cluster.children.lock().unwrap().push(Some(child));
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let created = Command::new(&cluster.cli)
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        cluster.wait_ok();
        Some(cluster)
    }

    /// `redis-cli -p <port of master i> <args>`: its output.
    fn cli(&self, i: usize, args: &[&str]) -> String {
        let out = Command::new(&self.cli)
            .args(["-p", &self.ports[i].to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits (up to 30 s) until every node says `cluster_state:ok`.
    fn wait_ok(&self) {
        self.wait_ok_without(None);
    }

    /// Waits (up to 30 s) until every node but `down` (one killed) says `cluster_state:ok`:
    /// after a master's [`kill`](Self::kill), once a replica has taken its slots over.
    pub fn wait_ok_without(&self, down: Option<usize>) {
        let deadline = Instant::now() + START_LIMIT;
        for i in (0..self.ports.len()).filter(|&i| Some(i) != down) {
            while !self
                .cli(i, &["cluster", "info"])
                .contains("cluster_state:ok")
            {
                assert!(
                    Instant::now() < deadline,
                    "the cluster was not ok within {START_LIMIT:?} (logs in {})",
                    self.dir.display()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The index of the master that serves `key`'s hash slot.
    pub fn master_of(&self, key: &str) -> usize {
        self.serving(key).expect("a master serves every slot")
    }

    /// The node that serves `key`'s hash slot by its own account, if a live one does.
    fn serving(&self, key: &str) -> Option<usize> {
        // Asked of the first node that answers (one may be killed).
        let slot: u16 = (0..self.ports.len())
            .find_map(|i| {
                self.cli(i, &["cluster", "keyslot", key])
                    .trim()
                    .parse()
                    .ok()
            })
            .expect("a live node");
        (0..self.ports.len()).find(|&i| {
            let nodes = self.cli(i, &["cluster", "nodes"]);
            let Some(myself) = nodes.lines().find(|l| l.contains("myself")) else {
                return false;
            };
            // `<id> <addr> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges>...`
            myself.split_whitespace().skip(8).any(|range| {
                let (from, to) = range.split_once('-').unwrap_or((range, range));
                match (from.parse::<u16>(), to.parse::<u16>()) {
                    (Ok(from), Ok(to)) => (from..=to).contains(&slot),
                    _ => false,
                }
            })
        })
    }

    /// After master `i` serving `key` was [`kill`](Self::kill)ed: waits (up to 30 s) until
    /// another node (its replica, promoted) serves `key`'s slot and the others say
    /// `cluster_state:ok`.
    pub fn wait_failover(&self, i: usize, key: &str) {
        let deadline = Instant::now() + START_LIMIT;
        while self.serving(key).is_none_or(|node| node == i) {
            assert!(
                Instant::now() < deadline,
                "no replica took node {i}'s slots within {START_LIMIT:?} (logs in {})",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.wait_ok_without(Some(i));
    }

    /// Starts master `i` again (after [`kill`](Self::kill)) on its port, folder and append-only
    /// file, and waits (up to 30 s) until the cluster is `ok` again.
    pub fn restart(&self, i: usize) {
        let node = self.dir.join(self.ports[i].to_string());
        let child = spawn(&self.server, &node, self.ports[i], &self.args[i]);
        self.children.lock().unwrap()[i] = Some(child);
        self.wait_ok();
    }

    /// Waits (up to 30 s) until every replica of master `i` has its replication offset: what
    /// the master has written is on each of its replicas, online, so a failover loses none of
    /// it (at once on a cluster without replicas).
    pub fn wait_replicated(&self, i: usize) {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let info = self.cli(i, &["info", "replication"]);
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.trim().strip_prefix(name))
                    .map(str::to_string)
            };
            let offset = field("master_repl_offset:").unwrap_or_default();
            let replicas: Vec<&str> = info
                .lines()
                .filter(|l| l.starts_with("slave") && l.contains("offset="))
                .collect();
            let caught_up = replicas.len() >= self.replicas
                && replicas.iter().all(|l| {
                    l.contains("state=online") && l.contains(&format!("offset={offset},"))
                });
            if caught_up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replicas of node {i} did not catch up within {START_LIMIT:?}: {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Each node's URL, `redis://127.0.0.1:<port>` (the seeds of a cluster client).
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// Stops master `i` dead (SIGKILL) and waits for it to be gone.
    pub fn kill(&self, i: usize) {
        if let Some(mut child) = self.children.lock().unwrap()[i].take() {
            stop(&mut child);
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        for mut child in children.iter_mut().filter_map(Option::take) {
            stop(&mut child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `redis-server` of a test's own, with its own port and folder; killed and its folder
/// removed on drop.
pub struct RedisServer {
    dir: PathBuf,
    port: u16,
    tls: bool,
    child: Mutex<Option<Child>>,
}

impl RedisServer {
    /// Starts a plain server with more command-line options (for example
    /// `["--requirepass", "secret"]`), with a folder named after `name`; waits (up to 30 s)
    /// until it takes connections. `None` (or a failure in CI) as [`start_tls`](Self::start_tls).
    pub fn start_with(name: &str, test: &str, options: &[&str]) -> Option<RedisServer> {
        let server = redis_server(test)?;
        let dir = std::env::temp_dir().join(crate::backends::unique_name(name));
        let port = free_port();
        let mut args = vec!["--port".to_string(), port.to_string()];
        args.extend(options.iter().map(|o| o.to_string()));
        let child = spawn(&server, &dir, port, &args);
        Some(RedisServer {
            dir,
            port,
            tls: false,
            child: Mutex::new(Some(child)),
        })
    }

    /// Starts a server that speaks TLS only (no plain port), serving `certs`' server
    /// certificate and not asking clients for one, with a folder named after `name`; waits
    /// (up to 30 s) until it takes connections. `None`, having said why, where this machine has
    /// no `redis-server` (on the `PATH`, in `/usr/sbin` or `/usr/bin`, or where
    /// `IDEM_REDIS_SERVER` says); with `CI` set that is a failure. The program must be built
    /// with TLS (Debian's is).
    pub fn start_tls(name: &str, test: &str, certs: &Certs) -> Option<RedisServer> {
        let server = redis_server(test)?;
        let dir = std::env::temp_dir().join(crate::backends::unique_name(name));
        let port = free_port();
        let path = |p: PathBuf| p.display().to_string();
        let args = [
            "--port".to_string(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(certs.server_cert()),
            "--tls-key-file".into(),
            path(certs.server_key()),
            "--tls-ca-cert-file".into(),
            path(certs.ca()),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        let child = spawn(&server, &dir, port, &args);
        Some(RedisServer {
            dir,
            port,
            tls: true,
            child: Mutex::new(Some(child)),
        })
    }

    /// Its URL: `rediss://127.0.0.1:<port>` with TLS, else `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let taken = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut child) = taken {
            stop(&mut child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
