//! SQLite's dead letters: times are epoch milliseconds of SQLite's clock, as the dialect's
//! defaults write them, and one writer at a time, so a bounded delete needs no lock clause.

use sqlx::Sqlite;

use crate::backend::dead_letters::{dead_letter_admin, DeadLetterDialect};

impl DeadLetterDialect for Sqlite {}

dead_letter_admin!(Sqlite);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sqlx::Pool;

    use super::*;
    use crate::admin::{
        replay_id, Admin, DeadLetterAdmin, DeadLetterFilter, DeadLetterState, Page, ReplayOutcome,
        ABANDONED,
    };
    use crate::recover::{group_of, shape};

    async fn pool() -> Pool<Sqlite> {
        // One connection: each connection of `sqlite::memory:` is a database of its own.
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        crate::migrate(&pool).await.unwrap();
        pool
    }

    /// A dead letter of `scope` and `key` that failed last `ago` ms ago with `error`.
    async fn bury(pool: &Pool<Sqlite>, scope: &str, key: &[u8], error: &str, ago: i64) -> i64 {
        let shape = shape(error);
        let group = group_of("c", Some(scope), "poisoned", &shape);
        sqlx::query_scalar(concat!(
            "INSERT INTO idem_dead_letters (consumer, scope, msg_key, reason, error, error_shape, \
             error_group, payload, headers, broker, source, coordinates, destination, attempts, \
             first_failed_at, last_failed_at) VALUES ('c', ?1, ?2, 'poisoned', ?3, ?4, ?5, \
             '{\"n\":1}', '[[\"h\",\"v\"]]', 'memory', 'in', 'offset 3', 'out', 3, ",
            now_ms!(),
            " - ?6, ",
            now_ms!(),
            " - ?6) RETURNING id"
        ))
        .bind(scope)
        .bind(key)
        .bind(error)
        .bind(&shape)
        .bind(&group)
        .bind(ago)
        .fetch_one(pool)
        .await
        .unwrap()
    }

    /// A parked retry of consumer `c`, due `due_in` ms from now, held for `lease_in` ms.
    async fn park(pool: &Pool<Sqlite>, due_in: i64, lease_in: Option<i64>) {
        sqlx::query(concat!(
            "INSERT INTO idem_parked (consumer, payload, headers, broker, source, coordinates, \
             destination, attempts, last_error, first_failed_at, due_at, lease_until) VALUES \
             ('c', X'00FF', NULL, 'memory', 'in', 'offset 9', 'out', 2, 'order 7 not found', ",
            now_ms!(),
            " - 5000, ",
            now_ms!(),
            " + ?1, ",
            now_ms!(),
            " + ?2)"
        ))
        .bind(due_in)
        .bind(lease_in)
        .execute(pool)
        .await
        .unwrap();
    }

    async fn count(pool: &Pool<Sqlite>, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
    }

    #[tokio::test]
    async fn groups_lists_and_pages_follow_the_filter() {
        let pool = pool().await;
        for n in 0..3 {
            bury(
                &pool,
                "a",
                format!("k{n}").as_bytes(),
                &format!("order {n} not found"),
                10,
            )
            .await;
        }
        let other = bury(&pool, "b", b"x", "card 'X-1' declined", 10).await;
        let groups = Sqlite::groups(&pool, &DeadLetterFilter::default())
            .await
            .unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(
            (groups[0].count, groups[0].shape.as_str()),
            (3, "order # not found")
        );
        assert_eq!(groups[1].count, 1);
        let b = DeadLetterFilter {
            scope: Some("b".into()),
            ..DeadLetterFilter::default()
        };
        let listed = Sqlite::list(
            &pool,
            &b,
            Page {
                after: None,
                limit: 10,
            },
        )
        .await
        .unwrap();
        assert_eq!(listed.iter().map(|d| d.id).collect::<Vec<_>>(), [other]);
        let first = Sqlite::list(
            &pool,
            &DeadLetterFilter::default(),
            Page {
                after: None,
                limit: 2,
            },
        )
        .await
        .unwrap();
        let rest = Sqlite::list(
            &pool,
            &DeadLetterFilter::default(),
            Page {
                after: Some(first[1].id),
                limit: 10,
            },
        )
        .await
        .unwrap();
        assert_eq!((first.len(), rest.len()), (2, 2));
        let now = Sqlite::now_ms(&pool).await.unwrap();
        let later = DeadLetterFilter {
            since_ms: Some(now + 1_000),
            ..DeadLetterFilter::default()
        };
        assert!(Sqlite::groups(&pool, &later).await.unwrap().is_empty());
        let dead = Sqlite::dead_letter(&pool, other).await.unwrap().unwrap();
        assert_eq!(dead.payload, b"{\"n\":1}");
        assert_eq!(dead.headers, [("h".to_string(), "v".to_string())]);
        assert_eq!(dead.info.key.as_deref(), Some(&b"x"[..]));
        assert!(Sqlite::dead_letter(&pool, other + 100)
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn a_replay_inserts_one_outbox_message_clears_attempts_and_settles() {
        let pool = pool().await;
        let id = bury(&pool, "a", b"k", "boom", 10).await;
        sqlx::query("INSERT INTO idem_attempts (scope, msg_key, attempts) VALUES ('a', X'6B', 3)")
            .execute(&pool)
            .await
            .unwrap();
        let done = Sqlite::replay(&pool, &[id, id + 100]).await.unwrap();
        let outbox_id = replay_id(id, None);
        assert_eq!(
            done[0].outcome,
            ReplayOutcome::Replayed {
                outbox_id: outbox_id.clone(),
                destination: "out".into()
            }
        );
        assert_eq!(done[1].outcome, ReplayOutcome::Missing);
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_attempts").await, 0);
        let (stored, headers): (String, Option<String>) =
            sqlx::query_as("SELECT id, headers FROM idem_outbox")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            (stored, headers.as_deref()),
            (outbox_id.clone(), Some("[[\"h\",\"v\"]]"))
        );
        let info = Sqlite::dead_letter(&pool, id).await.unwrap().unwrap().info;
        assert_eq!(info.state, DeadLetterState::Replayed);
        assert_eq!(info.replayed_as.as_deref(), Some(outbox_id.as_str()));
        assert!(info.settled_ms.is_some());

        // Again: nothing more. Put back to dead (as nothing in idem does), it gets a new id.
        let again = Sqlite::replay(&pool, &[id]).await.unwrap();
        assert_eq!(
            again[0].outcome,
            ReplayOutcome::NotDead(DeadLetterState::Replayed)
        );
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_outbox").await, 1);
        sqlx::query("UPDATE idem_dead_letters SET state = 'dead'")
            .execute(&pool)
            .await
            .unwrap();
        let again = Sqlite::replay(&pool, &[id]).await.unwrap();
        assert_eq!(
            again[0].outcome,
            ReplayOutcome::Replayed {
                outbox_id: replay_id(id, Some(&outbox_id)),
                destination: "out".into()
            }
        );
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_outbox").await, 2);
    }

    #[tokio::test]
    async fn unpublishable_dead_letters_are_refused_and_stay_dead() {
        let pool = pool().await;
        let bad_headers = bury(&pool, "a", b"k1", "boom", 10).await;
        let no_destination = bury(&pool, "a", b"k2", "boom", 10).await;
        sqlx::query("UPDATE idem_dead_letters SET headers = '[[\"a b\",\"v\"]]' WHERE id = ?1")
            .bind(bad_headers)
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("UPDATE idem_dead_letters SET destination = '' WHERE id = ?1")
            .bind(no_destination)
            .execute(&pool)
            .await
            .unwrap();
        let done = Sqlite::replay(&pool, &[bad_headers, no_destination])
            .await
            .unwrap();
        assert!(matches!(&done[0].outcome, ReplayOutcome::Refused(why) if why.contains("header")));
        assert!(
            matches!(&done[1].outcome, ReplayOutcome::Refused(why) if why.contains("destination"))
        );
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_outbox").await, 0);
        assert_eq!(
            count(
                &pool,
                "SELECT COUNT(*) FROM idem_dead_letters WHERE state = 'dead'"
            )
            .await,
            2
        );
    }

    #[tokio::test]
    async fn discards_and_purges_follow_state_and_age() {
        let pool = pool().await;
        let day = 86_400_000;
        let fresh = bury(&pool, "a", b"1", "boom", 10).await;
        let old = bury(&pool, "a", b"2", "boom", 3 * day).await;
        let settled_old = bury(&pool, "a", b"3", "boom", 3 * day).await;
        let settled_new = bury(&pool, "a", b"4", "boom", 3 * day).await;
        assert_eq!(
            Sqlite::discard(&pool, &[settled_old, settled_new, fresh + 100])
                .await
                .unwrap(),
            2
        );
        assert_eq!(Sqlite::discard(&pool, &[settled_old]).await.unwrap(), 0);
        sqlx::query(concat!(
            "UPDATE idem_dead_letters SET settled_at = ",
            now_ms!(),
            " - 2 * 86400000 WHERE id = ?1"
        ))
        .bind(settled_old)
        .execute(&pool)
        .await
        .unwrap();
        let retention = Duration::from_millis(day as u64);
        assert_eq!(
            Sqlite::purge_dead_letters(&pool, retention, 1)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            Sqlite::purge_dead_letters(&pool, retention, 10)
                .await
                .unwrap(),
            1
        );
        let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM idem_dead_letters ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(left, [fresh, settled_new], "{old} and {settled_old} purged");
    }

    #[tokio::test]
    async fn abandoned_parked_retries_become_dead_letters() {
        let pool = pool().await;
        let hour = 3_600_000;
        park(&pool, -3 * hour, None).await; // abandoned
        park(&pool, -3 * hour, Some(-1_000)).await; // abandoned: its lease ran out
        park(&pool, -3 * hour, Some(hour)).await; // held: a consumer runs it now
        park(&pool, -1_000, None).await; // due, not for long
        let counts = Sqlite::recovery_counts(&pool).await.unwrap();
        assert_eq!(counts.parked.len(), 1);
        assert_eq!((counts.parked[0].parked, counts.parked[0].held), (4, 1));
        assert!(counts.dead.is_empty());

        let retention = Duration::from_millis(hour as u64);
        assert_eq!(
            Sqlite::bury_abandoned(&pool, retention, 1).await.unwrap(),
            1
        );
        assert_eq!(
            Sqlite::bury_abandoned(&pool, retention, 10).await.unwrap(),
            1
        );
        assert_eq!(
            Sqlite::bury_abandoned(&pool, retention, 10).await.unwrap(),
            0
        );
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM idem_parked").await, 2);
        let buried = Sqlite::list(
            &pool,
            &DeadLetterFilter::default(),
            Page {
                after: None,
                limit: 10,
            },
        )
        .await
        .unwrap();
        assert_eq!(buried.len(), 2);
        let first = &buried[0];
        assert_eq!(
            (first.reason.as_str(), first.scope.as_deref()),
            (ABANDONED, None)
        );
        assert_eq!(
            (first.error.as_str(), first.attempts),
            ("order 7 not found", 2)
        );
        assert_eq!(
            first.group,
            group_of("c", None, ABANDONED, "order # not found")
        );
        assert!(first.last_failed_ms - first.first_failed_ms >= 5_000);
        let payload = Sqlite::dead_letter(&pool, first.id)
            .await
            .unwrap()
            .unwrap()
            .payload;
        assert_eq!(payload, [0, 0xff]);
        let counts = Sqlite::recovery_counts(&pool).await.unwrap();
        assert_eq!(counts.parked[0].parked, 2);
        assert_eq!(counts.dead.len(), 1);
        assert_eq!(
            (counts.dead[0].reason.as_str(), counts.dead[0].dead),
            (ABANDONED, 2)
        );
    }
}
