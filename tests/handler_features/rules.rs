// The rules, generic over the backend of the module that includes this file (`Db`).

use idem::{idempotent, Outcome, Tx};
use sqlx::Pool;


/// How many rows `table` has.
async fn count(pool: &Pool<Db>, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn effects_table(pool: &Pool<Db>) {
    sqlx::query("CREATE TABLE effects (msg TEXT NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// Key only, no option: what idem 0.1 wrote.
#[idempotent(key = "id", scope = "features::plain")]
async fn plain(tx: &mut Tx<'_, Db>, id: &str) -> Result<(), sqlx::Error> {
    sqlx::query(super::sql("INSERT INTO effects (msg) VALUES ($1)"))
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Migration 0002 applies to a database created by 0001, and the records it holds still dedupe.
pub async fn an_old_schema_migrates_and_its_records_still_dedupe(_: &Pool<Db>) {
    let pool = old_database().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(MIGRATION_0001))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE idem_migrations (version BIGINT PRIMARY KEY); \
         INSERT INTO idem_migrations (version) VALUES (1)",
    )
    .execute(&pool)
    .await
    .unwrap();
    effects_table(&pool).await;
    // Live records, written by the old schema's statements.
    assert_eq!(plain(&pool, "m1").await.unwrap(), Outcome::Applied(()));
    assert_eq!(plain(&pool, "m2").await.unwrap(), Outcome::Applied(()));
    // And a batch's claim: neither names a column the old schema lacks.
    let ids = ["m3", "m4", "m1"];
    let batched = idem::batch(&pool, &ids, async |b, id| plain(b, id).await)
        .await
        .unwrap();
    let outcomes: Vec<Outcome<()>> = batched.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        outcomes,
        [Outcome::Applied(()), Outcome::Applied(()), Outcome::Duplicate]
    );

    idem::migrate(&pool).await.unwrap();
    idem::migrate(&pool).await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM idem_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(versions, [1, 2, 3, 4, 5]); // 0003: the outbox; 0004: recovery; 0005: the backlog index
    assert_eq!(count(&pool, "idem_attempts").await, 0);
    let stamped: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM idem_records WHERE fingerprint IS NULL AND result IS NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stamped, 4, "old records keep their rows, new columns empty");

    assert_eq!(plain(&pool, "m1").await.unwrap(), Outcome::Duplicate);
    assert_eq!(plain(&pool, "m2").await.unwrap(), Outcome::Duplicate);
    assert_eq!(plain(&pool, "m4").await.unwrap(), Outcome::Duplicate);
    assert_eq!(plain(&pool, "m5").await.unwrap(), Outcome::Applied(()));
    assert_eq!(count(&pool, "effects").await, 5);
    assert_eq!(count(&pool, "idem_records").await, 5);
    release_old(pool).await;
}
