//! [`Source`]: what the entry type of every broker adapter is, so that one piece of code can
//! consume from any of them.

use std::future::Future;

use futures_util::stream::Stream;

use super::delivery::Delivery;
use super::lag::Lag;
use super::probe::Probe;

/// A connected broker input: the entry type of every adapter (`idem::rabbitmq::Source`,
/// `idem::nats::Source`, `idem::kafka::Source`, `idem::redis::Source`) and
/// [`MemoryQueue`](super::memory::MemoryQueue). Each adapter has the same methods as inherent
/// ones, so using one adapter needs no import of this trait; it is for code written once for
/// any adapter (a test, a service generic over its broker).
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem::consume::{memory::MemoryQueue, Consumer, Counts, Source};
/// use idem::{idempotent, Tx};
/// use idem::sqlx::{Sqlite, SqlitePool};
/// use std::future::Future;
///
/// #[idempotent(key = "id", scope = "demo::seen")]
/// async fn seen(tx: &mut Tx<'_, Sqlite>, id: &u64) -> Result<(), sqlx::Error> {
///     sqlx::query("INSERT INTO seen (id) VALUES (?)").bind(*id as i64).execute(&mut **tx).await?;
///     Ok(())
/// }
///
/// /// The same consumer for any broker.
/// async fn consume<S: Source>(source: S, pool: SqlitePool, until: impl Future<Output = ()>)
///     -> Result<Counts, S::Error> {
///     let counts = Consumer::new(pool)
///         .batch(10)
///         .run(source.deliveries(), idem::consume::json::<u64>,
///              async |b, id| seen(b, id).await, until)
///         .await;
///     source.close().await?; // stop taking, wait for what is out, leave
///     Ok(counts)
/// }
///
/// let pool = SqlitePool::connect("sqlite::memory:").await?;
/// idem::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE seen (id INTEGER NOT NULL)").execute(&pool).await?;
/// let queue = MemoryQueue::new();
/// for id in [1_u64, 2, 1] {
///     queue.publish(id.to_string().into_bytes());
/// }
/// let counts = consume(queue.clone(), pool, queue.idle()).await.unwrap();
/// assert_eq!((counts.applied, counts.duplicate), (2, 1));
/// # Ok::<(), sqlx::Error>(()) }).unwrap();
/// ```
pub trait Source: Send + Sync + 'static {
    /// One message taken and not yet settled.
    type Delivery: Delivery;
    /// What can fail: connecting, a broker request, leaving.
    type Error: std::error::Error + Send + Sync + 'static;
    /// The stream [`deliveries`](Source::deliveries) returns, for
    /// [`Consumer::run`](super::Consumer::run).
    type Deliveries: Stream<Item = Result<Self::Delivery, Self::Error>> + Send + Unpin + 'static;

    /// The deliveries. May be called more than once: the streams share the input (each
    /// delivery goes to one of them), and every one of them ends at
    /// [`close`](Source::close).
    fn deliveries(&self) -> Self::Deliveries;

    /// How far behind the input is, as the broker tells it: one [`Lag`] per partition
    /// (Kafka) or one for the whole input. A broker request each call; for gauges
    /// (`idem::gauges::Gauges::lag_of`, feature `metrics`), not for every delivery. The
    /// default tells nothing (an empty list); every broker adapter asks its broker.
    fn lag(&self) -> impl Future<Output = Result<Vec<Lag>, Self::Error>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Stops taking (every stream of this source ends), waits (bounded) for the deliveries
    /// still out to be settled or dropped, then leaves the broker cleanly.
    fn close(self) -> impl Future<Output = Result<(), Self::Error>> + Send
    where
        Self: Sized;

    /// A check of this source's connection to its broker, for the consumer's readiness
    /// ([`Consumer::health_of`](super::Consumer::health_of)). The default says connected, as
    /// [`MemoryQueue`](super::memory::MemoryQueue) is; every broker adapter checks its broker.
    fn probe(&self) -> Probe {
        Probe::connected()
    }
}
