//! The code that the book (`docs/`) shows: each `ANCHOR` below is included in a page with
//! mdBook's `{{#include}}`, so what a reader sees compiles here, and the tests run it on SQLite
//! and check the database. The parts for a server (PostgreSQL, MySQL, a broker) are compiled
//! with their features and not run.
#![cfg(feature = "sqlite")]

mod common;

use std::time::Duration;

use idem::{idempotent, Context, Outcome, Tx};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool};

#[derive(Debug)]
struct AppError(String);

impl From<sqlx::Error> for AppError {
    fn from(err: sqlx::Error) -> Self {
        AppError(err.to_string())
    }
}

impl std::error::Error for AppError {}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

// ANCHOR: handler
#[derive(Deserialize)]
struct Paid {
    id: String,
    order_id: i64,
}

#[idempotent(key = "msg.id", scope = "billing::on_paid")]
async fn on_paid(tx: &mut Tx<'_, Sqlite>, msg: &Paid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE orders SET paid = 1 WHERE id = ?")
        .bind(msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
// ANCHOR_END: handler

// ANCHOR: modes
#[derive(Deserialize)]
struct StatusChanged {
    id: String,
    order_id: i64,
    version: i64,
    status: String,
}

/// Key + version: the key is the entity (one row per order), and only a newer version applies.
#[idempotent(
    key = "msg.order_id",
    version = "msg.version",
    scope = "orders::latest"
)]
async fn on_latest(tx: &mut Tx<'_, Sqlite>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    set_status(tx, msg).await
}

/// Key + version + entity: each message once, and never an older version of its order.
#[idempotent(
    key = "msg.id",
    version = "msg.version",
    entity = "msg.order_id",
    scope = "orders::status"
)]
async fn on_status(tx: &mut Tx<'_, Sqlite>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    set_status(tx, msg).await
}
// ANCHOR_END: modes

async fn set_status(tx: &mut Tx<'_, Sqlite>, msg: &StatusChanged) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE orders SET status = ? WHERE id = ?")
        .bind(&msg.status)
        .bind(msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

// ANCHOR: tuple_key
/// A key of two parts: a shipment is handled once per order and region.
#[idempotent(key = "(msg.order_id, msg.region.as_str())", scope = "orders::shipped")]
async fn on_shipped(tx: &mut Tx<'_, Sqlite>, msg: &Shipped) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE orders SET status = 'shipped' WHERE id = ?")
        .bind(msg.order_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
// ANCHOR_END: tuple_key

struct Shipped {
    order_id: i64,
    region: String,
}

// ANCHOR: options
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Receipt {
    invoice: String,
    cents: i64,
}

struct Invoice {
    id: String,
    body: Vec<u8>,
    cents: i64,
}

#[idempotent(
    key = "msg.id",
    scope = "billing::invoice",
    fingerprint = "msg.body.as_slice()", // the same key with another payload: Error::Conflict
    replay = true,                       // a duplicate returns Outcome::Replayed(receipt)
    max_attempts = 3,                    // after 3 failures: Outcome::Poisoned, nothing runs
    retention = "90d"                    // keep the record 90 days (default 30)
)]
async fn on_invoice(tx: &mut Tx<'_, Sqlite>, msg: &Invoice) -> Result<Receipt, AppError> {
    if msg.cents < 0 {
        return Err(AppError(format!("negative amount in {}", msg.id)));
    }
    sqlx::query("INSERT INTO invoices (id, cents) VALUES (?, ?)")
        .bind(&msg.id)
        .bind(msg.cents)
        .execute(&mut **tx)
        .await?;
    Ok(Receipt {
        invoice: msg.id.clone(),
        cents: msg.cents,
    })
}
// ANCHOR_END: options

// ANCHOR: lease
struct Charge {
    id: String,
    cents: i64,
}

/// A payment provider's client: anything outside the database.
struct Provider;

impl Provider {
    async fn charge(&self, idempotency_key: &str, cents: i64) -> Result<String, AppError> {
        Ok(format!("ch_{}_{cents}", &idempotency_key[..8]))
    }
}

static PROVIDER: Provider = Provider;

#[idempotent(
    key = "msg.id",
    scope = "payments::charge",
    mode = "lease",
    lease = "30s"
)]
async fn charge(tx: &mut Tx<'_, Sqlite>, msg: &Charge, ctx: &Context) -> Result<(), AppError> {
    // The same on every redelivery, process and machine: the provider charges once.
    let charge_id = PROVIDER.charge(&ctx.derive("charge"), msg.cents).await?;
    sqlx::query("INSERT INTO charges (payment, provider_id) VALUES (?, ?)")
        .bind(&msg.id)
        .bind(charge_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}
// ANCHOR_END: lease

// ANCHOR: outbox
#[derive(Deserialize)]
struct Order {
    id: String,
    customer: String,
    total: i64,
}

#[derive(Serialize)]
struct ChargeRequest {
    order: String,
    cents: i64,
}

#[derive(Serialize)]
struct ReceiptMail {
    order: String,
}

#[idempotent(key = "order.id", scope = "orders::on_placed")]
async fn on_placed(
    tx: &mut Tx<'_, Sqlite>,
    order: &Order,
    ctx: &Context,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO placed (id, total) VALUES (?, ?)")
        .bind(&order.id)
        .bind(order.total)
        .execute(&mut **tx)
        .await?;
    // Written to idem_outbox in this transaction: it exists if and only if the insert does.
    let charge = ChargeRequest {
        order: order.id.clone(),
        cents: order.total,
    };
    ctx.publish(tx, "payments", &charge).await?;
    ctx.outgoing("emails") // or shaped: partition key, label, headers
        .partition_key(order.customer.clone()) // a customer's emails stay in order
        .label("receipt")
        .header("kind", "receipt")
        .publish(
            tx,
            &ReceiptMail {
                order: order.id.clone(),
            },
        )
        .await?;
    Ok(())
}
// ANCHOR_END: outbox

/// A SQLite file of this test with idem's tables and the handlers' own.
async fn database(name: &str) -> SqlitePool {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let options = SqliteConnectOptions::new()
        .filename(common::temp_db(name))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    idem::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, paid INTEGER NOT NULL DEFAULT 0, status TEXT);
         INSERT INTO orders (id) VALUES (42), (43);
         CREATE TABLE invoices (id TEXT PRIMARY KEY, cents INTEGER NOT NULL);
         CREATE TABLE charges (payment TEXT NOT NULL, provider_id TEXT NOT NULL);
         CREATE TABLE placed (id TEXT PRIMARY KEY, total INTEGER NOT NULL);",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool
}

