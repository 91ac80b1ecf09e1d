//! The same key sent many times at once: one effect per key, every answer the first response or
//! a 409, and the stored response byte for byte afterwards.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::join_all;
use sqlx::Pool;

use crate::support::{app, on_every_db, payments, Seen, Server, Steer, TestDb};

const KEYS: usize = 100;
const COPIES: usize = 10;

async fn race<DB: TestDb>(pool: Pool<DB>, path: &str) {
    let steer = Arc::new(Steer::default());
    let server = Server::start(app(pool.clone(), Arc::clone(&steer))).await;
    let alice = server.client("alice");
    let key = |k: usize| format!("\"race-{k}\"");
    let body = |k: usize| format!(r#"{{"amount":{k}}}"#);
    let sent = (0..KEYS)
        .flat_map(|k| (0..COPIES).map(move |_| k))
        .map(|k| {
            let (alice, key, body) = (alice.clone(), key(k), body(k));
            async move { (k, alice.post(path, Some(&key), &body).await) }
        });
    let mut by_key: HashMap<usize, Vec<Seen>> = HashMap::new();
    for (k, seen) in join_all(sent).await {
        by_key.entry(k).or_default().push(seen);
    }
    assert_eq!(payments(&pool).await, KEYS as i64, "one effect per key");
    for k in 0..KEYS {
        let seen = &by_key[&k];
        let applied: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.status == 201 && !s.replayed)
            .collect();
        assert_eq!(applied.len(), 1, "key {k}: {seen:?}");
        let first = applied[0];
        for other in seen {
            let same = other.status == 201 && other.body == first.body;
            let busy = other.status == 409 && other.retry_after.as_deref() == Some("1");
            assert!(
                same || busy,
                "key {k}: {other:?} is neither the first response nor a 409"
            );
        }
        let again = alice.post(path, Some(&key(k)), &body(k)).await;
        assert!(again.replayed, "key {k}: {again:?}");
        assert_eq!(
            (again.status, &again.location, &again.body),
            (201, &first.location, &first.body)
        );
    }
    assert_eq!(payments(&pool).await, KEYS as i64);
}

async fn copies_sent_at_once_apply_once_and_wait_for_the_first<DB: TestDb>(pool: Pool<DB>) {
    race(pool, "/payments").await;
}

async fn in_lease_mode_copies_sent_at_once_apply_once_or_get_409<DB: TestDb>(pool: Pool<DB>) {
    race(pool, "/payments-leased").await;
}

on_every_db!(
    copies_sent_at_once_apply_once_and_wait_for_the_first,
    in_lease_mode_copies_sent_at_once_apply_once_or_get_409,
);
