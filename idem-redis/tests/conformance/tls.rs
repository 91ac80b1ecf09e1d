//! Over TLS (feature `tls`), on a `redis-server` of the test's own that speaks TLS only
//! (`servers::RedisServer::start_tls`, with `servers::tls::Certs`): a `rediss://` client
//! trusting the test's CA (`redis::Client::build_with_tls`) consumes, dead-letters and
//! publishes through the outbox; one trusting another CA fails at once, saying why.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use idem::consume::{json, Consumer};
use idem::outbox::Relay;
use idem::redis::{headers, Error, OutboxPublisher, Source};
use idem_testkit::backends::{unique_name, Sqlite};
use idem_testkit::broker::model::{self, Event};
use idem_testkit::servers::tls::Certs;
use idem_testkit::servers::RedisServer;
use idem_testkit::Kit;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamInfoGroupsReply, StreamRangeReply};
use redis::{AsyncCommands as _, TlsCertificates};

use crate::GROUP;

/// What `servers::unavailable` names when this machine has no `redis-server`.
const TEST: &str = "Redis TLS tests";

/// A private TLS server, its certificates' folder and a client trusting its CA.
struct Tls {
    server: RedisServer,
    certs: Certs,
    dir: std::path::PathBuf,
    client: redis::Client,
}

impl Tls {
    fn start(name: &str) -> Option<Tls> {
        let dir = std::env::temp_dir().join(unique_name(&format!("{name}-certs")));
        let certs = Certs::generate(&dir);
        let server = RedisServer::start_tls(name, TEST, &certs)?;
        let client = Tls::client(&server, &certs.ca());
        Some(Tls {
            server,
            certs,
            dir,
            client,
        })
    }

    /// A client of `server` trusting the CA in `ca` (and not the system's roots).
    #[allow(clippy::let_and_return)] // the book shows the binding
    fn client(server: &RedisServer, ca: &std::path::Path) -> redis::Client {
        // ANCHOR: tls_client
        // `ca`: the PEM file of the CA that signed the server's certificate.
        let certificates = TlsCertificates {
            client_tls: None, // or Some(ClientTlsConfig { .. }) where the server asks for one
            root_cert: Some(std::fs::read(ca).unwrap()),
        };
        // A `rediss://` URL; `Source::builder(client, ..)`, `OutboxPublisher::builder(client)`.
        let client = redis::Client::build_with_tls(server.url(), certificates).unwrap();
        // ANCHOR_END: tls_client
        client
    }

    async fn conn(&self) -> MultiplexedConnection {
        self.client
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    async fn entries(&self, stream: &str) -> Vec<BTreeMap<String, String>> {
        let reply: StreamRangeReply = self.conn().await.xrange_all(stream).await.unwrap();
        crate::fields(&reply)
    }

    async fn group(&self, stream: &str) -> (usize, usize) {
        let reply: StreamInfoGroupsReply = self.conn().await.xinfo_groups(stream).await.unwrap();
        let info = reply.groups.into_iter().find(|g| g.name == GROUP).unwrap();
        (info.pending, info.lag.unwrap())
    }
}

impl Drop for Tls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Over TLS with the test's CA: 100 credits and 2 poison ones through a consumer (every credit
/// applied once, the poison dead-lettered, nothing pending), and 10 orders' payments through
/// an outbox relay (each once, under its outbox id, in order; nothing unsent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_and_the_outbox_publisher_work_over_tls_trusting_the_servers_ca() {
    let Some(t) = Tls::start("redis-tls") else {
        return;
    };
    let Some(k) = Kit::<Sqlite>::open().await else {
        return;
    };
    model::schema(&k).await;
    let stream = unique_name("idem_tls:orders");
    let mut events: Vec<Event> = (0..100)
        .map(|i| model::credit(&format!("ok{i}"), i % 5, 1))
        .collect();
    events.insert(10, model::poison("poison10"));
    events.insert(70, model::poison("poison70"));
    let mut pipe = redis::pipe();
    for event in model::raws(&events) {
        let fields: [(&str, &[u8]); 2] = [
            (headers::PAYLOAD, &event.payload),
            (headers::MESSAGE_ID, event.id.as_bytes()),
        ];
        pipe.xadd(&stream, "*", &fields).ignore();
    }
    let () = pipe.query_async(&mut t.conn().await).await.unwrap();

