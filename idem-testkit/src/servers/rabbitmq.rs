//! Private RabbitMQ nodes: one alone (optionally with a TLS listener), or three clustered.
//!
//! A node runs the `rabbitmq-server` script of the machine's installation with a node name,
//! ports, database, logs, configuration and plugins file of its own, and a `HOME` of its own
//! whose `.erlang.cookie` only the test's nodes share (the machine's own node and its cookie are
//! never touched). They share the machine's `epmd` (started by the first node if none runs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::tls::Certs;
use super::{free_port, unavailable};

/// How long a node may take to start (a cold start takes 10–30 s on a busy machine).
const START_LIMIT: Duration = Duration::from_secs(120);

/// A `HOME` with an Erlang cookie: the nodes of one test (and its `rabbitmqctl` calls) share
/// it; removed when the last of them is dropped.
#[derive(Debug)]
struct Home {
    dir: PathBuf,
}

impl Home {
    fn new(name: &str) -> Home {
        let dir = std::env::temp_dir().join(crate::backends::unique_name(&format!("{name}_home")));
        std::fs::create_dir_all(&dir).unwrap();
        let cookie = dir.join(".erlang.cookie");
        let secret = crate::backends::unique_name("idemcookie").replace('_', "");
        std::fs::write(&cookie, secret).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o400)).unwrap();
        Home { dir }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A RabbitMQ node of one test's own: its own node name (`idem-…@localhost`), AMQP port (and
/// TLS port, with [`start_tls`](Self::start_tls)), distribution port and data folder (kept
/// across a [`kill`](Self::kill) and [`restart`](Self::restart), so durable queues and the
/// cluster membership survive). User `guest`, password `guest`, virtual host `/`. Killed and
/// its folder removed on drop.
#[derive(Debug)]
pub struct RabbitNode {
    server: PathBuf,
    ctl: PathBuf,
    home: Arc<Home>,
    dir: PathBuf,
    node: String,
    port: u16,
    tls_port: Option<u16>,
    dist_port: u16,
    child: Mutex<Option<Child>>,
    started_in: Mutex<Duration>,
}

impl RabbitNode {
    /// Starts a node with a plain AMQP listener, waiting until it takes connections. `None`,
    /// having said why, where this machine has no RabbitMQ server (see
    /// [`programs`](Self::programs)); with `CI` set that is a failure, since CI must run what
    /// `test` names.
    pub fn start(name: &str, test: &str) -> Option<RabbitNode> {
        let (server, ctl) = Self::programs(test)?;
        let node = Self::new(server, ctl, Arc::new(Home::new(name)), name, None);
        node.restart();
        Some(node)
    }

    /// [`start`](Self::start), with a TLS listener too (see [`amqps_url`](Self::amqps_url))
    /// serving `certs`' server certificate; clients are not asked for a certificate.
    pub fn start_tls(name: &str, test: &str, certs: &Certs) -> Option<RabbitNode> {
        let (server, ctl) = Self::programs(test)?;
        let node = Self::new(server, ctl, Arc::new(Home::new(name)), name, Some(certs));
        node.restart();
        Some(node)
    }

    /// `n` nodes (at least 1) started at once, the others then joined to the first
    /// (`rabbitmqctl join_cluster`). `None` as [`start`](Self::start) says.
    pub fn cluster(name: &str, test: &str, n: usize) -> Option<Vec<RabbitNode>> {
        let (server, ctl) = Self::programs(test)?;
        let home = Arc::new(Home::new(name));
        let nodes: Vec<RabbitNode> = (0..n.max(1))
            .map(|i| {
                let name = format!("{name}{i}");
                Self::new(server.clone(), ctl.clone(), home.clone(), &name, None)
            })
            .collect();
        std::thread::scope(|scope| {
            for node in &nodes {
                scope.spawn(|| node.restart());
            }
        });
        std::thread::scope(|scope| {
            for node in &nodes[1..] {
                scope.spawn(|| node.join_cluster(&nodes[0]));
            }
        });
        Some(nodes)
    }

    /// The server script and `rabbitmqctl` beside it: where `IDEM_RABBITMQ_SERVER` says, else
    /// `/usr/lib/rabbitmq/bin` (Debian's, which runs as the calling user; `/usr/sbin`'s wrapper
    /// switches to the `rabbitmq` user and its `HOME`), else the first on the `PATH`.
    pub fn programs(test: &str) -> Option<(PathBuf, PathBuf)> {
        let debian = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
        let server = std::env::var_os("IDEM_RABBITMQ_SERVER")
            .map(PathBuf::from)
            .or_else(|| debian.is_file().then_some(debian))
            .or_else(|| super::program("IDEM_RABBITMQ_SERVER", "rabbitmq-server", &[]));
        let Some(server) = server else {
            let why = "no rabbitmq-server in /usr/lib/rabbitmq/bin or on the PATH; set \
                       IDEM_RABBITMQ_SERVER";
            return unavailable(test, why);
        };
        let ctl = server.with_file_name("rabbitmqctl");
        if !ctl.is_file() {
            let why = format!("no rabbitmqctl beside {}", server.display());
            return unavailable(test, &why);
        }
        Some((server, ctl))
    }

