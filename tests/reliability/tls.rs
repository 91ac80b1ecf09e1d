//! idem over TLS to its databases: private servers (PostgreSQL, MariaDB; never the machine's
//! shared ones) serving certificates the test generates (`idem_testkit::servers::tls`: an
//! authority, a server certificate for `localhost` and `127.0.0.1`, and a second authority that
//! signed nothing of theirs).
//!
//! For each database, in order, on one server:
//! - without TLS on the server, a client that requires it fails at once, saying the server does
//!   not support TLS;
//! - with TLS on, idem's handler path (migrate, 20 credits applied, their 20 copies
//!   `Duplicate`, the ledger checked) works with TLS required without verification, with the
//!   authority verified, and with the authority and the server's name verified (PostgreSQL's
//!   `sslmode=require`, `verify-ca`, `verify-full`; MySQL's `ssl-mode=REQUIRED`, `VERIFY_CA`,
//!   `VERIFY_IDENTITY`), the last from a URL as a user writes it; each connection is checked to
//!   be encrypted, from the server's side;
//! - a client trusting the other authority fails within seconds (never a hang), with an error
//!   that says the certificate was refused, both on connect and through idem's handler.
//!
//! sqlx needs a TLS feature for this: the tests build with `tls-rustls-ring-webpki`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use idem::{Outcome, Transient as _};
use idem_testkit::servers::tls::Certs;

use crate::support::credits::Credit;
use crate::support::is_root;

/// The most a failed TLS connect may take.
const FAILS_WITHIN: Duration = Duration::from_secs(5);

/// A folder of certificates, removed on drop.
struct CertsDir(PathBuf);

impl CertsDir {
    /// New certificates in a folder of their own, given to `user` (the server's) under root.
    fn generate(user: &str) -> (CertsDir, Certs) {
        let dir = std::env::temp_dir().join(crate::common::unique_name("idem_tls_certs"));
        let certs = Certs::generate(&dir);
        if is_root() {
            certs.chown(user);
        }
        (CertsDir(dir), certs)
    }
}

impl Drop for CertsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// 20 credits and a copy of each.
fn credits(prefix: &str) -> Vec<Credit> {
    (0..20)
        .map(|i| Credit {
            id: format!("{prefix}{i}"),
            account: i % 3,
            amount: i + 1,
        })
        .collect()
}

/// The balances 20 [`credits`] leave.
fn oracle() -> Vec<(i64, i64)> {
    let mut sums = [0_i64; 3];
    for i in 0..20 {
        sums[(i % 3) as usize] += i + 1;
    }
    (0..3).map(|a| (a, sums[a as usize])).collect()
}

/// Fails unless `text`, an error's, says the server's certificate was refused. (sqlx reports a
/// certificate its TLS client refuses as an I/O error, `error communicating with database:
/// invalid peer certificate: UnknownIssuer`: the word TLS is not in it.)
fn assert_names_the_certificate(text: &str) {
    assert!(
        text.contains("invalid peer certificate"),
        "the error must say the certificate was refused: {text}"
    );
}

/// `url`'s path for a URL parameter: percent-encoded where it must be.
fn in_url(path: &Path) -> String {
    path.display()
        .to_string()
        .replace('%', "%25")
        .replace(' ', "%20")
}

