//! Bad input: empty, huge, NUL-bearing, non-UTF-8 and unicode keys, extreme and negative
//! versions, a `u64` over `i64::MAX`, and keys and a scope full of SQL metacharacters. Each is
//! either refused with a clear `idem::Error::Key` before anything is written, or handled exactly
//! (stored byte for byte, deduplicated); never a panic, never a partial write: every rule asserts
//! the tables.

use idem::key::{KeyPart, KeyProblem};
use idem::{idempotent, Error, Outcome, Tx};

use crate::backend::{exec, Kit, KitDb, Ty, Value};
use crate::fixtures::{keys, rows_in, stored_version};
use crate::{Backend, Dialect};

/// Opens a fresh database with the effects table, or returns from the rule (skipped).
macro_rules! open_or_skip {
    ($b:ty) => {
        match $crate::Kit::<$b>::open().await {
            Some(k) => {
                k.exec(
                    "CREATE TABLE effects (handler TEXT NOT NULL, note TEXT NOT NULL)",
                    &[],
                )
                .await;
                k
            }
            None => return,
        }
    };
}

/// The scope of `meta_scope`: SQL metacharacters of every kind.
const META_SCOPE: &str = "bad'; DROP TABLE idem_records; -- %_\\ \"x\" $1 ?";

struct Bytes {
    key: Vec<u8>,
}

struct Text {
    key: String,
}

struct Versioned {
    key: String,
    version: i64,
}

struct Unsigned {
    key: String,
    version: u64,
}

struct WithEntity {
    key: String,
    entity: Vec<u8>,
    version: i64,
}

async fn effect<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    d: &Dialect,
    handler: &str,
    note: String,
) -> Result<(), sqlx::Error> {
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO effects (handler, note) VALUES ($1, $2)",
        &[handler.into(), note.into()],
    )
    .await
}

#[idempotent(key = "msg.key", scope = "bad::bytes")]
async fn by_bytes<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Bytes,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    effect(tx, d, "bytes", format!("{} bytes", msg.key.len())).await
}

#[idempotent(key = "msg.key", scope = "bad::text")]
async fn by_text<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Text,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    effect(tx, d, "text", msg.key.replace('\0', "\\0")).await
}

#[idempotent(key = "msg.key", version = "msg.version", scope = "bad::versioned")]
async fn versioned<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Versioned,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    effect(tx, d, "versioned", msg.version.to_string()).await
}

#[idempotent(key = "msg.key", version = "msg.version", scope = "bad::unsigned")]
async fn unsigned<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Unsigned,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    effect(tx, d, "unsigned", msg.version.to_string()).await
}

#[idempotent(
    key = "msg.key",
    version = "msg.version",
    entity = "msg.entity",
    scope = "bad::entity"
)]
async fn with_entity<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &WithEntity,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    effect(tx, d, "entity", msg.key.clone()).await
}

#[idempotent(
    key = "msg.key",
    scope = "bad'; DROP TABLE idem_records; -- %_\\ \"x\" $1 ?"
)]
async fn meta_scope<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &Text,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    effect(tx, d, "meta", msg.key.clone()).await
}

/// Rows in (effects, idem_records, idem_versions).
async fn counts<B: Backend>(k: &Kit<B>) -> (i64, i64, i64) {
    (
        rows_in(k, "effects").await,
        rows_in(k, "idem_records").await,
        rows_in(k, "idem_versions").await,
    )
}

/// The effects' notes, sorted.
async fn notes<B: Backend>(k: &Kit<B>) -> Vec<String> {
    let column = k.column("SELECT note FROM effects", &[], Ty::Text).await;
    let mut notes: Vec<String> = column.iter().map(Value::text).collect();
    notes.sort();
    notes
}

async fn version_of<B: Backend>(k: &Kit<B>, scope: &str, entity: &[u8]) -> Option<i64> {
    stored_version(k, scope, entity).await
}

/// The key error of a refused delivery, checked to be about `part` with `problem`.
fn refused(
    result: Result<Outcome<()>, Error<sqlx::Error>>,
    part: KeyPart,
    problem: KeyProblem,
) -> String {
    match result {
        Err(Error::Key(err)) => {
            assert_eq!((err.part(), err.problem()), (part, &problem), "{err}");
            err.to_string()
        }
        other => panic!("expected a key error about the {part}, got {other:?}"),
    }
}