async fn status(pool: &SqlitePool, order: i64) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM orders WHERE id = ?")
        .bind(order)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn quickstart_applies_once_on_a_pool_and_in_a_transaction(
) -> Result<(), Box<dyn std::error::Error>> {
    let pool = database("book_quickstart").await;
    let msg = Paid {
        id: "evt-1".into(),
        order_id: 42,
    };
    // ANCHOR: call
    match on_paid(&pool, &msg).await? {
        // a pool: idem begins and commits
        Outcome::Applied(()) => println!("paid"),
        Outcome::Duplicate => println!("already handled: nothing ran"),
        other => println!("{other:?}"), // Stale, Replayed, ...: only with other options
    }

    let mut tx = pool.begin().await?; // or your own transaction: idem adds a savepoint,
    let again = on_paid(&mut tx, &msg).await?; // and you commit
    tx.commit().await?;
    assert!(matches!(again, Outcome::Duplicate));
    // ANCHOR_END: call
    let paid: i64 = sqlx::query_scalar("SELECT paid FROM orders WHERE id = 42")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(paid, 1);
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(records, 1);
    Ok(())
}

#[tokio::test]
async fn the_three_modes_decide_as_the_concepts_page_says() {
    let pool = database("book_modes").await;
    let event = |id: &str, version, status: &str| StatusChanged {
        id: id.into(),
        order_id: 42,
        version,
        status: status.into(),
    };
    // Key + version + entity: a new key with an older version is stale; a seen key a duplicate.
    assert!(matches!(
        on_status(&pool, &event("e2", 2, "paid")).await.unwrap(),
        Outcome::Applied(())
    ));
    assert!(matches!(
        on_status(&pool, &event("e1", 1, "placed")).await.unwrap(),
        Outcome::Stale { latest: 2 }
    ));
    assert!(matches!(
        on_status(&pool, &event("e2", 2, "paid")).await.unwrap(),
        Outcome::Duplicate
    ));
    assert_eq!(status(&pool, 42).await.as_deref(), Some("paid"));
    // Key + version: the same version again is a duplicate, an older one stale.
    assert!(matches!(
        on_latest(&pool, &event("x", 3, "packed")).await.unwrap(),
        Outcome::Applied(())
    ));
    assert!(matches!(
        on_latest(&pool, &event("y", 3, "packed")).await.unwrap(),
        Outcome::Duplicate
    ));
    assert!(matches!(
        on_latest(&pool, &event("z", 1, "placed")).await.unwrap(),
        Outcome::Stale { latest: 3 }
    ));
    assert_eq!(status(&pool, 42).await.as_deref(), Some("packed"));
    // A tuple key: (order, region).
    let shipped = Shipped {
        order_id: 43,
        region: "eu".into(),
    };
    assert!(matches!(
        on_shipped(&pool, &shipped).await.unwrap(),
        Outcome::Applied(())
    ));
    assert!(matches!(
        on_shipped(&pool, &shipped).await.unwrap(),
        Outcome::Duplicate
    ));
    assert_eq!(status(&pool, 43).await.as_deref(), Some("shipped"));
}

