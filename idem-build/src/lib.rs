//! What the build scripts of idem's crates call: tests that need a server are ignored, with the
//! reason, when the server's variable is not set.
//!
//! [`server_cfgs`] sets `idem_no_<server>` for each server whose variable is unset, unless `CI`
//! is set (CI runs every test, and a missing server fails there). A test names its server:
//!
//! ```ignore
//! #[tokio::test]
//! #[cfg_attr(idem_no_postgres, ignore = "set IDEM_POSTGRES_URL to run")]
//! async fn on_postgres() { /* ... */ }
//! ```
#![warn(missing_docs)]

/// Each server's cfg name (`idem_no_<name>`) and the variable that names the server.
pub const SERVERS: [(&str, &str); 6] = [
    ("postgres", "IDEM_POSTGRES_URL"),
    ("mysql", "IDEM_MYSQL_URL"),
    ("redis", "IDEM_REDIS_URL"),
    ("rabbitmq", "IDEM_RABBITMQ_URL"),
    ("nats", "IDEM_NATS_URL"),
    ("kafka", "IDEM_KAFKA_BROKERS"),
];

/// Prints the build script's directives: declares every `idem_no_<server>` cfg, sets those whose
/// variable is unset (unless `CI` is set), and asks cargo to run the script again when any of the
/// variables changes.
pub fn server_cfgs() {
    for line in directives(|name| std::env::var_os(name).is_some()) {
        println!("{line}");
    }
}

/// The directives, given which variables are set.
fn directives(is_set: impl Fn(&str) -> bool) -> Vec<String> {
    let mut lines = vec!["cargo::rerun-if-env-changed=CI".to_owned()];
    let ci = is_set("CI");
    for (server, var) in SERVERS {
        lines.push(format!("cargo::rustc-check-cfg=cfg(idem_no_{server})"));
        lines.push(format!("cargo::rerun-if-env-changed={var}"));
        if !ci && !is_set(var) {
            lines.push(format!("cargo::rustc-cfg=idem_no_{server}"));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_cfgs(set: &[&str]) -> Vec<String> {
        directives(|name| set.contains(&name))
            .into_iter()
            .filter_map(|l| l.strip_prefix("cargo::rustc-cfg=").map(str::to_owned))
            .collect()
    }

    #[test]
    fn an_unset_variable_marks_its_server_absent() {
        assert_eq!(
            set_cfgs(&[
                "IDEM_POSTGRES_URL",
                "IDEM_MYSQL_URL",
                "IDEM_REDIS_URL",
                "IDEM_NATS_URL"
            ]),
            ["idem_no_rabbitmq", "idem_no_kafka"]
        );
    }

    #[test]
    fn in_ci_no_server_is_absent_and_every_cfg_is_declared() {
        assert!(set_cfgs(&["CI"]).is_empty());
        let declared = directives(|_| false)
            .iter()
            .filter(|l| l.starts_with("cargo::rustc-check-cfg="))
            .count();
        assert_eq!(declared, SERVERS.len());
    }
}
