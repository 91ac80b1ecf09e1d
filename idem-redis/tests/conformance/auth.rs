//! A password in the URL: against a private `redis-server` that requires one
//! (`--requirepass`), the consumer and the outbox publisher connect with
//! `redis://:password@host` (creating the group on the way); a wrong password fails with the
//! server's refusal, and neither the error nor the builders' `Debug` shows the secret.

use std::time::Duration;

use idem::redis::{OutboxPublisher, Source};
use idem_testkit::backends::unique_name;
use idem_testkit::servers::RedisServer;
use redis::AsyncCommands as _;

use crate::GROUP;

const SECRET: &str = "s3cret-Pa55w0rd";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    idem_no_redis,
    ignore = "set IDEM_REDIS_URL (e.g. redis://127.0.0.1:6379) to run"
)]
async fn a_password_in_the_url_is_used_and_never_shown() {
    let options = ["--requirepass", SECRET];
    let Some(server) = RedisServer::start_with("idem_redis_auth", "Redis auth test", &options)
    else {
        return;
    };
    let stream = unique_name("idem_auth");
    let at = |password: &str| {
        server
            .url()
            .replace("redis://", &format!("redis://:{password}@"))
    };
    let limit = Duration::from_secs(20);

    let source = Source::builder(at(SECRET), &stream, GROUP, "c1");
    assert!(!format!("{source:?}").contains(SECRET), "{source:?}");
    let connect = tokio::time::timeout(limit, source.connect()).await.unwrap();
    connect
        .expect("the URL's password is used")
        .close()
        .await
        .unwrap();
    let publisher = OutboxPublisher::builder(at(SECRET));
    assert!(!format!("{publisher:?}").contains(SECRET), "{publisher:?}");
    tokio::time::timeout(limit, publisher.connect())
        .await
        .unwrap()
        .expect("the URL's password is used");
    // The group was created with the password.
    let client = redis::Client::open(at(SECRET)).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let groups: redis::streams::StreamInfoGroupsReply = conn.xinfo_groups(&stream).await.unwrap();
    assert_eq!(groups.groups.len(), 1);

    let wrong = at(&format!("wrong-{SECRET}"));
    let source = Source::builder(wrong.clone(), &stream, GROUP, "c2").connect();
    let err = tokio::time::timeout(limit, source)
        .await
        .unwrap()
        .expect_err("refused");
    let publisher = OutboxPublisher::builder(wrong).connect();
    let err2 = tokio::time::timeout(limit, publisher)
        .await
        .unwrap()
        .expect_err("refused");
    for text in [
        err.to_string(),
        format!("{err:?}"),
        err2.to_string(),
        format!("{err2:?}"),
    ] {
        assert!(!text.contains(SECRET), "{text}");
        assert!(
            text.contains(":***@127.0.0.1"),
            "names the URL, redacted: {text}"
        );
        assert!(
            text.contains("WRONGPASS") || text.contains("auth"),
            "{text}"
        );
    }
}