    let started = Instant::now();
    let source = Source::builder(t.client.clone(), &stream, GROUP, "w")
        .block(Duration::from_millis(50))
        .prefetch(20)
        .connect()
        .await
        .unwrap();
    let d = k.dialect;
    let until = async {
        let settled = async {
            while t.group(&stream).await != (0, 0) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), settled).await;
    };
    let counts = Consumer::new(k.pool.clone())
        .batch(20)
        .retry_delay(Duration::from_millis(20), Duration::from_millis(100))
        .run(
            source.deliveries(),
            json::<Event>,
            async |batch, e| model::handle_counted(batch, e, &d).await,
            until,
        )
        .await;
    let consumed = started.elapsed();
    assert_eq!(counts.applied, 100, "{counts:?}");
    assert_eq!(counts.dead_lettered, 2, "{counts:?}");
    model::verify(&k, &model::oracle(&events)).await;
    let letters = t.entries(source.dead_letter_stream()).await;
    let mut dead: Vec<&str> = letters
        .iter()
        .map(|l| l[headers::MESSAGE_ID].as_str())
        .collect();
    dead.sort();
    assert_eq!(dead, ["poison10", "poison70"], "each once");
    assert_eq!(t.group(&stream).await, (0, 0));
    source.close().await.unwrap();

    let started = Instant::now();
    let destination = format!("{stream}:out");
    let ids = model::commit_orders(&k, &destination, "ada", 10).await;
    let publisher = OutboxPublisher::builder(t.client.clone())
        .connect()
        .await
        .unwrap();
    let mut relay = Relay::new(k.pool.clone(), publisher);
    assert_eq!(relay.step().await.unwrap(), 10);
    assert_eq!(relay.step().await.unwrap(), 0);
    let relayed = started.elapsed();
    assert_eq!(model::unsent(&k).await, 0);
    let arrived: Vec<String> = t
        .entries(&destination)
        .await
        .into_iter()
        .map(|mut e| e.remove(headers::MESSAGE_ID).unwrap())
        .collect();
    assert_eq!(arrived, ids, "each once, in order");
    eprintln!(
        "over TLS: 102 entries consumed in {consumed:?}, 10 outbox messages relayed in {relayed:?}"
    );
    k.close().await;
}

/// A client trusting another CA than the one that signed the server's certificate: the
/// source's `connect` and the publisher's fail within 5 s, with errors naming the
/// certificate; and a `rediss://` URL alone (the system's roots) fails the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_fails_at_once_naming_the_certificate() {
    let Some(t) = Tls::start("redis-tls-wrong-ca") else {
        return;
    };
    let wrong = Tls::client(&t.server, &t.certs.other_ca());
    let stream = unique_name("idem_tls:wrong");
    let fails = |err: &Error, took: Duration| {
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
        let text = format!("{err} ({:?})", std::error::Error::source(err));
        assert!(
            text.contains("certificate") && text.contains("UnknownIssuer"),
            "{text}"
        );
        assert!(took < Duration::from_secs(5), "{took:?}");
        eprintln!("refused in {took:?}: {err}");
    };

    let started = Instant::now();
    let connect = Source::builder(wrong.clone(), &stream, GROUP, "w").connect();
    let refused = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .expect("an answer within 10 s")
        .unwrap_err();
    fails(&refused, started.elapsed());

    let started = Instant::now();
    let connect = OutboxPublisher::builder(wrong).connect();
    let refused = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .expect("an answer within 10 s")
        .unwrap_err();
    fails(&refused, started.elapsed());

    let started = Instant::now();
    let connect = Source::builder(t.server.url(), &stream, GROUP, "w").connect();
    let refused = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .expect("an answer within 10 s")
        .unwrap_err();
    fails(&refused, started.elapsed());
    assert!(refused.to_string().contains(&t.server.url()), "{refused}");

    let exists: bool = t.conn().await.exists(&stream).await.unwrap();
    assert!(!exists, "nothing created");
}
