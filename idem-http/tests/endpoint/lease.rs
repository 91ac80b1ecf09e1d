//! A request with a key whose first request is still running: in lease mode 409 at once, in the
//! transactional mode a wait for the first one's response.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;

use crate::support::{app, on_every_db, payments, Server, Steer, TestDb};

const PAY: &str = r#"{"amount":500}"#;

async fn until_started(steer: &Steer, n: u64) {
    for _ in 0..500 {
        if steer.started.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the first request did not start its handler");
}

async fn in_lease_mode_a_request_in_flight_gets_409_with_retry_after<DB: TestDb>(pool: Pool<DB>) {
    let steer = Arc::new(Steer::default());
    let server = Server::start(app(pool.clone(), Arc::clone(&steer))).await;
    let alice = server.client("alice");
    let first = tokio::spawn({
        let alice = alice.clone();
        async move { alice.post("/leased", Some("\"l-1\""), PAY).await }
    });
    until_started(&steer, 1).await;
    let busy = alice.post("/leased", Some("\"l-1\""), PAY).await;
    assert_eq!(
        (busy.status, busy.retry_after.as_deref()),
        (409, Some("1")),
        "{}",
        busy.text()
    );
    assert_eq!(
        busy.content_type.as_deref(),
        Some("application/problem+json")
    );
    let other = alice
        .post("/leased", Some("\"l-1\""), r#"{"amount":7}"#)
        .await;
    assert_eq!(
        other.status,
        422,
        "another body is refused while the first runs: {}",
        other.text()
    );
    assert_eq!(steer.runs.load(Ordering::SeqCst), 1);
    steer.release.notify_waiters();
    let first = first.await.unwrap();
    assert_eq!((first.status, first.replayed), (201, false));
    let again = alice.post("/leased", Some("\"l-1\""), PAY).await;
    assert_eq!(
        (again.status, again.replayed, &again.body),
        (201, true, &first.body)
    );
    assert_eq!(steer.runs.load(Ordering::SeqCst), 1);
    assert_eq!(payments(&pool).await, 1);
}

async fn in_the_transactional_mode_a_request_in_flight_waits_for_the_first_response<DB: TestDb>(
    pool: Pool<DB>,
) {
    let steer = Arc::new(Steer::default());
    let server = Server::start(app(pool.clone(), Arc::clone(&steer))).await;
    let alice = server.client("alice");
    let send = || {
        let alice = alice.clone();
        tokio::spawn(async move { alice.post("/slow", Some("\"w-1\""), PAY).await })
    };
    let first = send();
    until_started(&steer, 1).await;
    let second = send();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second request waits on the first one's claim"
    );
    steer.release.notify_waiters();
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((first.status, first.replayed), (201, false));
    assert_eq!(
        (second.status, second.replayed, &second.body),
        (201, true, &first.body)
    );
    assert_eq!(steer.runs.load(Ordering::SeqCst), 1);
    assert_eq!(payments(&pool).await, 1);
}

on_every_db!(
    in_lease_mode_a_request_in_flight_gets_409_with_retry_after,
    in_the_transactional_mode_a_request_in_flight_waits_for_the_first_response,
);
