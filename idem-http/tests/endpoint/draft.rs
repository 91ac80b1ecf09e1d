//! Each behaviour of draft-ietf-httpapi-idempotency-key-header, and what idem-http stores.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sqlx::Pool;

use crate::support::{
    app, on_every_db, payments, records, Client, Payment, Seen, Server, Steer, TestDb,
};

const PAY: &str = r#"{"amount":1250}"#;

/// The app on a server, its steering, and the client `alice`.
async fn start<DB: TestDb>(pool: &Pool<DB>) -> (Server, Arc<Steer>, Client) {
    let steer = Arc::new(Steer::default());
    let server = Server::start(app(pool.clone(), Arc::clone(&steer))).await;
    let alice = server.client("alice");
    (server, steer, alice)
}

fn problem(seen: &Seen) -> serde_json::Value {
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/problem+json"),
        "{seen:?}"
    );
    serde_json::from_slice(&seen.body).unwrap()
}

async fn a_retry_gets_the_stored_response_and_runs_nothing<DB: TestDb>(pool: Pool<DB>) {
    let (_server, steer, alice) = start(&pool).await;
    let first = alice.post("/payments", Some("\"k-1\""), PAY).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert!(!first.replayed);
    let payment: Payment = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(
        first.location.as_deref(),
        Some(&*format!("/payments/{}", payment.id))
    );
    for _ in 0..3 {
        let again = alice.post("/payments", Some("\"k-1\""), PAY).await;
        assert!(again.replayed);
        assert_eq!(
            (again.status, &again.location, &again.body),
            (201, &first.location, &first.body)
        );
        assert_eq!(again.content_type, first.content_type);
    }
    assert_eq!(steer.runs.load(Ordering::SeqCst), 1);
    assert_eq!(payments(&pool).await, 1);
    assert_eq!(records(&pool, "test::payments").await, 1);
}