/// Runs `connect` (bounded by 30 s, which a pass never nears) and returns its error's text
/// and how long it took; fails if it connected.
async fn failed_connect<T, E, F>(what: &str, connect: F) -> (String, Duration)
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), connect)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer in 30 s (a hang)"));
    let took = started.elapsed();
    let Err(err) = result else {
        panic!("{what}: connected");
    };
    let text = err.to_string();
    eprintln!("{what}: failed in {} ms: {text}", took.as_millis());
    assert!(took < FAILS_WITHIN, "{what}: took {took:?}");
    (text, took)
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    use idem_testkit::servers::PostgresServer;
    use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
    use sqlx::ConnectOptions as _;

    use crate::support::credits::postgres as credit_db;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_over_tls_verifies_the_server_and_fails_clearly_otherwise() {
        let test = "PostgreSQL TLS test";
        let began = Instant::now();
        let (_dir, certs) = CertsDir::generate("postgres");
        let files = [
            ("ssl_cert_file", certs.server_cert()),
            ("ssl_key_file", certs.server_key()),
            ("ssl_ca_file", certs.ca()),
        ];
        let files: Vec<(&str, String)> = files
            .iter()
            .map(|(name, path)| (*name, path.display().to_string()))
            .collect();
        let settings: Vec<(&str, &str)> = files.iter().map(|(n, p)| (*n, p.as_str())).collect();
        // The certificates are set, TLS is off: first the client that requires it.
        let started = tokio::task::block_in_place(|| {
            PostgresServer::start_with("idem_pgtls", test, &settings)
        });
        let Some(server) = started else {
            return;
        };
        let plain = server.options();
        let (text, _) = failed_connect(
            "PostgreSQL sslmode=require, server without TLS",
            plain.clone().ssl_mode(PgSslMode::Require).connect(),
        )
        .await;
        assert!(text.contains("does not support TLS"), "{text}");

        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(plain.clone())
            .await
            .unwrap();
        sqlx::query("ALTER SYSTEM SET ssl = on")
            .execute(&admin)
            .await
            .unwrap();
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&admin)
            .await
            .unwrap();
        let required = plain.clone().ssl_mode(PgSslMode::Require);
        let deadline = Instant::now() + Duration::from_secs(20);
        while required.connect().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "TLS not on 20 s after the reload"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        let ca = certs.ca();
        let port = server.port();
        let url = format!(
            "postgres://postgres@127.0.0.1:{port}/postgres?sslmode=verify-full&sslrootcert={}",
            in_url(&ca)
        );
        let full: PgConnectOptions = url.parse().unwrap();
        let modes = [
            ("require", plain.clone().ssl_mode(PgSslMode::Require)),
            (
                "verify_ca",
                plain
                    .clone()
                    .ssl_mode(PgSslMode::VerifyCa)
                    .ssl_root_cert(&ca),
            ),
            ("verify_full", full),
        ];
        for (mode, options) in modes {
            let database = format!("idem_tls_{mode}");
            let create = format!("CREATE DATABASE {database}");
            sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(&admin)
                .await
                .unwrap();
            let pool = credit_db::crash_pool(options.database(&database)).await;
            let encrypted: bool =
                sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert!(
                encrypted,
                "{mode}: the server says the connection is in the clear"
            );
            apply_credits(&pool, mode).await;
            pool.close().await;
        }

        for mode in [PgSslMode::VerifyCa, PgSslMode::VerifyFull] {
            let wrong = plain.clone().ssl_mode(mode).ssl_root_cert(certs.other_ca());
            let what = format!("PostgreSQL {mode:?} with the wrong authority");
            let (text, _) = failed_connect(&what, wrong.clone().connect()).await;
            assert_names_the_certificate(&text);
            // What a consumer sees: idem's error, from its handler.
            let pool = PgPoolOptions::new()
                .acquire_timeout(Duration::from_secs(20))
                .connect_lazy_with(wrong.database("idem_tls_require"));
            let msg = &credits("wrong")[0];
            let what = format!("idem's handler, {mode:?} with the wrong authority");
            let (text, _) = failed_connect(&what, credit_db::credit(&pool, msg)).await;
            assert_names_the_certificate(&text);
            let err = credit_db::credit(&pool, msg).await.unwrap_err();
            // A setting to fix: idem::retry does not try it again.
            assert!(!err.is_transient(), "{what}: not transient: {err}");
        }
        admin.close().await;
        tokio::task::block_in_place(|| drop(server));
        eprintln!(
            "PostgreSQL TLS test: {:.1} s",
            began.elapsed().as_secs_f64()
        );
    }

    /// idem's handler path on `pool`: 20 credits `Applied`, their copies `Duplicate`, the
    /// balances the oracle's.
    async fn apply_credits(pool: &PgPool, mode: &str) {
        let batch = credits("c");
        for msg in &batch {
            let outcome = credit_db::credit(pool, msg).await.unwrap();
            assert_eq!(outcome, Outcome::Applied(()), "{mode} {}", msg.id);
        }
        for msg in &batch {
            let outcome = credit_db::credit(pool, msg).await.unwrap();
            assert_eq!(outcome, Outcome::Duplicate, "{mode} {}", msg.id);
        }
        let balances: Vec<(i64, i64)> =
            sqlx::query_as("SELECT account, balance FROM balances ORDER BY account")
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(balances, oracle(), "{mode}");
    }
}

#[cfg(feature = "mysql")]
mod mariadb {
    use super::*;

