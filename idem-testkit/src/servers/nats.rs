//! A private NATS server with JetStream.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{free_port, program, unavailable};

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
        let Some(program) = program("IDEM_NATS_SERVER", "nats-server", &["/usr/sbin"]) else {
            let why = "no nats-server on the PATH or in /usr/sbin; set IDEM_NATS_SERVER";
            return unavailable(test, why);
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