/// Applied, then a duplicate on redelivery.
async fn applies_once<F, Fut>(deliver: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Outcome<()>, Error<sqlx::Error>>>,
{
    assert_eq!(deliver().await.unwrap(), Outcome::Applied(()));
    assert_eq!(deliver().await.unwrap(), Outcome::Duplicate);
}

/// An empty key or entity is refused with `Error::Key` before anything is written.
pub async fn empty_key_is_refused_before_any_write<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    let text = refused(
        by_bytes(pool, &Bytes { key: Vec::new() }, &d).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    assert_eq!(text, "idempotent handler `bad::bytes`: key is empty");
    refused(
        by_text(pool, &Text { key: String::new() }, &d).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    let empty_entity = WithEntity {
        key: "k".into(),
        entity: Vec::new(),
        version: 1,
    };
    refused(
        with_entity(pool, &empty_entity, &d).await,
        KeyPart::Entity,
        KeyProblem::Empty,
    );
    assert_eq!(counts(&k).await, (0, 0, 0), "nothing written");
    k.close().await;
}

/// A key or entity over `MAX_KEY_LEN` (up to a megabyte) is refused before any write; the limit itself is stored.
pub async fn megabyte_key_is_refused_before_any_write<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    let huge = vec![b'k'; 1 << 20];
    let text = refused(
        by_bytes(pool, &Bytes { key: huge.clone() }, &d).await,
        KeyPart::Key,
        KeyProblem::TooLong {
            len: 1 << 20,
            max: idem::key::MAX_KEY_LEN,
        },
    );
    assert!(
        text.contains("1048576 bytes long; the maximum is 512"),
        "{text}"
    );
    let huge_entity = WithEntity {
        key: "k".into(),
        entity: huge,
        version: 1,
    };
    refused(
        with_entity(pool, &huge_entity, &d).await,
        KeyPart::Entity,
        KeyProblem::TooLong {
            len: 1 << 20,
            max: idem::key::MAX_KEY_LEN,
        },
    );
    assert_eq!(counts(&k).await, (0, 0, 0), "nothing written");
    // One byte over the limit is refused too; the limit itself is stored.
    refused(
        by_bytes(
            pool,
            &Bytes {
                key: vec![b'k'; idem::key::MAX_KEY_LEN + 1],
            },
            &d,
        )
        .await,
        KeyPart::Key,
        KeyProblem::TooLong {
            len: idem::key::MAX_KEY_LEN + 1,
            max: idem::key::MAX_KEY_LEN,
        },
    );
    let max = vec![0xff_u8; idem::key::MAX_KEY_LEN];
    applies_once(|| async { by_bytes(pool, &Bytes { key: max.clone() }, &d).await }).await;
    assert_eq!(keys(&k, "bad::bytes").await, vec![max]);
    assert_eq!(counts(&k).await, (1, 1, 0));
    k.close().await;
}

/// Keys with NUL bytes are stored exactly, never truncated at the NUL.
pub async fn keys_with_nul_bytes_are_stored_exactly<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    let nul_keys: [&[u8]; 4] = [b"\0", b"a\0b", b"a\0", b"a"];
    for key in nul_keys {
        applies_once(|| async { by_bytes(pool, &Bytes { key: key.to_vec() }, &d).await }).await;
    }
    // As text too: a Rust string may hold NUL, and the key is its bytes.
    applies_once(|| async { by_text(pool, &Text { key: "x\0y".into() }, &d).await }).await;
    let mut expected: Vec<Vec<u8>> = nul_keys.iter().map(|k| k.to_vec()).collect();
    expected.sort();
    assert_eq!(
        keys(&k, "bad::bytes").await,
        expected,
        "no truncation at NUL"
    );
    assert_eq!(keys(&k, "bad::text").await, vec![b"x\0y".to_vec()]);
    assert_eq!(counts(&k).await, (5, 5, 0));
    k.close().await;
}