#[tokio::test]
async fn errors_and_retries() {
    let pool = database("book_errors").await;
    let msg = Paid {
        id: String::new(),
        order_id: 42,
    };
    // ANCHOR: errors
    match on_paid(&pool, &msg).await {
        Ok(outcome) => println!("{outcome:?}"),
        // The body's error: its writes rolled back, so the redelivery runs it again.
        Err(idem::Error::Handler(err)) => eprintln!("handler failed: {err}"),
        // The database failed (see idem::Transient for which errors may pass if tried again).
        Err(idem::Error::Store(err)) => eprintln!("store: {err}"),
        // An empty key, one over 512 bytes, a version beyond i64: refused, nothing written.
        Err(idem::Error::Key(err)) => eprintln!("bad key: {err}"),
        Err(other) => eprintln!("{other}"), // Conflict, Replay, LeaseLost: see their options
    }
    // ANCHOR_END: errors
    assert!(matches!(
        on_paid(&pool, &msg).await,
        Err(idem::Error::Key(_))
    ));
    let msg = Paid {
        id: "evt-7".into(),
        order_id: 42,
    };
    // ANCHOR: retry
    use idem::RetryPolicy;

    // Tries again on a transient error (serialization failure, deadlock, a dropped connection,
    // a busy SQLite), with exponential backoff and jitter. Safe, since the handler is
    // idempotent: an attempt whose commit went through is a Duplicate the next time.
    let outcome = idem::retry(RetryPolicy::default(), || on_paid(&pool, &msg)).await;
    // ANCHOR_END: retry
    assert!(matches!(outcome, Ok(Outcome::Applied(()))));
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(records, 1);
}

#[tokio::test]
async fn a_batch_handles_each_message_once_in_one_transaction(
) -> Result<(), Box<dyn std::error::Error>> {
    let pool = database("book_batch").await;
    let messages: Vec<Paid> = ["a", "b", "a"]
        .into_iter()
        .map(|id| Paid {
            id: id.into(),
            order_id: 42,
        })
        .collect();
    // ANCHOR: batch
    // One transaction for the slice; one result per message, in order.
    let results = idem::batch(&pool, &messages, async |b, msg| on_paid(b, msg).await).await?;
    for (msg, result) in messages.iter().zip(&results) {
        match result {
            Ok(Outcome::Applied(())) => println!("{} applied", msg.id),
            Ok(Outcome::Duplicate) => println!("{} duplicate", msg.id),
            Ok(other) => println!("{}: {other:?}", msg.id),
            Err(err) => println!("{} failed: {err}", msg.id), // redeliver this one
        }
    }
    // ANCHOR_END: batch
    let outcomes: Vec<_> = results
        .into_iter()
        .map(|r| matches!(r, Ok(Outcome::Applied(()))))
        .collect();
    assert_eq!(outcomes, [true, true, false]);
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(records, 2);
    Ok(())
}

