//! Tests that need a server are ignored, with the reason, when its variable is not set: this
//! sets `idem_no_<server>` for each server whose variable is unset, unless `CI` is set (CI runs
//! them all, and a missing server fails there). The same file in every crate with such tests.

/// Each server's cfg name and the variable that names it.
const SERVERS: [(&str, &str); 6] = [
    ("postgres", "IDEM_POSTGRES_URL"),
    ("mysql", "IDEM_MYSQL_URL"),
    ("redis", "IDEM_REDIS_URL"),
    ("rabbitmq", "IDEM_RABBITMQ_URL"),
    ("nats", "IDEM_NATS_URL"),
    ("kafka", "IDEM_KAFKA_BROKERS"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=CI");
    let ci = std::env::var_os("CI").is_some();
    for (server, var) in SERVERS {
        println!("cargo::rustc-check-cfg=cfg(idem_no_{server})");
        println!("cargo::rerun-if-env-changed={var}");
        if !ci && std::env::var_os(var).is_none() {
            println!("cargo::rustc-cfg=idem_no_{server}");
        }
    }
}
