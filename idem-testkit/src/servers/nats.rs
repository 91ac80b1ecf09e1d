//! Private NATS servers with JetStream: one server ([`NatsServer`], in plain TCP or with TLS)
//! and a cluster of them ([`NatsCluster`]).

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::tls::Certs;
use super::{free_port, program, unavailable};

/// The `nats-server` program: `IDEM_NATS_SERVER`, else on the `PATH` or in `/usr/sbin`;
/// `None` (said why, or a panic under `CI`) where there is none.
fn nats_server(test: &str) -> Option<PathBuf> {
    let found = program("IDEM_NATS_SERVER", "nats-server", &["/usr/sbin"]);
    if found.is_none() {
        let why = "no nats-server on the PATH or in /usr/sbin; set IDEM_NATS_SERVER";
        return unavailable(test, why);
    }
    found
}

/// A new folder in the temporary directory, named after `name` and unique.
fn new_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(crate::backends::unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A quoted string for a nats-server configuration file.
fn quoted(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// Starts `program` with `args`, its stderr appended to `log` (kept across restarts).
fn spawn(program: &Path, args: &[String], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Waits (up to `limit`) until 127.0.0.1:`port` takes connections; panics naming `log` after.
fn wait_for_port(port: u16, limit: Duration, log: &Path) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nats-server did not take connections on port {port} within {limit:?} (log in {})",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A NATS server with JetStream of one test's own: its own port and store folder (kept across
/// a [`kill`](Self::kill) and [`restart`](Self::restart), so streams and consumers survive),
/// in plain TCP or, from [`start_tls`](Self::start_tls), with TLS only. Killed and its folder
/// removed on drop.
pub struct NatsServer {
    program: PathBuf,
    dir: PathBuf,
    port: u16,
    tls: bool,
    options: Vec<String>,
    child: Mutex<Option<Child>>,
}

impl NatsServer {
    /// Starts a server with its store in a new folder named after `name`, waiting until it
    /// takes connections. `None`, having said why, where this machine has no `nats-server`
    /// (on the `PATH`, in `/usr/sbin`, or where `IDEM_NATS_SERVER` says); with `CI` set that is
    /// a failure, since CI must run what `test` names.
    pub fn start(name: &str, test: &str) -> Option<NatsServer> {
        NatsServer::with(name, test, None, &[])
    }

    /// [`start`](Self::start), with more command-line options for the server (for example
    /// `["--user", "ada", "--pass", "secret"]`, or `["--auth", "token"]`).
    pub fn start_with(name: &str, test: &str, options: &[&str]) -> Option<NatsServer> {
        NatsServer::with(name, test, None, options)
    }

    /// [`start`](Self::start), with a server that speaks TLS only, with `certs`' server
    /// certificate (for `localhost` and `127.0.0.1`) and key; its [`url`](Self::url) is
    /// `tls://127.0.0.1:<port>`. A client must trust [`Certs::ca`].
    pub fn start_tls(name: &str, test: &str, certs: &Certs) -> Option<NatsServer> {
        NatsServer::with(name, test, Some(certs), &[])
    }

    fn with(name: &str, test: &str, certs: Option<&Certs>, options: &[&str]) -> Option<NatsServer> {
        let program = nats_server(test)?;
        let dir = new_dir(name);
        if let Some(certs) = certs {
            // The `tls` block: the server's certificate and key; `ca_file` is the authority
            // of client certificates, which this server does not ask for (no `verify`).
            let config = format!(
                "tls {{\n  cert_file: {}\n  key_file: {}\n  ca_file: {}\n  timeout: 2\n}}\n",
                quoted(&certs.server_cert()),
                quoted(&certs.server_key()),
                quoted(&certs.ca()),
            );
            std::fs::write(dir.join("server.conf"), config).unwrap();
        }
        let server = NatsServer {
            program,
            dir,
            port: free_port(),
            tls: certs.is_some(),
            options: options.iter().map(|o| o.to_string()).collect(),
            child: Mutex::new(None),
        };
        server.restart();
        Some(server)
    }

    /// Its URL: `nats://127.0.0.1:<port>`, or `tls://127.0.0.1:<port>` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Its client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the server again on the same port and store (after [`kill`](Self::kill)),
    /// waiting (up to 30 s) until it takes connections.
    pub fn restart(&self) {
        let mut args: Vec<String> = Vec::new();
        if self.tls {
            args.push("-c".into());
            args.push(self.dir.join("server.conf").display().to_string());
        }
        let store = self.dir.join("store").display().to_string();
        let port = self.port.to_string();
        args.extend(["-a", "127.0.0.1", "-p", &port, "-js", "-sd", &store].map(String::from));
        args.extend(self.options.iter().cloned());
        let log = self.dir.join("server.log");
        *self.child.lock().unwrap() = Some(spawn(&self.program, &args, &log));
        wait_for_port(self.port, Duration::from_secs(30), &log);
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

/// One node of a [`NatsCluster`].
struct Node {
    name: String,
    port: u16,
    monitor: u16,
    config: PathBuf,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

/// A JetStream cluster of private `nats-server` processes of one test's own: each node has its
/// own client, cluster and monitoring ports, store folder and `server_name` (`n0`, `n1`, ...),
/// written into a configuration file per node (`cluster { name, listen, routes }`,
/// `jetstream { store_dir }`). A node can be SIGKILLed and started again on the same ports and
/// store. Every node is killed and the folder removed on drop.
pub struct NatsCluster {
    program: PathBuf,
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl NatsCluster {
    /// Starts `size` nodes (at least 3, for JetStream's quorum) as one cluster in a new folder
    /// named after `name`, and waits (up to 60 s) until every node takes connections and says
    /// it is healthy (`/healthz`: JetStream has a meta leader and the node is current). `None`,
    /// having said why, where this machine has no `nats-server` (as [`NatsServer::start`]).
    pub fn start(name: &str, test: &str, size: usize) -> Option<NatsCluster> {
        let program = nats_server(test)?;
        let dir = new_dir(name);
        let size = size.max(3);
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, &(port, cluster, monitor))| {
                let name = format!("n{i}");
                let routes: Vec<String> = ports
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, (_, route, _))| format!("nats-route://127.0.0.1:{route}"))
                    .collect();
                let config = format!(
                    "server_name: {name}\n\
                     listen: 127.0.0.1:{port}\n\
                     http: 127.0.0.1:{monitor}\n\
                     jetstream {{\n  store_dir: {store}\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}}\n\
                     cluster {{\n  name: idem\n  listen: 127.0.0.1:{cluster}\n  routes: [{routes}]\n}}\n",
                    store = quoted(&dir.join(&name).join("store")),
                    routes = routes.join(", "),
                );
                let path = dir.join(format!("{name}.conf"));
                std::fs::write(&path, config).unwrap();
                Node {
                    log: dir.join(format!("{name}.log")),
                    name,
                    port,
                    monitor,
                    config: path,
                    child: Mutex::new(None),
                }
            })
            .collect();
        let cluster = NatsCluster {
            program,
            dir,
            nodes,
        };
        for node in 0..size {
            cluster.spawn(node);
        }
        for node in 0..size {
            let log = &cluster.nodes[node].log;
            wait_for_port(cluster.nodes[node].port, Duration::from_secs(30), log);
        }
        for node in 0..size {
            cluster.wait_healthy(node, Duration::from_secs(60));
        }
        Some(cluster)
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no node (never: at least 3).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `node`'s URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self, node: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[node].port)
    }

    /// Every node's URL, `first`'s first, separated by commas (as async-nats takes them).
    pub fn urls(&self, first: usize) -> String {
        let mut urls = vec![self.url(first)];
        urls.extend((0..self.len()).filter(|n| *n != first).map(|n| self.url(n)));
        urls.join(",")
    }

    /// Node `node`'s `server_name` (`n<node>`), as JetStream names a stream's or consumer's
    /// leader.
    pub fn name(&self, node: usize) -> &str {
        &self.nodes[node].name
    }

    /// The node whose `server_name` is `name`.
    pub fn node_named(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The folder of the configuration files, logs (`n<i>.log`) and stores.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn spawn(&self, node: usize) {
        let n = &self.nodes[node];
        let args = vec!["-c".to_string(), n.config.display().to_string()];
        *n.child.lock().unwrap() = Some(spawn(&self.program, &args, &n.log));
    }

    /// Stops node `node` dead (SIGKILL) and waits for it to be gone.
    pub fn kill(&self, node: usize) {
        if let Some(mut child) = self.nodes[node].child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `node` again on its ports and store (after [`kill`](Self::kill)) and waits
    /// until it takes connections (up to 30 s); [`healthy`](Self::healthy) says when it has
    /// caught up.
    pub fn restart(&self, node: usize) {
        self.spawn(node);
        let n = &self.nodes[node];
        wait_for_port(n.port, Duration::from_secs(30), &n.log);
    }

    /// Whether node `node`'s monitoring endpoint `/healthz` answers 200: the server runs, its
    /// JetStream has a meta leader, and its streams and consumers are current.
    pub fn healthy(&self, node: usize) -> bool {
        self.get(node, "/healthz")
            .is_some_and(|(status, _)| status.split(' ').nth(1) == Some("200"))
    }

    /// The body of node `node`'s monitoring endpoint `path` (`/connz`, `/jsz`, ...), if it
    /// answers.
    pub fn monitor(&self, node: usize, path: &str) -> Option<String> {
        self.get(node, path).map(|(_, body)| body)
    }

    /// An HTTP GET of `path` on node `node`'s monitoring port: the status line and the body.
    fn get(&self, node: usize, path: &str) -> Option<(String, String)> {
        let port = self.nodes[node].monitor;
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        let status = head.lines().next()?.to_string();
        Some((status, body.to_string()))
    }

    /// Waits until node `node` is [`healthy`](Self::healthy); panics after `limit`.
    pub fn wait_healthy(&self, node: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.healthy(node) {
            assert!(
                Instant::now() < deadline,
                "nats-server {} not healthy within {limit:?} (log in {})",
                self.nodes[node].name,
                self.nodes[node].log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in 0..self.nodes.len() {
            self.kill(node);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
