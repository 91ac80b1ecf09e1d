//! Private servers a test starts, crashes and restarts on its own (PostgreSQL and its
//! replicas, NATS with JetStream alone or as a cluster, Redis alone or as a cluster, RabbitMQ
//! nodes), and the TLS certificates they serve: never the machine's shared servers.

mod nats;
#[cfg(feature = "postgres")]
mod postgres;
mod rabbitmq;
mod redis;
pub mod tls;

pub use nats::{NatsCluster, NatsServer};
#[cfg(feature = "postgres")]
pub use postgres::PostgresServer;
pub use rabbitmq::RabbitNode;
pub use redis::{RedisCluster, RedisServer};

/// What a private server's `start` does where this machine lacks its program: `None`, having
/// said `why` on stderr; with `CI` set a panic, since CI must run what `test` names.
pub fn unavailable<T>(test: &str, why: &str) -> Option<T> {
    if std::env::var_os("CI").is_some() {
        panic!("CI must run the {test}: {why}");
    }
    eprintln!("skipped: {why}");
    None
}

/// The first of `env` (a variable naming the program), then `name` on the `PATH` and in each
/// of `dirs`, that is a file.
pub fn program(env: &str, name: &str, dirs: &[&str]) -> Option<std::path::PathBuf> {
    if let Some(program) = std::env::var_os(env) {
        return Some(std::path::PathBuf::from(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(dirs.iter().map(std::path::PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|program| program.is_file())
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
