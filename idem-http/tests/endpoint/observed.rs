//! Requests are counted like deliveries: `idem_messages_total{scope,outcome}` by outcome, with
//! the claim and the handling timed.

use std::sync::{Arc, OnceLock};

use axum::routing::post;
use idem::http::IdempotencyLayer;
use idem_testkit::rules::metrics::TestRecorder;

use crate::support::{client, create_route, with_db, Server, Steer};

/// The process's recorder: installed once; this case alone uses its scope.
fn recorder() -> &'static TestRecorder {
    static RECORDER: OnceLock<&'static TestRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(recorder).expect("no other recorder in this process");
        recorder
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_by_outcome_like_deliveries() {
    let recorder = recorder();
    with_db::<sqlx::Sqlite>(async |pool| {
        let steer = Arc::new(Steer::default());
        let layer = IdempotencyLayer::new(pool.clone(), "test::observed", client);
        let router = axum::Router::new()
            .route("/payments", post(create_route::<sqlx::Sqlite>).layer(layer))
            .with_state(Arc::clone(&steer));
        let server = Server::start(router).await;
        let alice = server.client("alice");
        let send = |key: &'static str, body: &'static str| {
            let alice = alice.clone();
            async move { alice.post("/payments", Some(key), body).await }
        };
        assert_eq!(send("\"m-1\"", r#"{"amount":1}"#).await.status, 201);
        assert!(send("\"m-1\"", r#"{"amount":1}"#).await.replayed);
        assert!(send("\"m-1\"", r#"{"amount":1}"#).await.replayed);
        assert_eq!(send("\"m-1\"", r#"{"amount":2}"#).await.status, 422);
        steer
            .fail_next
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(send("\"m-2\"", r#"{"amount":1}"#).await.status, 500);
        let total = |outcome: &str| {
            recorder.get(&format!(
                "idem_messages_total{{outcome={outcome},scope=test::observed}}"
            ))
        };
        assert_eq!(
            [
                total("applied"),
                total("replayed"),
                total("conflict"),
                total("failed")
            ],
            [1, 2, 1, 1]
        );
        assert_eq!(
            recorder.get("idem_claim_duration_seconds{scope=test::observed}"),
            5
        );
    })
    .await;
}