    fn new(
        server: PathBuf,
        ctl: PathBuf,
        home: Arc<Home>,
        name: &str,
        certs: Option<&Certs>,
    ) -> RabbitNode {
        let unique = crate::backends::unique_name(name).replace('_', "-");
        let dir = std::env::temp_dir().join(&unique);
        std::fs::create_dir_all(dir.join("log")).unwrap();
        let tls_port = certs.map(|_| free_port());
        let mut conf = String::from("loopback_users = none\n");
        if let (Some(certs), Some(port)) = (certs, tls_port) {
            conf.push_str(&format!(
                "listeners.ssl.default = {port}\n\
                 ssl_options.cacertfile = {}\n\
                 ssl_options.certfile = {}\n\
                 ssl_options.keyfile = {}\n\
                 ssl_options.verify = verify_none\n\
                 ssl_options.fail_if_no_peer_cert = false\n",
                certs.ca().display(),
                certs.server_cert().display(),
                certs.server_key().display(),
            ));
        }
        std::fs::write(dir.join("rabbitmq.conf"), conf).unwrap();
        std::fs::write(dir.join("rabbitmq-env.conf"), "").unwrap();
        std::fs::write(dir.join("enabled_plugins"), "").unwrap();
        RabbitNode {
            server,
            ctl,
            home,
            node: format!("{unique}@localhost"),
            dir,
            port: free_port(),
            tls_port,
            dist_port: free_port(),
            child: Mutex::new(None),
            started_in: Mutex::new(Duration::ZERO),
        }
    }

    /// Its Erlang node name, `idem-…@localhost`.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Its AMQP URL, `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Its AMQP-over-TLS URL, `amqps://guest:guest@localhost:<port>/%2f` (the server
    /// certificate names `localhost`), when started with [`start_tls`](Self::start_tls).
    pub fn amqps_url(&self) -> Option<String> {
        let port = self.tls_port?;
        Some(format!("amqps://guest:guest@localhost:{port}/%2f"))
    }

    /// How long its last (re)start took, until it took connections.
    pub fn started_in(&self) -> Duration {
        *self.started_in.lock().unwrap()
    }

    /// The resident memory of its Erlang VM now, in KiB (`VmRSS`), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = std::fs::read_to_string(self.dir.join("pid")).ok()?;
        let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).ok()?;
        let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Starts the node (again, after [`kill`](Self::kill)) on the same ports and data, waiting
    /// (up to 120 s) until it takes connections on each listener.
    pub fn restart(&self) {
        let started = Instant::now();
        let _ = std::fs::remove_file(self.dir.join("pid"));
        let out = std::fs::File::create(self.dir.join("server.out")).unwrap();
        let err = out.try_clone().unwrap();
        let mut command = Command::new(&self.server);
        self.env(&mut command)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                self.dir.join("advanced.config"),
            )
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.dir.join("enabled_plugins"),
            )
            .env("RABBITMQ_PID_FILE", self.dir.join("pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // A process group of its own: `kill` ends the script, the VM and its helpers at once.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().unwrap();
        let pid = child.id();
        *self.child.lock().unwrap() = Some(child);
        let ports = std::iter::once(self.port).chain(self.tls_port);
        for port in ports {
            while !self.listens(port) {
                let exited = self
                    .child
                    .lock()
                    .unwrap()
                    .as_mut()
                    .and_then(|child| child.try_wait().ok().flatten());
                assert!(
                    exited.is_none() && started.elapsed() < START_LIMIT,
                    "RabbitMQ node {} (pid {pid}) did not take connections on port {port} \
                     within {START_LIMIT:?} (exit: {exited:?}; logs in {})",
                    self.node,
                    self.dir.display()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        *self.started_in.lock().unwrap() = started.elapsed();
    }

    /// Whether the node listens on `port`: its pid file written (early in its boot) and a
    /// connection taken (not a loopback connection to itself, which an unused port of the
    /// ephemeral range can give).
    fn listens(&self, port: u16) -> bool {
        if !self.dir.join("pid").is_file() {
            return false;
        }
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => stream.local_addr().ok() != stream.peer_addr().ok(),
            Err(_) => false,
        }
    }

    /// Stops the node dead: SIGKILL to its VM (and the script that started it), waiting for
    /// them to be gone. Its connections drop at once, as when a machine dies.
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let group = child.id() as libc::pid_t;
            // SAFETY: killpg has no memory preconditions; the group is the child's own.
            unsafe { libc::killpg(group, libc::SIGKILL) };
            let _ = child.wait();
        }
    }

    /// Runs `rabbitmqctl -n <node> args…` (with the nodes' `HOME` and cookie) and gives its
    /// output; panics, with that output, if it fails.
    pub fn ctl(&self, args: &[&str]) -> Output {
        let mut command = Command::new(&self.ctl);
        let output = self
            .env(&mut command)
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "rabbitmqctl -n {} {args:?}: {}{}",
            self.node,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// Joins this (running) node to `seed`'s cluster: `stop_app`, `join_cluster`, `start_app`.
    pub fn join_cluster(&self, seed: &RabbitNode) {
        self.ctl(&["stop_app"]);
        self.ctl(&["join_cluster", seed.node()]);
        self.ctl(&["start_app"]);
        self.ctl(&["await_startup"]);
    }

    /// The nodes of its cluster that run, as it sees them.
    pub fn running_nodes(&self) -> Vec<String> {
        let output = self.ctl(&["eval", "rabbit_nodes:all_running()."]);
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|node| node.trim().trim_matches('\'').to_string())
            .filter(|node| !node.is_empty())
            .collect()
    }

    fn env<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command
            .env("HOME", &self.home.dir)
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_CONF_ENV_FILE", self.dir.join("rabbitmq-env.conf"))
    }

    /// Its folder (data, logs, configuration).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
