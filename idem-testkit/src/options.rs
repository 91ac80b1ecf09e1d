//! The handlers of the handler-option rules (`fingerprint`, `replay`, `max_attempts`, the
//! metrics): one body shared by every path (pool, savepoint, batch, lease), and the helpers
//! that read what the options stored.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;

use idem::store::{Attempts, Leases, Stamps};
use idem::{idempotent, Outcome, Tx};

use crate::backend::{exec, fetch, Kit, KitDb, Ty};
use crate::{Backend, Dialect};

/// A message of the option rules: its key, its payload, a version, and what the body must do.
#[derive(Clone, Debug, Default)]
pub struct Msg {
    /// The key.
    pub id: String,
    /// The payload (what `fingerprint` hashes).
    pub body: String,
    /// The version, for the handlers with `version`.
    pub version: i64,
    /// The body returns `Err` after its write.
    pub fail: bool,
    /// The body panics after its write.
    pub panic: bool,
    /// The body waits after its write until this is notified: its transaction stays open.
    pub hold: Option<Arc<tokio::sync::Notify>>,
}

/// A message that the body handles without failing.
pub fn msg(id: &str, body: &str) -> Msg {
    Msg {
        id: id.into(),
        body: body.into(),
        version: 1,
        ..Msg::default()
    }
}

impl Msg {
    /// This message, failing with `Err`.
    pub fn failing(self) -> Msg {
        Msg { fail: true, ..self }
    }

    /// This message, panicking.
    pub fn panicking(self) -> Msg {
        Msg {
            panic: true,
            ..self
        }
    }

    /// This message with another version.
    pub fn at(self, version: i64) -> Msg {
        Msg { version, ..self }
    }
}

/// Counts the runs of a body.
#[derive(Clone, Default, Debug)]
pub struct Runs(Arc<AtomicU32>);

impl Runs {
    /// How many times the body ran.
    pub fn get(&self) -> u32 {
        self.0.load(SeqCst)
    }
}

/// The error of a failing body; its Display text is what `idem_attempts.last_error` keeps.
pub const FAILURE: &str = "declined: card expired";

/// The body every handler shares: one row in `effects`, then fails or panics if told; returns
/// `id:body:n`, n the rows of `effects` it sees (so a replayed value tells which run made it).
pub async fn effect<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Msg,
    runs: &Runs,
    d: &Dialect,
) -> Result<String, sqlx::Error> {
    runs.0.fetch_add(1, SeqCst);
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO effects (msg) VALUES ($1)",
        &[format!("{}:{}", msg.id, msg.body).into()],
    )
    .await?;
    if let Some(hold) = &msg.hold {
        hold.notified().await;
    }
    if msg.panic {
        panic!("handler panicked after its write");
    }
    if msg.fail {
        return Err(sqlx::Error::Protocol(FAILURE.into()));
    }
    let rows = fetch::<DB>(
        &mut **tx,
        d,
        "SELECT COUNT(*) FROM effects",
        &[],
        &[Ty::Int],
    )
    .await?;
    Ok(format!("{}:{}:{}", msg.id, msg.body, rows[0][0].int()))
}