    use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions, MySqlSslMode};
    use sqlx::ConnectOptions as _;

    use crate::support::credits::mysql as credit_db;
    use crate::support::mariadb::Server;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_over_tls_verifies_the_server_and_fails_clearly_otherwise() {
        let test = "MariaDB TLS test";
        let began = Instant::now();
        let (_dir, certs) = CertsDir::generate("mysql");
        // TLS off at first: the client that requires it.
        let Some(mut server) = tokio::task::block_in_place(|| Server::start(test)) else {
            return;
        };
        let plain = server.options();
        let (text, _) = failed_connect(
            "MariaDB ssl-mode=REQUIRED, server without TLS",
            plain.clone().ssl_mode(MySqlSslMode::Required).connect(),
        )
        .await;
        assert!(text.contains("does not support TLS"), "{text}");

        let tls = [
            format!("--ssl-cert={}", certs.server_cert().display()),
            format!("--ssl-key={}", certs.server_key().display()),
            format!("--ssl-ca={}", certs.ca().display()),
        ];
        server.set_options(&tls);
        tokio::task::block_in_place(|| {
            server.crash();
            server.start_server();
        });

        let admin = MySqlPoolOptions::new()
            .max_connections(1)
            .connect_with(plain.clone())
            .await
            .unwrap();
        let ca = certs.ca();
        let port = server.port();
        let url = format!(
            "mysql://root@127.0.0.1:{port}/idem_tls_verify_identity?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
            in_url(&ca)
        );
        let identity: MySqlConnectOptions = url.parse().unwrap();
        let modes = [
            ("required", plain.clone().ssl_mode(MySqlSslMode::Required)),
            (
                "verify_ca",
                plain.clone().ssl_mode(MySqlSslMode::VerifyCa).ssl_ca(&ca),
            ),
            ("verify_identity", identity),
        ];
        for (mode, options) in modes {
            let database = format!("idem_tls_{mode}");
            let create = format!("CREATE DATABASE {database}");
            sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(&admin)
                .await
                .unwrap();
            let pool = credit_db::crash_pool(options.database(&database)).await;
            let (_, cipher): (String, String) =
                sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            assert!(
                !cipher.is_empty(),
                "{mode}: the server says the connection is in the clear"
            );
            apply_credits(&pool, mode).await;
            pool.close().await;
        }

        for mode in [MySqlSslMode::VerifyCa, MySqlSslMode::VerifyIdentity] {
            let wrong = plain.clone().ssl_mode(mode).ssl_ca(certs.other_ca());
            let what = format!("MariaDB {mode:?} with the wrong authority");
            let (text, _) = failed_connect(&what, wrong.clone().connect()).await;
            assert_names_the_certificate(&text);
            let pool = MySqlPoolOptions::new()
                .acquire_timeout(Duration::from_secs(20))
                .connect_lazy_with(wrong.database("idem_tls_required"));
            let msg = &credits("wrong")[0];
            let what = format!("idem's handler, {mode:?} with the wrong authority");
            let (text, _) = failed_connect(&what, credit_db::credit(&pool, msg)).await;
            assert_names_the_certificate(&text);
            let err = credit_db::credit(&pool, msg).await.unwrap_err();
            // A setting to fix: idem::retry does not try it again.
            assert!(!err.is_transient(), "{what}: not transient: {err}");
        }
        admin.close().await;
        tokio::task::block_in_place(|| drop(server));
        eprintln!("MariaDB TLS test: {:.1} s", began.elapsed().as_secs_f64());
    }

    /// idem's handler path on `pool`: 20 credits `Applied`, their copies `Duplicate`, the
    /// balances the oracle's.
    async fn apply_credits(pool: &MySqlPool, mode: &str) {
        let batch = credits("c");
        for msg in &batch {
            let outcome = credit_db::credit(pool, msg).await.unwrap();
            assert_eq!(outcome, Outcome::Applied(()), "{mode} {}", msg.id);
        }
        for msg in &batch {
            let outcome = credit_db::credit(pool, msg).await.unwrap();
            assert_eq!(outcome, Outcome::Duplicate, "{mode} {}", msg.id);
        }
        let balances: Vec<(i64, i64)> =
            sqlx::query_as("SELECT account, balance FROM balances ORDER BY account")
                .fetch_all(pool)
                .await
                .unwrap();
        assert_eq!(balances, oracle(), "{mode}");
    }
}