/// Non-UTF-8 byte keys are stored exactly, never converted lossily.
pub async fn non_utf8_byte_keys_are_stored_exactly<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    let invalid: [&[u8]; 4] = [&[0xff], &[0xff, 0xfe, 0x00, 0x80], &[0xc3], &[0xc3, 0x28]];
    for key in invalid {
        applies_once(|| async { by_bytes(pool, &Bytes { key: key.to_vec() }, &d).await }).await;
    }
    // U+FFFD, what a lossy conversion of 0xff would give, is another key.
    applies_once(|| async {
        by_bytes(
            pool,
            &Bytes {
                key: "\u{fffd}".as_bytes().to_vec(),
            },
            &d,
        )
        .await
    })
    .await;
    let mut expected: Vec<Vec<u8>> = invalid.iter().map(|k| k.to_vec()).collect();
    expected.push("\u{fffd}".as_bytes().to_vec());
    expected.sort();
    assert_eq!(keys(&k, "bad::bytes").await, expected);
    assert_eq!(counts(&k).await, (5, 5, 0));
    k.close().await;
}

/// Unicode keys are compared byte for byte: no normalization, no case folding.
pub async fn unicode_keys_are_compared_byte_for_byte<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    // Composed and decomposed é, case and width variants, an emoji with a joiner, right-to-left
    // text: no normalization, no case folding, each its own key.
    let keys_in = [
        "\u{e9}",
        "e\u{301}",
        "Straße",
        "STRASSE",
        "strasse",
        "ｋｅｙ",
        "key",
        "👩‍💻",
        "שלום",
        "\u{202e}gnp.exe",
    ];
    for key in keys_in {
        applies_once(|| async { by_text(pool, &Text { key: key.into() }, &d).await }).await;
    }
    let mut expected: Vec<Vec<u8>> = keys_in.iter().map(|k| k.as_bytes().to_vec()).collect();
    expected.sort();
    assert_eq!(keys(&k, "bad::text").await, expected);
    let notes = notes(&k).await;
    let mut sorted: Vec<String> = keys_in.iter().map(|k| k.to_string()).collect();
    sorted.sort();
    assert_eq!(notes, sorted, "the effects, each once, as written");
    assert_eq!(counts(&k).await, (10, 10, 0));
    k.close().await;
}

/// `i64::MIN` and `i64::MAX` are versions like any other.
pub async fn extreme_versions_i64_min_and_max<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    let at = |version| Versioned {
        key: "entity".into(),
        version,
    };
    let steps = [
        (i64::MIN, Outcome::Applied(())),
        (i64::MIN, Outcome::Duplicate),
        (i64::MIN + 1, Outcome::Applied(())),
        (
            i64::MIN,
            Outcome::Stale {
                latest: i64::MIN + 1,
            },
        ),
        (0, Outcome::Applied(())),
        (i64::MAX, Outcome::Applied(())),
        (i64::MAX, Outcome::Duplicate),
        (i64::MAX - 1, Outcome::Stale { latest: i64::MAX }),
        (i64::MIN, Outcome::Stale { latest: i64::MAX }),
    ];
    for (version, expected) in steps {
        assert_eq!(
            versioned(pool, &at(version), &d).await.unwrap(),
            expected,
            "version {version}"
        );
    }
    assert_eq!(
        version_of(&k, "bad::versioned", b"entity").await,
        Some(i64::MAX)
    );
    assert_eq!(counts(&k).await, (4, 0, 1), "four applied, one version row");
    // With an entity too: a fresh entity accepts i64::MIN, and i64::MAX is final.
    let ev = |key: &str, version| WithEntity {
        key: key.into(),
        entity: b"e".to_vec(),
        version,
    };
    assert_eq!(
        with_entity(pool, &ev("a", i64::MIN), &d).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        with_entity(pool, &ev("b", i64::MAX), &d).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        with_entity(pool, &ev("c", i64::MAX), &d).await.unwrap(),
        Outcome::Stale { latest: i64::MAX }
    );
    assert_eq!(counts(&k).await, (6, 2, 2));
    k.close().await;
}