/// Defines handlers that share one body: each `vis name<Bounds>(attribute arguments);` is a handler
/// `#[idempotent(attribute arguments)]` whose database has `KitDb` and the bounds, and which
/// passes its arguments to the body and returns what it returns.
macro_rules! handlers {
    (
        $body:ident $params:tt -> $ret:ty;
        $($(#[$doc:meta])* $vis:vis $name:ident<$($bound:path),*> $opts:tt;)*
    ) => {$(
        $crate::options::handlers! {
            @one $body $params -> $ret; $(#[$doc])* $vis $name<$($bound),*> $opts
        }
    )*};
    (
        @one $body:ident ($($arg:ident: $ty:ty),*) -> $ret:ty;
        $(#[$doc:meta])* $vis:vis $name:ident<$($bound:path),*> ($($opt:tt)*)
    ) => {
        $(#[$doc])*
        #[idem::idempotent($($opt)*)]
        $vis async fn $name<DB: $crate::KitDb $(+ $bound)*>(
            tx: &mut idem::Tx<'_, DB>,
            $($arg: $ty),*
        ) -> $ret {
            $body(tx, $($arg),*).await
        }
    };
}
pub(crate) use handlers;

handlers! {
    effect(msg: &Msg, runs: &Runs, d: &Dialect) -> Result<String, sqlx::Error>;
    /// Key + `fingerprint`.
    pub fingerprinted<Stamps>(
        key = "msg.id", fingerprint = "msg.body", scope = "options::fingerprinted"
    );
    /// Key + `replay`.
    pub replayed<Stamps>(key = "msg.id", replay = true, scope = "options::replayed");
    /// Key + version, with `fingerprint` and `replay` (kept on the version row).
    pub versioned<Stamps>(
        key = "msg.id", version = "msg.version", fingerprint = "msg.body", replay = true,
        scope = "options::versioned"
    );
    /// Lease mode, with `fingerprint` and `replay`.
    pub leased<Leases, Stamps>(
        key = "msg.id", mode = "lease", fingerprint = "msg.body", replay = true,
        scope = "options::leased"
    );
    /// Key + `max_attempts = 3`.
    pub counted<Attempts>(key = "msg.id", max_attempts = 3, scope = "options::counted");
    /// Lease mode + `max_attempts = 2`.
    pub leased_counted<Leases, Attempts>(
        key = "msg.id", mode = "lease", max_attempts = 2, scope = "options::leased_counted"
    );
}

/// Returns a value of `len` bytes as JSON (a string of `len - 2` characters), kept for replay.
#[idempotent(key = "msg.id", replay = true, scope = "options::large")]
pub async fn large<DB: KitDb + Stamps>(
    tx: &mut Tx<'_, DB>,
    msg: &Msg,
    len: usize,
    runs: &Runs,
    d: &Dialect,
) -> Result<String, sqlx::Error> {
    effect(tx, msg, runs, d).await?;
    Ok("x".repeat(len - 2))
}

/// Creates the table the bodies write to.
pub async fn setup<B: Backend>(k: &Kit<B>) {
    k.exec("CREATE TABLE effects (msg TEXT NOT NULL)", &[])
        .await;
}

/// The rows of `effects`.
pub async fn effects<B: Backend>(k: &Kit<B>) -> i64 {
    k.int("SELECT COUNT(*) FROM effects", &[]).await
}

/// The rows of `table` (an idem table).
pub async fn rows<B: Backend>(k: &Kit<B>, table: &str) -> i64 {
    k.int(&format!("SELECT COUNT(*) FROM {table}"), &[]).await
}

/// The fingerprint stored on `table`'s only row with one.
pub async fn stored_fingerprint<B: Backend>(k: &Kit<B>, table: &str) -> Vec<u8> {
    let rows = k
        .rows(
            &format!("SELECT fingerprint FROM {table} WHERE fingerprint IS NOT NULL"),
            &[],
            &[Ty::Bytes],
        )
        .await;
    assert_eq!(rows.len(), 1, "one fingerprinted row in {table}");
    rows[0][0].bytes()
}

/// The failed attempts counted for `key` (0 without a row).
pub async fn attempts<B: Backend>(k: &Kit<B>, key: &str) -> i64 {
    let sql = "SELECT COUNT(*) FROM idem_attempts WHERE msg_key = $1";
    if k.int(sql, &[key.as_bytes().into()]).await == 0 {
        return 0;
    }
    for n in 1..10 {
        let sql = "SELECT COUNT(*) FROM idem_attempts WHERE msg_key = $1 AND attempts = $2";
        if k.int(sql, &[key.as_bytes().into(), n.into()]).await == 1 {
            return n;
        }
    }
    panic!("no count of 1..10 attempts for {key}")
}

/// The `last_error` kept for `key`.
pub async fn last_error<B: Backend>(k: &Kit<B>, key: &str) -> String {
    let rows = k
        .rows(
            "SELECT last_error FROM idem_attempts WHERE msg_key = $1",
            &[key.as_bytes().into()],
            &[Ty::Text],
        )
        .await;
    rows[0][0].text()
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The scope, stored and given fingerprints of a conflict; panics on any other result.
pub fn conflict<T: std::fmt::Debug>(
    result: Result<Outcome<T>, idem::Error<sqlx::Error>>,
) -> (&'static str, String, String) {
    match result {
        Err(idem::Error::Conflict {
            scope,
            stored,
            given,
        }) => (scope, stored, given),
        other => panic!("expected a conflict, got {other:?}"),
    }
}
