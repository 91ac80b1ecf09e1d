//! A TCP proxy between idem and a database server that reads the client's messages, so that it
//! can cut a connection at its `COMMIT`: the commit the caller cannot know the fate of.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};

/// When the proxy cuts the next `COMMIT` it sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Cut {
    Never = 0,
    /// Forward the COMMIT to the server, then cut before its reply reaches the client.
    AfterCommit = 1,
    /// Cut without forwarding the COMMIT: the server rolls the transaction back.
    BeforeCommit = 2,
}

/// The wire protocol the proxy reads the client's messages in.
#[derive(Debug, Clone, Copy)]
pub enum Protocol {
    /// A type byte and a 4-byte big-endian length (the startup message has no type byte); a
    /// simple query `Q` of `COMMIT`.
    Postgres,
    /// Packets of a 3-byte little-endian length and a sequence number; a `COM_QUERY` of `COMMIT`.
    MySql,
}

/// `COM_QUERY`: a text statement follows.
const COM_QUERY: u8 = 0x03;

impl Protocol {
    /// The client's next message, whole, and whether it is a `COMMIT`; `None` when the client
    /// is gone. `started` is false until the first message has been read.
    pub async fn next(
        self,
        client: &mut OwnedReadHalf,
        started: &mut bool,
    ) -> Option<(Vec<u8>, bool)> {
        let (head_len, typed) = match self {
            Protocol::Postgres if *started => (5, true),
            Protocol::Postgres => (4, false),
            Protocol::MySql => (4, false),
        };
        let mut frame = vec![0_u8; head_len];
        client.read_exact(&mut frame).await.ok()?;
        let len = match self {
            Protocol::Postgres => {
                let at = head_len - 4;
                (u32::from_be_bytes(frame[at..].try_into().unwrap()) as usize).saturating_sub(4)
            }
            Protocol::MySql => u32::from_le_bytes([frame[0], frame[1], frame[2], 0]) as usize,
        };
        let mut body = vec![0_u8; len];
        client.read_exact(&mut body).await.ok()?;
        let is_commit = match self {
            Protocol::Postgres => typed && frame[0] == b'Q' && body.starts_with(b"COMMIT\0"),
            Protocol::MySql => {
                body.first() == Some(&COM_QUERY) && body[1..].eq_ignore_ascii_case(b"COMMIT")
            }
        };
        *started = true;
        frame.extend_from_slice(&body);
        Some((frame, is_commit))
    }
}

/// Forwards connections to a server, cutting one at its `COMMIT` once per arming.
pub struct Proxy {
    port: u16,
    armed: Arc<AtomicU8>,
}

impl Proxy {
    /// Listens on a port of its own for connections to the server at `host:port`.
    pub async fn start(host: &str, port: u16, protocol: Protocol) -> Proxy {
        let upstream = format!("{host}:{port}");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let armed = Arc::new(AtomicU8::new(Cut::Never as u8));
        let arming = armed.clone();
        let proxy = Proxy {
            port: listener.local_addr().unwrap().port(),
            armed,
        };
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, protocol, arming.clone()));
            }
        });
        proxy
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts the next `COMMIT` as `cut` says.
    pub fn arm(&self, cut: Cut) {
        self.armed.store(cut as u8, Ordering::SeqCst);
    }
}

async fn relay(client: TcpStream, server: TcpStream, protocol: Protocol, armed: Arc<AtomicU8>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let cut = Arc::new(AtomicBool::new(false));
    // Server to client: plain copy, until the cut.
    let replies = {
        let cut = cut.clone();
        tokio::spawn(async move {
            let mut buf = vec![0_u8; 16 * 1024];
            loop {
                let n = match server_rx.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if cut.load(Ordering::SeqCst) || client_tx.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            // Dropping the write half closes the client's side.
        })
    };
    // Client to server, message by message.
    let mut started = false;
    while let Some((message, is_commit)) = protocol.next(&mut client_rx, &mut started).await {
        if is_commit {
            let how = armed.swap(Cut::Never as u8, Ordering::SeqCst);
            if how == Cut::AfterCommit as u8 {
                cut.store(true, Ordering::SeqCst);
                let _ = server_tx.write_all(&message).await;
                // Let the server commit; its reply is dropped by the other half.
                tokio::time::sleep(Duration::from_millis(300)).await;
                break;
            }
            if how == Cut::BeforeCommit as u8 {
                cut.store(true, Ordering::SeqCst);
                break;
            }
        }
        if server_tx.write_all(&message).await.is_err() {
            break;
        }
    }
    replies.abort();
}