/// A `u64` version over `i64::MAX` is refused before any write, never wrapped.
pub async fn unsigned_version_over_i64_max_is_refused_before_any_write<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    for version in [i64::MAX as u64 + 1, u64::MAX] {
        let text = refused(
            unsigned(
                pool,
                &Unsigned {
                    key: "u".into(),
                    version,
                },
                &d,
            )
            .await,
            KeyPart::Version,
            KeyProblem::OutOfRange(version.to_string()),
        );
        assert!(
            text.contains(&format!("{version} does not fit in an i64")),
            "{text}"
        );
    }
    assert_eq!(counts(&k).await, (0, 0, 0), "nothing written");
    // The largest that fits is stored as itself, never wrapped to a negative number.
    let max = Unsigned {
        key: "u".into(),
        version: i64::MAX as u64,
    };
    applies_once(|| async { unsigned(pool, &max, &d).await }).await;
    assert_eq!(version_of(&k, "bad::unsigned", b"u").await, Some(i64::MAX));
    // And an over-large version after it is still refused, not taken as stale or as a wrap.
    let over = Unsigned {
        key: "u".into(),
        version: u64::MAX,
    };
    assert!(matches!(
        unsigned(pool, &over, &d).await,
        Err(Error::Key(_))
    ));
    assert_eq!(counts(&k).await, (1, 0, 1));
    k.close().await;
}

/// Negative versions order as signed integers.
pub async fn negative_versions_order_as_signed_integers<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    let at = |version| Versioned {
        key: "neg".into(),
        version,
    };
    let steps = [
        (-5, Outcome::Applied(())),
        (-3, Outcome::Applied(())),
        (-4, Outcome::Stale { latest: -3 }),
        (-3, Outcome::Duplicate),
        (-1, Outcome::Applied(())),
        (-2, Outcome::Stale { latest: -1 }),
        (0, Outcome::Applied(())),
        (-1, Outcome::Stale { latest: 0 }),
    ];
    for (version, expected) in steps {
        assert_eq!(
            versioned(pool, &at(version), &d).await.unwrap(),
            expected,
            "version {version}"
        );
    }
    assert_eq!(version_of(&k, "bad::versioned", b"neg").await, Some(0));
    let applied = notes(&k).await;
    let mut applied: Vec<i64> = applied.iter().map(|v| v.parse().unwrap()).collect();
    applied.sort_unstable();
    assert_eq!(applied, vec![-5, -3, -1, 0]);
    assert_eq!(counts(&k).await, (4, 0, 1));
    k.close().await;
}

/// SQL metacharacters in keys and in a scope are data: stored as written, matching only themselves.
pub async fn sql_metacharacters_in_keys_and_scope_are_data<B: Backend>() {
    let k = open_or_skip!(B);
    let d = k.dialect;
    let pool = &k.pool;
    let nasty = [
        "'",
        "''",
        "\"",
        "'; DROP TABLE idem_records; --",
        "'; DROP TABLE effects; --",
        "' OR '1'='1",
        "%",
        "_",
        "a%",
        "a_",
        "a",
        "ab",
        "\\",
        "\\'",
        "\\0",
        "$1",
        "?",
        "; --",
        "/*",
        "*/",
    ];
    for key in nasty {
        applies_once(|| async { by_text(pool, &Text { key: key.into() }, &d).await }).await;
        applies_once(|| async { meta_scope(pool, &Text { key: key.into() }, &d).await }).await;
    }
    // `%` and `_` matched nothing but themselves: every key is its own record.
    let mut expected: Vec<Vec<u8>> = nasty.iter().map(|k| k.as_bytes().to_vec()).collect();
    expected.sort();
    assert_eq!(keys(&k, "bad::text").await, expected);
    assert_eq!(
        keys(&k, META_SCOPE).await,
        expected,
        "the scope is stored as written"
    );
    let n = nasty.len() as i64;
    assert_eq!(
        counts(&k).await,
        (2 * n, 2 * n, 0),
        "every table still there, each key once"
    );
    // Sorted here: collations differ across databases.
    let mut scopes: Vec<String> = k
        .rows("SELECT DISTINCT scope FROM idem_records", &[], &[Ty::Text])
        .await
        .into_iter()
        .map(|row| row[0].text())
        .collect();
    scopes.sort();
    let mut want = vec![META_SCOPE.to_string(), "bad::text".to_string()];
    want.sort();
    assert_eq!(scopes, want);
    k.close().await;
}