async fn another_request_with_the_same_key_is_422_and_runs_nothing<DB: TestDb>(pool: Pool<DB>) {
    let (_server, steer, alice) = start(&pool).await;
    let first = alice.post("/payments", Some("\"k-2\""), PAY).await;
    assert_eq!(first.status, 201);
    let other_body = alice
        .post("/payments", Some("\"k-2\""), r#"{"amount":9999}"#)
        .await;
    assert_eq!(other_body.status, 422, "{}", other_body.text());
    assert!(problem(&other_body)["detail"]
        .as_str()
        .unwrap()
        .contains("new key"));
    // The same key and body on another route of the same scope would be another path; here the
    // route `/optional` has a scope of its own, so the key is free there.
    assert_eq!(steer.runs.load(Ordering::SeqCst), 1);
    assert_eq!(payments(&pool).await, 1);
    let same = alice.post("/payments", Some("\"k-2\""), PAY).await;
    assert_eq!(
        (same.status, same.replayed, &same.body),
        (201, true, &first.body)
    );
}

async fn another_client_with_the_same_key_gets_its_own_effect<DB: TestDb>(pool: Pool<DB>) {
    let (server, steer, alice) = start(&pool).await;
    let bob = server.client("bob");
    let (alice, bob_seen) = (
        alice.post("/payments", Some("\"shared\""), PAY).await,
        bob.post("/payments", Some("\"shared\""), PAY).await,
    );
    assert_eq!((alice.status, bob_seen.status), (201, 201));
    assert!(
        !bob_seen.replayed,
        "bob got alice's response: {}",
        bob_seen.text()
    );
    let (alice, bob_paid): (Payment, Payment) = (
        serde_json::from_slice(&alice.body).unwrap(),
        serde_json::from_slice(&bob_seen.body).unwrap(),
    );
    assert_ne!(alice.id, bob_paid.id);
    assert_eq!(
        (alice.client.as_str(), bob_paid.client.as_str()),
        ("alice", "bob")
    );
    let bob_again = bob.post("/payments", Some("\"shared\""), PAY).await;
    assert_eq!(
        serde_json::from_slice::<Payment>(&bob_again.body).unwrap(),
        bob_paid
    );
    assert_eq!(steer.runs.load(Ordering::SeqCst), 2);
    assert_eq!(payments(&pool).await, 2);
    // A request that names no client is refused before anything runs.
    let anonymous = reqwest::Client::new()
        .post(format!("{}/payments", server.url))
        .header("idempotency-key", "\"shared\"")
        .body(PAY)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(payments(&pool).await, 2);
}

async fn missing_and_malformed_keys_are_400_with_a_message<DB: TestDb>(pool: Pool<DB>) {
    let (_server, steer, alice) = start(&pool).await;
    let long = format!("\"{}\"", "k".repeat(256));
    for (key, says) in [
        (None, "requires an Idempotency-Key"),
        (Some("\"\""), "empty string"),
        (Some(long.as_str()), "at most 255"),
        (Some("k-3"), "Structured Field string"),
        (Some("\"open"), "Structured Field string"),
    ] {
        let seen = alice.post("/payments", key, PAY).await;
        assert_eq!(seen.status, 400, "{key:?}: {}", seen.text());
        let detail = problem(&seen)["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(says), "{key:?}: {detail}");
    }
    assert_eq!(steer.runs.load(Ordering::SeqCst), 0);
    assert_eq!(payments(&pool).await, 0);
    assert_eq!(records(&pool, "test::payments").await, 0);
}

async fn where_the_key_is_optional_a_request_without_one_runs_plainly<DB: TestDb>(pool: Pool<DB>) {
    let (_server, _steer, alice) = start(&pool).await;
    let one = alice.post("/optional", None, PAY).await;
    let two = alice.post("/optional", None, PAY).await;
    assert_eq!((one.status, two.status, two.replayed), (201, 201, false));
    assert_ne!(one.body, two.body);
    assert_eq!(payments(&pool).await, 2);
    assert_eq!(records(&pool, "test::optional").await, 0);
    // With a key, the same route is idempotent.
    let keyed = alice.post("/optional", Some("\"k-4\""), PAY).await;
    let again = alice.post("/optional", Some("\"k-4\""), PAY).await;
    assert_eq!((again.replayed, &again.body), (true, &keyed.body));
    assert_eq!(payments(&pool).await, 3);
}

async fn a_5xx_rolls_back_and_is_not_stored_so_the_retry_runs_again<DB: TestDb>(pool: Pool<DB>) {
    let (_server, steer, alice) = start(&pool).await;
    steer.fail_next.store(true, Ordering::SeqCst);
    let failed = alice.post("/payments", Some("\"k-5\""), PAY).await;
    assert_eq!(
        (failed.status, failed.text().as_str()),
        (500, "the ledger is down")
    );
    assert_eq!(
        payments(&pool).await,
        0,
        "the failed run's write was rolled back"
    );
    assert_eq!(records(&pool, "test::payments").await, 0);
    let retried = alice.post("/payments", Some("\"k-5\""), PAY).await;
    assert_eq!((retried.status, retried.replayed), (201, false));
    assert_eq!(steer.runs.load(Ordering::SeqCst), 2);
    assert_eq!(payments(&pool).await, 1);
}

async fn a_4xx_answer_is_stored_with_its_writes<DB: TestDb>(pool: Pool<DB>) {
    let (_server, steer, alice) = start(&pool).await;
    let declined = alice.post("/declined", Some("\"k-6\""), PAY).await;
    assert_eq!(
        (declined.status, declined.text().as_str()),
        (402, "card declined")
    );
    let again = alice.post("/declined", Some("\"k-6\""), PAY).await;
    assert_eq!(
        (again.status, again.replayed, &again.body),
        (402, true, &declined.body)
    );
    assert_eq!(steer.runs.load(Ordering::SeqCst), 1);
    assert_eq!(payments(&pool).await, 1);
}

async fn a_response_over_the_stored_limit_is_refused_and_nothing_is_half_stored<DB: TestDb>(
    pool: Pool<DB>,
) {
    let (_server, steer, alice) = start(&pool).await;
    let fits = alice
        .post("/big", Some("\"k-7\""), r#"{"amount":1024}"#)
        .await;
    assert_eq!((fits.status, fits.body.len()), (200, 1024));
    let over = alice
        .post("/big", Some("\"k-8\""), r#"{"amount":1025}"#)
        .await;
    assert_eq!(over.status, 500);
    let detail = problem(&over)["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("over the 1024 bytes") && detail.contains("nothing was stored"),
        "{detail}"
    );
    assert_eq!(
        payments(&pool).await,
        1,
        "the refused run's write was rolled back"
    );
    assert_eq!(records(&pool, "test::big").await, 1);
    let retried = alice
        .post("/big", Some("\"k-8\""), r#"{"amount":1025}"#)
        .await;
    assert_eq!((retried.status, retried.replayed), (500, false));
    assert_eq!(steer.runs.load(Ordering::SeqCst), 3);
    let replay = alice
        .post("/big", Some("\"k-7\""), r#"{"amount":1024}"#)
        .await;
    assert_eq!((replay.replayed, &replay.body), (true, &fits.body));
}

async fn a_request_body_over_the_limit_is_413<DB: TestDb>(pool: Pool<DB>) {
    let (_server, steer, alice) = start(&pool).await;
    let body = format!(
        r#"{{"amount":1,"pad":"{}"}}"#,
        "x".repeat(idem::http::DEFAULT_MAX_REQUEST_BYTES)
    );
    let seen = alice.post("/payments", Some("\"k-9\""), &body).await;
    assert_eq!(seen.status, 413, "{}", seen.text());
    assert_eq!(steer.runs.load(Ordering::SeqCst), 0);
    assert_eq!(records(&pool, "test::payments").await, 0);
}

async fn an_expired_key_is_purged_and_then_runs_again<DB: TestDb>(pool: Pool<DB>) {
    use axum::routing::post;
    use std::time::Duration;
    let steer = Arc::new(Steer::default());
    let short =
        idem::http::IdempotencyLayer::new(pool.clone(), "test::short", crate::support::client)
            .retention(Duration::from_millis(300));
    let router = axum::Router::new()
        .route(
            "/payments",
            post(crate::support::create_route::<DB>).layer(short),
        )
        .with_state(Arc::clone(&steer));
    let server = Server::start(router).await;
    let alice = server.client("alice");
    let first = alice.post("/payments", Some("\"k-10\""), PAY).await;
    let kept = alice.post("/payments", Some("\"k-10\""), PAY).await;
    assert_eq!((first.status, kept.replayed), (201, true));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let purged = idem::retention::purge_expired(&pool, 100).await.unwrap();
    assert!(purged >= 1, "{purged}");
    assert_eq!(records(&pool, "test::short").await, 0);
    let after = alice.post("/payments", Some("\"k-10\""), PAY).await;
    assert_eq!((after.status, after.replayed), (201, false));
    assert_eq!(payments(&pool).await, 2);
}

on_every_db!(
    a_retry_gets_the_stored_response_and_runs_nothing,
    another_request_with_the_same_key_is_422_and_runs_nothing,
    another_client_with_the_same_key_gets_its_own_effect,
    missing_and_malformed_keys_are_400_with_a_message,
    where_the_key_is_optional_a_request_without_one_runs_plainly,
    a_5xx_rolls_back_and_is_not_stored_so_the_retry_runs_again,
    a_4xx_answer_is_stored_with_its_writes,
    a_response_over_the_stored_limit_is_refused_and_nothing_is_half_stored,
    a_request_body_over_the_limit_is_413,
    an_expired_key_is_purged_and_then_runs_again,
);