#[tokio::test]
async fn fingerprint_replay_and_max_attempts() {
    let pool = database("book_options").await;
    let invoice = |id: &str, body: &[u8], cents| Invoice {
        id: id.into(),
        body: body.to_vec(),
        cents,
    };
    let first = on_invoice(&pool, &invoice("inv-1", b"A", 100))
        .await
        .unwrap();
    assert!(matches!(first, Outcome::Applied(ref r) if r.cents == 100));
    // The same key and payload: the first result, replayed.
    let again = on_invoice(&pool, &invoice("inv-1", b"A", 100))
        .await
        .unwrap();
    assert_eq!(
        again,
        Outcome::Replayed(Receipt {
            invoice: "inv-1".into(),
            cents: 100
        })
    );
    // The same key, another payload: refused.
    assert!(matches!(
        on_invoice(&pool, &invoice("inv-1", b"B", 100)).await,
        Err(idem::Error::Conflict { .. })
    ));
    // A message that keeps failing is poisoned once three failures are counted.
    let bad = invoice("inv-2", b"C", -1);
    for _ in 0..3 {
        assert!(matches!(
            on_invoice(&pool, &bad).await,
            Err(idem::Error::Handler(_))
        ));
    }
    assert!(matches!(
        on_invoice(&pool, &bad).await.unwrap(),
        Outcome::Poisoned { attempts: 3 }
    ));
    let invoices: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM invoices")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(invoices, 1);
}

#[tokio::test]
async fn a_lease_mode_handler_charges_once() {
    let pool = database("book_lease").await;
    let msg = Charge {
        id: "pay-1".into(),
        cents: 500,
    };
    assert!(matches!(
        charge(&pool, &msg).await.unwrap(),
        Outcome::Applied(())
    ));
    assert!(matches!(
        charge(&pool, &msg).await.unwrap(),
        Outcome::Duplicate
    ));
    let charges: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM charges")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(charges, 1);
}

#[tokio::test]
async fn the_outbox_rows_commit_with_the_handler() {
    let pool = database("book_outbox").await;
    let order = Order {
        id: "o-1".into(),
        customer: "ada".into(),
        total: 1250,
    };
    on_placed(&pool, &order).await.unwrap();
    on_placed(&pool, &order).await.unwrap();
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT destination, partition_key FROM idem_outbox ORDER BY destination")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        [
            ("emails".to_string(), "ada".to_string()),
            ("payments".to_string(), String::new())
        ]
    );
}

#[tokio::test]
async fn retention_purges_expired_records() -> Result<(), Box<dyn std::error::Error>> {
    let pool = database("book_retention").await;
    on_paid(
        &pool,
        &Paid {
            id: "evt-1".into(),
            order_id: 42,
        },
    )
    .await
    .unwrap();
    sqlx::query("UPDATE idem_records SET expires_at = 0")
        .execute(&pool)
        .await
        .unwrap();
    // ANCHOR: purge
    // Deletes the records past their retention, 10,000 per statement.
    let purged = idem::retention::purge_expired(&pool, 10_000).await?;

    // Or in the background, every minute, until stopped.
    let purger = idem::retention::Purger::spawn(pool.clone(), Duration::from_secs(60), 10_000);
    // ... the consumer runs ...
    purger.stop().await;
    // ANCHOR_END: purge
    assert_eq!(purged, 1);
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(records, 0);
    Ok(())
}

/// The pools of the database pages: compiled, not run (they need a server).
#[allow(dead_code)]
mod pools {
    use std::time::Duration;