#[idempotent(key = "msg.0", version = "msg.1", scope = "suite::raw")]
async fn raw<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: (Vec<u8>, u64),
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    exec::<DB>(&mut **tx, d, "INSERT INTO audit (note) VALUES ('raw')", &[]).await
}

#[idempotent(
    key = "msg.id",
    entity = "msg.account",
    version = "msg.amount",
    scope = "suite::by_account"
)]
async fn by_account<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: &crate::fixtures::Credit,
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO audit (note) VALUES ('by_account')",
        &[],
    )
    .await
}

#[idempotent(key = "(msg.0, msg.1)", scope = "suite::composite")]
async fn composite<DB: KitDb>(
    tx: &mut Tx<'_, DB>,
    msg: (&str, &str),
    d: &Dialect,
) -> Result<(), sqlx::Error> {
    exec::<DB>(
        &mut **tx,
        d,
        "INSERT INTO audit (note) VALUES ('composite')",
        &[],
    )
    .await
}

/// Bad keys of every kind of handler (raw bytes, an entity, a composite key with a blank part)
/// and an out-of-range version are refused before any write; the largest allowed ones apply.
pub async fn bad_keys_and_versions_are_refused_before_any_write<B: Backend>() {
    let (k, d) = crate::__open!(B, crate::fixtures::setup);
    let pool = &k.pool;
    let expect =
        |result: Result<Outcome<()>, Error<sqlx::Error>>, part: KeyPart, problem: KeyProblem| {
            match result {
                Err(Error::Key(err)) => {
                    assert_eq!((err.part(), err.problem()), (part, &problem));
                    if part == KeyPart::Version {
                        assert_eq!(err.scope(), "suite::raw");
                    }
                    err.to_string()
                }
                other => panic!("expected a key error, got {other:?}"),
            }
        };
    let text = expect(
        raw(pool, (Vec::new(), 1), &d).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    assert_eq!(text, "idempotent handler `suite::raw`: key is empty");
    let long = vec![b'k'; idem::key::MAX_KEY_LEN + 1];
    expect(
        raw(pool, (long, 1), &d).await,
        KeyPart::Key,
        KeyProblem::TooLong { len: 513, max: 512 },
    );
    let text = expect(
        raw(pool, (b"ok".to_vec(), u64::MAX), &d).await,
        KeyPart::Version,
        KeyProblem::OutOfRange(u64::MAX.to_string()),
    );
    assert!(
        text.contains("18446744073709551615 does not fit in an i64"),
        "{text}"
    );
    let mut empty_entity = crate::fixtures::credit("k", "", 1);
    expect(
        by_account(pool, &empty_entity, &d).await,
        KeyPart::Entity,
        KeyProblem::Empty,
    );
    // A composite key with a blank part would fold every such message into one: refused.
    expect(
        composite(pool, ("acme", ""), &d).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    expect(
        composite(pool, ("", "m-1"), &d).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    let nothing = (
        rows_in(&k, "audit").await,
        rows_in(&k, "idem_records").await,
        rows_in(&k, "idem_versions").await,
    );
    assert_eq!(nothing, (0, 0, 0), "nothing written");
    assert!(composite(pool, ("acme", "m-1"), &d)
        .await
        .unwrap()
        .is_applied());
    // The longest allowed key and the largest version are fine.
    let max = vec![b'k'; idem::key::MAX_KEY_LEN];
    assert!(raw(pool, (max.clone(), i64::MAX as u64), &d)
        .await
        .unwrap()
        .is_applied());
    assert_eq!(stored_version(&k, "suite::raw", &max).await, Some(i64::MAX));
    empty_entity.account = "acct".into();
    assert!(by_account(pool, &empty_entity, &d)
        .await
        .unwrap()
        .is_applied());
    assert_eq!(rows_in(&k, "audit").await, 3);
    k.close().await;
}
