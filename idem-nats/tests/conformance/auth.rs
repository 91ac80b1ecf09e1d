//! Credentials in the URL: async-nats reads none from a URL (and logs the URLs it dials), so
//! the adapter moves them into the connection options. Against a private `nats-server` that
//! requires a user and password (and one that requires a token), the consumer and the outbox
//! publisher connect with `nats://user:password@host` (`nats://token@host`), reading the stream
//! and its consumer on the way; a wrong password fails with the server's refusal, and no error
//! shows the secret.

use std::time::Duration;

use idem::nats::async_nats::{self, jetstream};
use idem::nats::{OutboxPublisher, Source};
use idem_testkit::broker::harness;
use idem_testkit::servers::NatsServer;

const SECRET: &str = "s3cret-Pa55w0rd";

/// Creates the stream `ORDERS` and its durable consumer `workers`, connected with `options`.
async fn streams(url: &str, options: async_nats::ConnectOptions) {
    let js = jetstream::new(options.connect(url).await.unwrap());
    js.create_stream(jetstream::stream::Config {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let config = jetstream::consumer::pull::Config {
        durable_name: Some("workers".into()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ..Default::default()
    };
    js.create_consumer_on_stream(config, "ORDERS")
        .await
        .unwrap();
}

/// Both connect with `good`; both fail with `bad`, naming the refusal, never the secret.
async fn connects_with_the_urls_credentials(good: &str, bad: &str) {
    let limit = Duration::from_secs(20);
    let source = Source::builder(good, "ORDERS", "workers").connect();
    let source = harness::within(limit, "the source connects", source).await;
    source
        .expect("the URL's credentials are used")
        .close()
        .await
        .unwrap();
    let publisher = OutboxPublisher::builder(good).connect();
    harness::within(limit, "the publisher connects", publisher)
        .await
        .expect("the URL's credentials are used");

    let source = Source::builder(bad, "ORDERS", "workers").connect();
    let err = harness::within(limit, "a wrong secret", source)
        .await
        .expect_err("the server refuses a wrong secret");
    let publisher = OutboxPublisher::builder(bad).connect();
    let err2 = harness::within(limit, "a wrong secret", publisher)
        .await
        .expect_err("the server refuses a wrong secret");
    for err in [
        err.to_string(),
        format!("{err:?}"),
        err2.to_string(),
        format!("{err2:?}"),
    ] {
        assert!(!err.contains(SECRET) && !err.contains("wrong-"), "{err}");
        assert!(
            err.to_lowercase().contains("auth"),
            "names the refusal: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_user_and_password_in_the_url_are_used_and_never_shown() {
    let options = ["--user", "ada", "--pass", SECRET];
    let Some(server) = NatsServer::start_with("idem_nats_auth", "NATS auth test", &options) else {
        return;
    };
    let admin = async_nats::ConnectOptions::new().user_and_password("ada".into(), SECRET.into());
    streams(&server.url(), admin).await;
    let at = |password: &str| {
        server
            .url()
            .replace("nats://", &format!("nats://ada:{password}@"))
    };
    // A list: the credentials of the first URL that has any, for every server.
    let good = format!("{},{}", at(SECRET), server.url());
    connects_with_the_urls_credentials(&good, &at(&format!("wrong-{SECRET}"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_nats,
    ignore = "set IDEM_NATS_URL (e.g. nats://127.0.0.1:4222) to run"
)]
async fn a_token_in_the_url_is_used_and_never_shown() {
    let Some(server) =
        NatsServer::start_with("idem_nats_token", "NATS auth test", &["--auth", SECRET])
    else {
        return;
    };
    streams(
        &server.url(),
        async_nats::ConnectOptions::with_token(SECRET.into()),
    )
    .await;
    let at = |token: &str| server.url().replace("nats://", &format!("nats://{token}@"));
    connects_with_the_urls_credentials(&at(SECRET), &at(&format!("wrong-{SECRET}"))).await;
}
