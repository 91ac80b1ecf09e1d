// The body of `tests/bad_input.rs`, included once per backend: it sees that backend's `Db`,
// `database()` and `release()`. (Included: no inner doc comments.)

use idem::key::{KeyPart, KeyProblem};
use idem::{idempotent, Error, Outcome, Tx};
use sqlx::Pool;

/// Opens a fresh database with the effects table, or skips (the reason printed).
macro_rules! db {
    () => {
        match database().await {
            Some(pool) => {
                sqlx::query("CREATE TABLE effects (handler TEXT NOT NULL, note TEXT NOT NULL)")
                    .execute(&pool)
                    .await
                    .unwrap();
                pool
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

async fn effect(tx: &mut Tx<'_, Db>, handler: &str, note: String) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (handler, note) VALUES ($1, $2)")
        .bind(handler)
        .bind(note)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[idempotent(key = "msg.key", scope = "bad::bytes")]
async fn by_bytes(tx: &mut Tx<'_, Db>, msg: &Bytes) -> Result<(), sqlx::Error> {
    effect(tx, "bytes", format!("{} bytes", msg.key.len())).await
}

#[idempotent(key = "msg.key", scope = "bad::text")]
async fn by_text(tx: &mut Tx<'_, Db>, msg: &Text) -> Result<(), sqlx::Error> {
    effect(tx, "text", msg.key.replace('\0', "\\0")).await
}

#[idempotent(key = "msg.key", version = "msg.version", scope = "bad::versioned")]
async fn versioned(tx: &mut Tx<'_, Db>, msg: &Versioned) -> Result<(), sqlx::Error> {
    effect(tx, "versioned", msg.version.to_string()).await
}

#[idempotent(key = "msg.key", version = "msg.version", scope = "bad::unsigned")]
async fn unsigned(tx: &mut Tx<'_, Db>, msg: &Unsigned) -> Result<(), sqlx::Error> {
    effect(tx, "unsigned", msg.version.to_string()).await
}

#[idempotent(
    key = "msg.key",
    version = "msg.version",
    entity = "msg.entity",
    scope = "bad::entity"
)]
async fn with_entity(tx: &mut Tx<'_, Db>, msg: &WithEntity) -> Result<(), sqlx::Error> {
    effect(tx, "entity", msg.key.clone()).await
}

#[idempotent(
    key = "msg.key",
    scope = "bad'; DROP TABLE idem_records; -- %_\\ \"x\" $1 ?"
)]
async fn meta_scope(tx: &mut Tx<'_, Db>, msg: &Text) -> Result<(), sqlx::Error> {
    effect(tx, "meta", msg.key.clone()).await
}

/// Rows in (effects, idem_records, idem_versions).
async fn counts(pool: &Pool<Db>) -> (i64, i64, i64) {
    let mut out = [0_i64; 3];
    for (n, table) in ["effects", "idem_records", "idem_versions"]
        .iter()
        .enumerate()
    {
        out[n] = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(pool)
            .await
            .unwrap();
    }
    (out[0], out[1], out[2])
}

/// The stored keys of `scope`, sorted.
async fn keys(pool: &Pool<Db>, scope: &str) -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> =
        sqlx::query_scalar("SELECT msg_key FROM idem_records WHERE scope = $1")
            .bind(scope)
            .fetch_all(pool)
            .await
            .unwrap();
    keys.sort();
    keys
}