    // ANCHOR: sqlite_pool
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    async fn sqlite_pool() -> Result<sqlx::SqlitePool, sqlx::Error> {
        let options = SqliteConnectOptions::new()
            .filename("app.db")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal) // readers never block the writer
            .busy_timeout(Duration::from_secs(30)); // writers wait for each other
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        idem::migrate(&pool).await?; // idem's tables; safe to repeat
        Ok(pool)
    }
    // ANCHOR_END: sqlite_pool

    #[cfg(feature = "postgres")]
    // ANCHOR: postgres_pool
    async fn postgres_pool() -> Result<sqlx::PgPool, sqlx::Error> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(16)
            .connect("postgres://app@db.internal/app")
            .await?;
        idem::migrate(&pool).await?;
        Ok(pool)
    }
    // ANCHOR_END: postgres_pool

    #[cfg(feature = "mysql")]
    // ANCHOR: mysql_pool
    async fn mysql_pool() -> Result<sqlx::MySqlPool, sqlx::Error> {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(16)
            .connect("mysql://app@db.internal/app") // or mariadb://
            .await?;
        idem::migrate(&pool).await?;
        Ok(pool)
    }
    // ANCHOR_END: mysql_pool

    #[cfg(feature = "rabbitmq")]
    // ANCHOR: relay
    async fn relay(pool: sqlx::SqlitePool, url: &str) -> Result<(), idem::rabbitmq::Error> {
        // Publisher confirms, the message id as AMQP `message_id`, the destination as routing key.
        let publisher = idem::rabbitmq::OutboxPublisher::builder(url)
            .connect()
            .await?;
        let relay = idem::outbox::Relay::new(pool, publisher);
        let stats = relay
            .run(async {
                tokio::signal::ctrl_c().await.ok();
            })
            .await;
        println!("{stats:?}");
        Ok(())
    }
    // ANCHOR_END: relay

    #[cfg(feature = "metrics")]
    // ANCHOR: metrics
    fn observe() {
        // After installing a recorder of the `metrics` facade (a Prometheus exporter, ...):
        idem::metrics::describe(); // descriptions and units of idem's metrics
    }
    // ANCHOR_END: metrics

    #[cfg(all(feature = "metrics", feature = "rabbitmq"))]
    // ANCHOR: gauges
    async fn consume_with_gauges(
        pool: sqlx::SqlitePool,
        source: idem::rabbitmq::Source,
    ) -> Result<(), idem::rabbitmq::Error> {
        let stop = || async {
            tokio::signal::ctrl_c().await.ok();
        };
        // Every 15 s: the outbox's backlog, parked retries, dead letters, and the queue's lag.
        let gauges = idem::gauges::Gauges::new(pool.clone()).lag_of(&source);
        let consumer = idem::consume::Consumer::new(pool).batch(100);
        let (counts, ()) = tokio::join!(
            consumer.run(
                source.deliveries(),
                idem::consume::json::<super::Paid>,
                async |b, msg| super::on_paid(b, msg).await,
                stop(),
            ),
            gauges.run(stop()),
        );
        println!("{counts:?}");
        source.close().await // after both: the gauges borrow the source
    }
    // ANCHOR_END: gauges
}

#[cfg(feature = "http")]
mod http {
    use axum::http::{request::Parts, StatusCode};
    use axum::{response::IntoResponse, routing::post, Json, Router};
    use idem::http::{IdempotencyLayer, RequestTx};
    use serde::{Deserialize, Serialize};
    use sqlx::{Sqlite, SqlitePool};

    #[derive(Deserialize)]
    struct NewPayment {
        amount: i64,
    }

    #[derive(Serialize)]
    struct Payment {
        id: i64,
        amount: i64,
    }

    /// The authenticated user, put in the request's extensions by the auth middleware.
    #[derive(Clone)]
    struct User {
        id: u64,
    }

    // ANCHOR: http
    async fn create(
        mut tx: RequestTx<Sqlite>,
        Json(new): Json<NewPayment>,
    ) -> Result<impl IntoResponse, StatusCode> {
        let id: i64 = sqlx::query_scalar("INSERT INTO payments (amount) VALUES (?) RETURNING id")
            .bind(new.amount)
            .fetch_one(&mut *tx)
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        let location = [("location", format!("/payments/{id}"))];
        let payment = Payment {
            id,
            amount: new.amount,
        };
        Ok((StatusCode::CREATED, location, Json(payment)))
    }

    fn app(pool: SqlitePool) -> Router {
        // Keys belong to a client: `principal` names who sent the request (here from the auth
        // middleware's extension); one client's key never returns another's response.
        let principal = |parts: &Parts| parts.extensions.get::<User>().map(|u| u.id.to_string());
        let idempotent = IdempotencyLayer::new(pool, "payments::create", principal);
        Router::new().route("/payments", post(create).layer(idempotent))
    }
    // ANCHOR_END: http

