//! A TCP endpoint that a test moves from one server to another, as a virtual IP or a proxy in
//! front of a database would: clients connect to its port; each connection is forwarded, bytes
//! as they are, to the server it points at when the connection is made. Moving it (or
//! [`sever`](Endpoint::sever)ing) ends the connections it holds; while it points nowhere it
//! closes new ones at once. It can also hold back what servers send (their replies, or the WAL
//! a primary streams to a replica) as a slow network would, or, reading the clients' messages,
//! only the replies to their `COMMIT`s: held bytes reach no one if the connections are severed
//! meanwhile.

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::proxy::Protocol;

/// See the module.
pub struct Endpoint {
    port: u16,
    shared: Arc<Shared>,
    listener: AbortHandle,
}

struct Shared {
    /// The server's port on 127.0.0.1; 0 for none.
    target: AtomicU16,
    /// Whether the servers' bytes are held back.
    held: AtomicBool,
    /// Whether a connection's replies are held back once its client sent a `COMMIT`.
    commits_held: AtomicBool,
    /// The clients' protocol, for `commits_held`.
    protocol: Option<Protocol>,
    /// The relays of the open connections.
    relays: Mutex<Vec<AbortHandle>>,
}

impl Endpoint {
    /// Listens on a port of its own, pointing at the server on `127.0.0.1:target`; `protocol`,
    /// if given, is the clients' (for [`hold_commit_replies`](Endpoint::hold_commit_replies)).
    pub async fn start(target: u16, protocol: Option<Protocol>) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            target: AtomicU16::new(target),
            held: AtomicBool::new(false),
            commits_held: AtomicBool::new(false),
            protocol,
            relays: Mutex::new(Vec::new()),
        });
        let accepting = shared.clone();
        let listener = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = accepting.target.load(Ordering::SeqCst);
                if target == 0 {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let relay = tokio::spawn(relay(client, server, accepting.clone()));
                let mut relays = accepting.relays.lock().unwrap();
                relays.retain(|r| !r.is_finished());
                relays.push(relay.abort_handle());
            }
        })
        .abort_handle();
        Endpoint {
            port,
            shared,
            listener,
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Ends every connection it holds, dropping what it held back.
    pub fn sever(&self) {
        for relay in self.shared.relays.lock().unwrap().drain(..) {
            relay.abort();
        }
    }

    /// Points new connections at the server on `127.0.0.1:target`, or nowhere (`None`: they
    /// are closed at once), having ended those it holds.
    pub fn point(&self, target: Option<u16>) {
        self.shared
            .target
            .store(target.unwrap_or(0), Ordering::SeqCst);
        self.sever();
    }

    /// Holds back (`true`) or passes again (`false`) what the servers send.
    pub fn hold(&self, held: bool) {
        self.shared.held.store(held, Ordering::SeqCst);
    }

    /// From now on (`true`), holds back what a server sends on a connection once its client
    /// sent a `COMMIT`: the transaction commits, and its client waits for the reply; `false`
    /// passes them again. Needs the clients' protocol.
    pub fn hold_commit_replies(&self, held: bool) {
        assert!(
            self.shared.protocol.is_some(),
            "no protocol to find COMMITs in"
        );
        self.shared.commits_held.store(held, Ordering::SeqCst);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.listener.abort();
        self.sever();
    }
}

/// Copies both ways until either side closes; the server's side waits while held.
async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    // Set once this connection's client sent a COMMIT while commits were held.
    let after_commit = Arc::new(AtomicBool::new(false));
    let upward = {
        let (shared, after_commit) = (shared.clone(), after_commit.clone());
        async move {
            if let Some(protocol) = shared.protocol {
                let mut started = false;
                while let Some((message, is_commit)) =
                    protocol.next(&mut client_rx, &mut started).await
                {
                    if is_commit && shared.commits_held.load(Ordering::SeqCst) {
                        after_commit.store(true, Ordering::SeqCst);
                    }
                    if server_tx.write_all(&message).await.is_err() {
                        break;
                    }
                }
                return;
            }
            let mut buf = vec![0_u8; 16 * 1024];
            loop {
                match client_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if server_tx.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    };
    let held = move || {
        shared.held.load(Ordering::SeqCst)
            || (after_commit.load(Ordering::SeqCst) && shared.commits_held.load(Ordering::SeqCst))
    };
    let downward = async move {
        let mut buf = vec![0_u8; 16 * 1024];
        loop {
            while held() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    // Bytes read just as a hold began wait too.
                    while held() {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    if client_tx.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    // Either direction ending ends the connection (both halves dropped).
    tokio::select! {
        () = upward => {}
        () = downward => {}
    }
}