async fn version_of(pool: &Pool<Db>, scope: &str, entity: &[u8]) -> Option<i64> {
    sqlx::query_scalar("SELECT version FROM idem_versions WHERE scope = $1 AND entity = $2")
        .bind(scope)
        .bind(entity)
        .fetch_optional(pool)
        .await
        .unwrap()
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

#[tokio::test]
async fn empty_key_is_refused_before_any_write() {
    let pool = db!();
    let text = refused(
        by_bytes(&pool, &Bytes { key: Vec::new() }).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    assert_eq!(text, "idempotent handler `bad::bytes`: key is empty");
    refused(
        by_text(&pool, &Text { key: String::new() }).await,
        KeyPart::Key,
        KeyProblem::Empty,
    );
    let empty_entity = WithEntity {
        key: "k".into(),
        entity: Vec::new(),
        version: 1,
    };
    refused(
        with_entity(&pool, &empty_entity).await,
        KeyPart::Entity,
        KeyProblem::Empty,
    );
    assert_eq!(counts(&pool).await, (0, 0, 0), "nothing written");
    release(pool).await;
}

#[tokio::test]
async fn megabyte_key_is_refused_before_any_write() {
    let pool = db!();
    let huge = vec![b'k'; 1 << 20];
    let text = refused(
        by_bytes(&pool, &Bytes { key: huge.clone() }).await,
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
        with_entity(&pool, &huge_entity).await,
        KeyPart::Entity,
        KeyProblem::TooLong {
            len: 1 << 20,
            max: idem::key::MAX_KEY_LEN,
        },
    );
    assert_eq!(counts(&pool).await, (0, 0, 0), "nothing written");
    // One byte over the limit is refused too; the limit itself is stored.
    refused(
        by_bytes(
            &pool,
            &Bytes {
                key: vec![b'k'; idem::key::MAX_KEY_LEN + 1],
            },
        )
        .await,
        KeyPart::Key,
        KeyProblem::TooLong {
            len: idem::key::MAX_KEY_LEN + 1,
            max: idem::key::MAX_KEY_LEN,
        },
    );
    let max = vec![0xff_u8; idem::key::MAX_KEY_LEN];
    applies_once(|| async { by_bytes(&pool, &Bytes { key: max.clone() }).await }).await;
    assert_eq!(keys(&pool, "bad::bytes").await, vec![max]);
    assert_eq!(counts(&pool).await, (1, 1, 0));
    release(pool).await;
}

#[tokio::test]
async fn keys_with_nul_bytes_are_stored_exactly() {
    let pool = db!();
    let nul_keys: [&[u8]; 4] = [b"\0", b"a\0b", b"a\0", b"a"];
    for key in nul_keys {
        applies_once(|| async { by_bytes(&pool, &Bytes { key: key.to_vec() }).await }).await;
    }
    // As text too: a Rust string may hold NUL, and the key is its bytes.
    applies_once(|| async { by_text(&pool, &Text { key: "x\0y".into() }).await }).await;
    let mut expected: Vec<Vec<u8>> = nul_keys.iter().map(|k| k.to_vec()).collect();
    expected.sort();
    assert_eq!(
        keys(&pool, "bad::bytes").await,
        expected,
        "no truncation at NUL"
    );
    assert_eq!(keys(&pool, "bad::text").await, vec![b"x\0y".to_vec()]);
    assert_eq!(counts(&pool).await, (5, 5, 0));
    release(pool).await;
}

#[tokio::test]
async fn non_utf8_byte_keys_are_stored_exactly() {
    let pool = db!();
    let invalid: [&[u8]; 4] = [&[0xff], &[0xff, 0xfe, 0x00, 0x80], &[0xc3], &[0xc3, 0x28]];
    for key in invalid {
        applies_once(|| async { by_bytes(&pool, &Bytes { key: key.to_vec() }).await }).await;
    }
    // U+FFFD, what a lossy conversion of 0xff would give, is another key.
    applies_once(|| async {
        by_bytes(
            &pool,
            &Bytes {
                key: "\u{fffd}".as_bytes().to_vec(),
            },
        )
        .await
    })
    .await;
    let mut expected: Vec<Vec<u8>> = invalid.iter().map(|k| k.to_vec()).collect();
    expected.push("\u{fffd}".as_bytes().to_vec());
    expected.sort();
    assert_eq!(keys(&pool, "bad::bytes").await, expected);
    assert_eq!(counts(&pool).await, (5, 5, 0));
    release(pool).await;
}

#[tokio::test]
async fn unicode_keys_are_compared_byte_for_byte() {
    let pool = db!();
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
        applies_once(|| async { by_text(&pool, &Text { key: key.into() }).await }).await;
    }
    let mut expected: Vec<Vec<u8>> = keys_in.iter().map(|k| k.as_bytes().to_vec()).collect();
    expected.sort();
    assert_eq!(keys(&pool, "bad::text").await, expected);
    let mut notes: Vec<String> = sqlx::query_scalar("SELECT note FROM effects")
        .fetch_all(&pool)
        .await
        .unwrap();
    notes.sort();
    let mut sorted: Vec<String> = keys_in.iter().map(|k| k.to_string()).collect();
    sorted.sort();
    assert_eq!(notes, sorted, "the effects, each once, as written");
    assert_eq!(counts(&pool).await, (10, 10, 0));
    release(pool).await;
}

#[tokio::test]
async fn extreme_versions_i64_min_and_max() {
    let pool = db!();
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
            versioned(&pool, &at(version)).await.unwrap(),
            expected,
            "version {version}"
        );
    }
    assert_eq!(
        version_of(&pool, "bad::versioned", b"entity").await,
        Some(i64::MAX)
    );
    assert_eq!(
        counts(&pool).await,
        (4, 0, 1),
        "four applied, one version row"
    );
    // With an entity too: a fresh entity accepts i64::MIN, and i64::MAX is final.
    let ev = |key: &str, version| WithEntity {
        key: key.into(),
        entity: b"e".to_vec(),
        version,
    };
    assert_eq!(
        with_entity(&pool, &ev("a", i64::MIN)).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        with_entity(&pool, &ev("b", i64::MAX)).await.unwrap(),
        Outcome::Applied(())
    );
    assert_eq!(
        with_entity(&pool, &ev("c", i64::MAX)).await.unwrap(),
        Outcome::Stale { latest: i64::MAX }
    );
    assert_eq!(counts(&pool).await, (6, 2, 2));
    release(pool).await;
}