    #[tokio::test]
    async fn a_retried_post_creates_one_payment() {
        let pool = super::database("book_http").await;
        sqlx::query("CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let app = app(pool.clone()).layer(axum::Extension(User { id: 7 }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::new();
        let post = || {
            client
                .post(format!("http://{addr}/payments"))
                .header("idempotency-key", "\"k-1\"")
                .json(&serde_json::json!({ "amount": 1250 }))
                .send()
        };
        let first = post().await.unwrap();
        assert_eq!(first.status(), 201);
        let first_body = first.text().await.unwrap();
        let second = post().await.unwrap();
        assert_eq!(second.status(), 201);
        assert_eq!(second.headers()["idempotent-replayed"], "true");
        assert_eq!(second.text().await.unwrap(), first_body);
        let payments: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM payments")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(payments, 1);
        server.abort();
    }
}

#[tokio::test]
async fn a_consumer_with_recovery_parks_a_failure_and_keeps_a_dead_letter() {
    use idem::consume::{memory::MemoryQueue, Consumer, DeadLetters, Recovery};

    let pool = database("book_recovery").await;
    let queue = MemoryQueue::new();
    queue.publish(br#"{"id":"evt-7","order_id":42}"#.to_vec());
    queue.publish(b"not json".to_vec());
    let shutdown = queue.idle();
    let deliveries = queue.deliveries();
    // ANCHOR: recovery
    let counts = Consumer::new(pool.clone())
        .batch(100)
        .recovery(
            Recovery::new("billing") // consumers with one name share their parked retries
                // A failure waits in `idem_parked` (the broker's delivery is acked once it
                // is there): 1 s, 2 s, 4 s, ... at most 5 minutes, 10 runs in all.
                .durable_retries(10, Duration::from_secs(1), Duration::from_secs(300))
                // What gives up goes to `idem_dead_letters` only (default: there and to
                // the broker's dead-letter place).
                .dead_letters(DeadLetters::Database),
        )
        .run(
            deliveries,
            idem::consume::json::<Paid>,
            async |b, msg| on_paid(b, msg).await,
            shutdown,
        )
        .await;
    // ANCHOR_END: recovery
    assert_eq!((counts.applied, counts.dead_letters_stored), (1, 1));
    let dead: (String, Vec<u8>) = sqlx::query_as("SELECT reason, payload FROM idem_dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dead, ("undecodable".to_string(), b"not json".to_vec()));
    assert!(queue.dead_letters().is_empty(), "the database only");
}

mod health {
    use std::time::Duration;

    use axum::extract::State;
    use axum::http::StatusCode;
    use axum::{routing::get, Router};
    use idem::consume::{memory::MemoryQueue, Consumer, Health};

    use super::{database, on_paid, Paid};

    // ANCHOR: health
    /// `/readyz` and `/livez` for Kubernetes' probes: 200, or 503 with the reason as text.
    fn probes(health: Health) -> Router {
        Router::new()
            .route("/readyz", get(readyz))
            .route("/livez", get(livez))
            .with_state(health)
    }

    async fn readyz(State(health): State<Health>) -> (StatusCode, String) {
        match health.ready() {
            Ok(()) => (StatusCode::OK, "ready\n".into()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        }
    }

    async fn livez(State(health): State<Health>) -> (StatusCode, String) {
        match health.live() {
            Ok(()) => (StatusCode::OK, "live\n".into()),
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        }
    }
    // ANCHOR_END: health

    #[tokio::test]
    async fn the_probes_say_ready_while_the_consumer_runs_and_why_not_before_and_after() {
        let pool = database("book_health").await;
        let queue = MemoryQueue::new();
        queue.publish(br#"{"id":"evt-8","order_id":43}"#.to_vec());
        // ANCHOR: health_consumer
        let consumer = Consumer::new(pool.clone())
            .health_of(&queue) // every adapter's `Source` has a probe of its broker
            .health_every(Duration::from_secs(5)) // the checks' interval (the default)
            .stuck_after(Duration::from_secs(60)); // a batch past this is not live
        let health = consumer.health(); // before `run`, which takes the consumer
        let _router = probes(health.clone()); // serve it with axum::serve
                                              // ANCHOR_END: health_consumer
        let (status, text) = readyz(State(health.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text, "not started: the consumer is not running yet\n");
        let (status, _) = livez(State(health.clone())).await;
        assert_eq!(status, StatusCode::OK);

        let (done, finished) = tokio::sync::oneshot::channel();
        let while_running = {
            let (health, queue) = (health.clone(), queue.clone());
            async move {
                while health.ready().is_err() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let answered = readyz(State(health)).await;
                queue.idle().await;
                let _ = done.send(());
                answered
            }
        };
        let (answered, counts) = tokio::join!(
            while_running,
            consumer.run(
                queue.deliveries(),
                idem::consume::json::<Paid>,
                async |b, msg| on_paid(b, msg).await,
                async {
                    let _ = finished.await;
                },
            )
        );
        assert_eq!(answered, (StatusCode::OK, "ready\n".to_string()));
        assert_eq!(counts.applied, 1);
        let (status, text) = readyz(State(health.clone())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(text, "stopped: the consumer's run has ended\n");
        let (status, _) = livez(State(health)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
