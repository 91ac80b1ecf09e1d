//! [`Server`]: where a [`Source`](crate::Source) or an
//! [`OutboxPublisher`](crate::OutboxPublisher) connects (a URL, a `redis::Client` of your own,
//! or a Redis Cluster's `ClusterClient`), and the connection either kind opens.

use std::fmt;
use std::time::Duration;

use idem_runtime::consume::adapter::redact;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// Where to connect: one server, by URL (`redis://...`, `rediss://...` for TLS) or by a
/// [`redis::Client`] you built (say with `redis::Client::build_with_tls` and a CA of your
/// own), or a Redis Cluster, by a [`ClusterClient`]. Made with `From`: a `&str`, `String`,
/// `Box<str>` or `Cow<str>` (the URL), a `redis::Client`, or a `ClusterClient`, so that
/// `Source::builder("redis://127.0.0.1:6379", ..)` and
/// `Source::builder(ClusterClient::new(nodes)?, ..)` both work.
///
/// A URL or a `redis::Client` is one server: for a cluster, hand over a `ClusterClient` (one
/// node's URL would get `MOVED` replies for the other nodes' keys). On a cluster, keys one
/// step uses together must share a hash slot: see the crate's
/// documentation, [Redis Cluster](crate#redis-cluster).
#[derive(Clone)]
pub struct Server(Target);

#[derive(Clone)]
enum Target {
    Url(String),
    Client(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
}

impl From<&str> for Server {
    fn from(url: &str) -> Self {
        Server(Target::Url(url.to_string()))
    }
}

impl From<String> for Server {
    fn from(url: String) -> Self {
        Server(Target::Url(url))
    }
}

impl From<&String> for Server {
    fn from(url: &String) -> Self {
        Server(Target::Url(url.clone()))
    }
}

impl From<Box<str>> for Server {
    fn from(url: Box<str>) -> Self {
        Server(Target::Url(url.into()))
    }
}

impl From<std::borrow::Cow<'_, str>> for Server {
    fn from(url: std::borrow::Cow<'_, str>) -> Self {
        Server(Target::Url(url.into_owned()))
    }
}

impl From<redis::Client> for Server {
    fn from(client: redis::Client) -> Self {
        Server(Target::Client(Box::new(client)))
    }
}

impl From<ClusterClient> for Server {
    fn from(client: ClusterClient) -> Self {
        Server(Target::Cluster(Box::new(client)))
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Server").field(&self.describe()).finish()
    }
}

impl Server {
    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.0, Target::Cluster(_))
    }

    /// For messages: the URL without its password, the client's address, or `a Redis Cluster`.
    pub(crate) fn describe(&self) -> String {
        match &self.0 {
            Target::Url(url) => redact(url),
            Target::Client(client) => client.get_connection_info().addr().to_string(),
            Target::Cluster(_) => "a Redis Cluster".to_string(),
        }
    }

    /// A new connection; with `response_timeout`, replies wait that long (the blocking
    /// reader's), else the client's default.
    pub(crate) async fn connect(&self, response_timeout: Option<Duration>) -> RedisResult<Conn> {
        #[cfg(feature = "tls")]
        install_crypto_provider();
        let single = |client: &redis::Client| {
            let mut config = redis::AsyncConnectionConfig::new();
            if let Some(timeout) = response_timeout {
                config = config.set_response_timeout(Some(timeout));
            }
            let client = client.clone();
            async move {
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            }
        };
        match &self.0 {
            Target::Url(url) => {
                let client = redis::Client::open(url.as_str())?;
                Ok(Conn::Single(single(&client).await?))
            }
            Target::Client(client) => Ok(Conn::Single(single(client).await?)),
            Target::Cluster(client) => {
                let conn = match response_timeout {
                    Some(timeout) => {
                        let config = ClusterConfig::new().set_response_timeout(timeout);
                        client.get_async_connection_with_config(config).await?
                    }
                    None => client.get_async_connection().await?,
                };
                Ok(Conn::Cluster(Box::new(conn)))
            }
        }
    }
}

/// With the feature `tls`: rustls' ring provider as the process's default, unless one is
/// installed already (by the application, or by another library). redis-rs asks rustls for
/// the default when it opens a TLS connection, which panics when there is none, or when both
/// of rustls' providers are compiled in and none was chosen.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one in between: theirs stays, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A connection to one server or to a cluster (which routes each command to the master of
/// its key's slot).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// Whether two keys are in one hash slot of a Redis Cluster (each key's hash tag, the text
/// between its first `{` and the next `}` when not empty, or else the whole key, hashed).
pub(crate) fn same_slot(one: &str, other: &str) -> bool {
    Slot::for_key(one) == Slot::for_key(other)
}

/// A Redis Cluster's hash slot of `key` (0 to 16383), for grouping a batch by slot.
pub(crate) fn slot(key: &[u8]) -> Slot {
    Slot::for_key(key)
}

/// The default dead-letter stream of `stream`: `<stream>:dead`, except on a cluster when that
/// is in another slot than the stream (the stream has no hash tag): then `{<stream>}:dead`,
/// whose hash tag is the whole stream name, so it sits in the stream's slot (unless braces in
/// the name defeat that, as in `{}x`: then `<stream>:dead`, which `connect` refuses on a
/// cluster).
pub(crate) fn default_dead_letters(stream: &str, cluster: bool) -> String {
    let plain = format!("{stream}:dead");
    if !cluster || same_slot(stream, &plain) {
        return plain;
    }
    let tagged = format!("{{{stream}}}:dead");
    if same_slot(stream, &tagged) {
        tagged
    } else {
        plain
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_dead_letters_keep_their_name_off_a_cluster_and_the_slot_on_one() {
        assert_eq!(default_dead_letters("orders", false), "orders:dead");
        assert_eq!(default_dead_letters("{orders}", false), "{orders}:dead");
        assert_eq!(default_dead_letters("orders", true), "{orders}:dead");
        assert_eq!(default_dead_letters("{orders}", true), "{orders}:dead");
        assert_eq!(
            default_dead_letters("shop{eu}:orders", true),
            "shop{eu}:orders:dead"
        );
        for stream in ["orders", "{orders}", "shop{eu}:orders", "a{b"] {
            let dead = default_dead_letters(stream, true);
            assert!(same_slot(stream, &dead), "{stream} {dead}");
        }
        assert!(!same_slot("orders", "orders:dead"));
        assert!(same_slot("{orders}", "orders"));
    }
}