#[tokio::test]
async fn unsigned_version_over_i64_max_is_refused_before_any_write() {
    let pool = db!();
    for version in [i64::MAX as u64 + 1, u64::MAX] {
        let text = refused(
            unsigned(
                &pool,
                &Unsigned {
                    key: "u".into(),
                    version,
                },
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
    assert_eq!(counts(&pool).await, (0, 0, 0), "nothing written");
    // The largest that fits is stored as itself, never wrapped to a negative number.
    let max = Unsigned {
        key: "u".into(),
        version: i64::MAX as u64,
    };
    applies_once(|| async { unsigned(&pool, &max).await }).await;
    assert_eq!(
        version_of(&pool, "bad::unsigned", b"u").await,
        Some(i64::MAX)
    );
    // And an over-large version after it is still refused, not taken as stale or as a wrap.
    let over = Unsigned {
        key: "u".into(),
        version: u64::MAX,
    };
    assert!(matches!(unsigned(&pool, &over).await, Err(Error::Key(_))));
    assert_eq!(counts(&pool).await, (1, 0, 1));
    release(pool).await;
}

#[tokio::test]
async fn negative_versions_order_as_signed_integers() {
    let pool = db!();
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
            versioned(&pool, &at(version)).await.unwrap(),
            expected,
            "version {version}"
        );
    }
    assert_eq!(version_of(&pool, "bad::versioned", b"neg").await, Some(0));
    let applied: Vec<String> = sqlx::query_scalar("SELECT note FROM effects")
        .fetch_all(&pool)
        .await
        .unwrap();
    let mut applied: Vec<i64> = applied.iter().map(|v| v.parse().unwrap()).collect();
    applied.sort_unstable();
    assert_eq!(applied, vec![-5, -3, -1, 0]);
    assert_eq!(counts(&pool).await, (4, 0, 1));
    release(pool).await;
}

#[tokio::test]
async fn sql_metacharacters_in_keys_and_scope_are_data() {
    let pool = db!();
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
        applies_once(|| async { by_text(&pool, &Text { key: key.into() }).await }).await;
        applies_once(|| async { meta_scope(&pool, &Text { key: key.into() }).await }).await;
    }
    // `%` and `_` matched nothing but themselves: every key is its own record.
    let mut expected: Vec<Vec<u8>> = nasty.iter().map(|k| k.as_bytes().to_vec()).collect();
    expected.sort();
    assert_eq!(keys(&pool, "bad::text").await, expected);
    assert_eq!(
        keys(&pool, META_SCOPE).await,
        expected,
        "the scope is stored as written"
    );
    let n = nasty.len() as i64;
    assert_eq!(
        counts(&pool).await,
        (2 * n, 2 * n, 0),
        "every table still there, each key once"
    );
    let scopes: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT scope FROM idem_records ORDER BY scope")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut want = vec![META_SCOPE.to_string(), "bad::text".to_string()];
    want.sort();
    assert_eq!(scopes, want);
    release(pool).await;
}
