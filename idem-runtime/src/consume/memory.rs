//! [`MemoryQueue`]: a broker in memory, for testing handlers and consumers without one. It
//! redelivers what is requeued (counting deliveries, as RabbitMQ and JetStream do), keeps what
//! is dead-lettered, and tells when every message has been settled for good.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{self, Stream};
use tokio::sync::Notify;

use super::delivery::{Delivery, SettleError};
use super::lag::Lag;
use super::settle::{DeadLetterReason, Settle};
use super::source::Source;
use crate::recover::Origin;

/// The broker's name in the [`Origin`] of a [`MemoryDelivery`]: `memory`.
pub const BROKER: &str = "memory";

/// A queue in memory. Clones share it.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use futures_util::StreamExt as _;
/// use idem::consume::{memory::MemoryQueue, Delivery, Settle};
///
/// let queue = MemoryQueue::new();
/// queue.publish(b"hello".to_vec());
/// let mut deliveries = queue.deliveries();
/// let first = deliveries.next().await.unwrap().unwrap();
/// first.settle(Settle::Requeue { delay: std::time::Duration::ZERO }).await.unwrap();
/// let again = deliveries.next().await.unwrap().unwrap();
/// assert_eq!((again.payload(), again.deliveries()), (&b"hello"[..], Some(2)));
/// again.settle(Settle::Ack).await.unwrap();
/// queue.idle().await; // every message settled for good
/// assert_eq!(queue.acked(), 1);
/// # });
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryQueue {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The queue's name ([`MemoryQueue::named`]); empty: `memory`.
    name: String,
    state: Mutex<State>,
    /// Woken when a message becomes ready or the last one is settled for good.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<Message>,
    /// Published and not yet acked or dead-lettered (ready, delivered, or waiting to come back).
    open: usize,
    next_id: u64,
    acked: u64,
    dead: Vec<(Vec<u8>, DeadLetterReason)>,
    closed: bool,
}

#[derive(Debug, Clone)]
struct Message {
    id: u64,
    payload: Vec<u8>,
    headers: Vec<(String, String)>,
    deliveries: u32,
}

/// The deliveries of a [`MemoryQueue`], from [`MemoryQueue::deliveries`].
pub struct MemoryDeliveries {
    inner: Pin<Box<dyn Stream<Item = Result<MemoryDelivery, Infallible>> + Send>>,
}

impl fmt::Debug for MemoryDeliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDeliveries").finish_non_exhaustive()
    }
}

impl Stream for MemoryDeliveries {
    type Item = Result<MemoryDelivery, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// A message of a [`MemoryQueue`], delivered and not yet settled.
#[derive(Debug)]
pub struct MemoryDelivery {
    queue: MemoryQueue,
    message: Message,
}

impl MemoryQueue {
    /// An empty queue, named `memory` in its deliveries' [`Origin`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue named `name`: the source and destination of its deliveries' [`Origin`].
    pub fn named(name: impl Into<String>) -> Self {
        MemoryQueue {
            inner: Arc::new(Inner {
                name: name.into(),
                ..Inner::default()
            }),
        }
    }

    /// The queue's name: `memory` unless [`named`](MemoryQueue::named).
    pub fn name(&self) -> &str {
        match self.inner.name.as_str() {
            "" => BROKER,
            name => name,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves nothing half-written: recover the guard.
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a message at the back of the queue.
    pub fn publish(&self, payload: Vec<u8>) {
        self.publish_with_headers(payload, Vec::new());
    }

    /// Adds a message with headers at the back of the queue.
    pub fn publish_with_headers(&self, payload: Vec<u8>, headers: Vec<(String, String)>) {
        let mut state = self.state();
        let id = state.next_id;
        state.next_id += 1;
        state.open += 1;
        state.ready.push_back(Message {
            id,
            payload,
            headers,
            deliveries: 0,
        });
        drop(state);
        self.inner.changed.notify_waiters();
    }

    /// The deliveries, as a consumer takes them: ends once [`close`](MemoryQueue::close) was
    /// called and nothing is ready. Streams of one queue share it: each message goes to one.
    pub fn deliveries(&self) -> MemoryDeliveries {
        let inner = stream::unfold(self.clone(), |queue| async move {
            let message = queue.next_ready().await?;
            let delivery = MemoryDelivery {
                queue: queue.clone(),
                message,
            };
            Some((Ok(delivery), queue))
        });
        MemoryDeliveries {
            inner: Box::pin(inner),
        }
    }

    /// The next ready message, counted as delivered once more; `None` once closed and empty.
    async fn next_ready(&self) -> Option<Message> {
        loop {
            let changed = self.inner.changed.notified();
            {
                let mut state = self.state();
                if let Some(mut message) = state.ready.pop_front() {
                    message.deliveries += 1;
                    return Some(message);
                }
                if state.closed {
                    return None;
                }
            }
            changed.await;
        }
    }

    /// Ends the streams of deliveries once nothing is ready.
    pub fn close(&self) {
        self.state().closed = true;
        self.inner.changed.notify_waiters();
    }

    /// Completes when every published message has been acked or dead-lettered: a consumer's
    /// shutdown signal for "the queue is done".
    pub async fn idle(&self) {
        loop {
            let changed = self.inner.changed.notified();
            if self.state().open == 0 {
                return;
            }
            changed.await;
        }
    }

    /// How far behind its consumers the queue is: the messages ready and not yet taken
    /// (`undelivered`), and those taken or waiting to come back and not yet acked or
    /// dead-lettered (`unacked`).
    ///
    /// ```
    /// let queue = idem::consume::memory::MemoryQueue::named("orders");
    /// queue.publish(b"1".to_vec());
    /// let lag = queue.lag();
    /// assert_eq!((lag[0].undelivered, lag[0].unacked), (Some(1), Some(0)));
    /// ```
    pub fn lag(&self) -> Vec<Lag> {
        let state = self.state();
        let ready = state.ready.len();
        vec![Lag {
            broker: BROKER,
            source: self.name().to_string(),
            group: String::new(),
            partition: None,
            undelivered: Some(ready as u64),
            unacked: Some(state.open.saturating_sub(ready) as u64),
        }]
    }

    /// How many messages were acked.
    pub fn acked(&self) -> u64 {
        self.state().acked
    }

    /// The dead-lettered messages, with why.
    pub fn dead_letters(&self) -> Vec<(Vec<u8>, DeadLetterReason)> {
        self.state().dead.clone()
    }

    /// Messages published and not yet acked or dead-lettered.
    pub fn open(&self) -> usize {
        self.state().open
    }

    fn settled_for_good(&self) {
        let mut state = self.state();
        state.open -= 1;
        drop(state);
        self.inner.changed.notify_waiters();
    }

    fn ready_again(&self, message: Message) {
        self.state().ready.push_back(message);
        self.inner.changed.notify_waiters();
    }
}

impl Delivery for MemoryDelivery {
    fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    fn deliveries(&self) -> Option<u32> {
        Some(self.message.deliveries)
    }

    fn describe(&self) -> String {
        format!("memory #{}", self.message.id)
    }

    /// The headers it was published with ([`MemoryQueue::publish_with_headers`]).
    fn headers(&self) -> Vec<(String, String)> {
        self.message.headers.clone()
    }

    /// Broker [`BROKER`]; source and destination the queue's [`name`](MemoryQueue::name);
    /// coordinates `message N`, its number in publishing order from 0.
    fn origin(&self) -> Origin {
        Origin {
            broker: BROKER.to_string(),
            source: self.queue.name().to_string(),
            coordinates: format!("message {}", self.message.id),
            destination: self.queue.name().to_string(),
        }
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let MemoryDelivery { queue, message } = self;
        match settle {
            Settle::Ack => {
                queue.state().acked += 1;
                queue.settled_for_good();
            }
            Settle::DeadLetter { reason } => {
                queue.state().dead.push((message.payload, reason));
                queue.settled_for_good();
            }
            Settle::Requeue { delay } if delay.is_zero() => queue.ready_again(message),
            Settle::Requeue { delay } => {
                // Comes back after the delay, as a broker's delayed redelivery would.
                tokio::spawn(async move {
                    tokio::time::sleep(delay.min(Duration::from_secs(3600))).await;
                    queue.ready_again(message);
                });
            }
        }
        Ok(())
    }
}

/// The queue as a [`Source`]: `close` ends its streams once nothing is ready (as
/// [`MemoryQueue::close`]); nothing can fail.
impl Source for MemoryQueue {
    type Delivery = MemoryDelivery;
    type Error = Infallible;
    type Deliveries = MemoryDeliveries;

    fn deliveries(&self) -> MemoryDeliveries {
        MemoryQueue::deliveries(self)
    }

    async fn lag(&self) -> Result<Vec<Lag>, Infallible> {
        Ok(MemoryQueue::lag(self))
    }

    async fn close(self) -> Result<(), Infallible> {
        MemoryQueue::close(&self);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn a_delivery_tells_its_headers_and_its_origin_and_keeps_them_when_requeued() {
        let queue = MemoryQueue::named("orders");
        queue.publish(b"first".to_vec());
        let headers = vec![
            ("trace".to_string(), "t-1".to_string()),
            ("kind".to_string(), "order".to_string()),
        ];
        queue.publish_with_headers(b"second".to_vec(), headers.clone());
        let mut deliveries = queue.deliveries();
        let first = deliveries.next().await.unwrap().unwrap();
        assert_eq!(first.headers(), Vec::new(), "published without headers");
        assert_eq!(first.origin().coordinates, "message 0");
        first.settle(Settle::Ack).await.unwrap();
        let second = deliveries.next().await.unwrap().unwrap();
        let origin = Origin {
            broker: "memory".into(),
            source: "orders".into(),
            coordinates: "message 1".into(),
            destination: "orders".into(),
        };
        assert_eq!(
            (second.headers(), second.origin()),
            (headers.clone(), origin.clone())
        );
        second
            .settle(Settle::Requeue {
                delay: Duration::ZERO,
            })
            .await
            .unwrap();
        let again = deliveries.next().await.unwrap().unwrap();
        assert_eq!(again.deliveries(), Some(2));
        assert_eq!((again.headers(), again.origin()), (headers, origin));
        again.settle(Settle::Ack).await.unwrap();
        assert_eq!((queue.acked(), queue.open()), (2, 0));
        // Unnamed, the queue is `memory`.
        let unnamed = MemoryQueue::new();
        assert_eq!(unnamed.name(), "memory");
        unnamed.publish(b"x".to_vec());
        let delivery = unnamed.deliveries().next().await.unwrap().unwrap();
        assert_eq!(
            (delivery.origin().source, delivery.origin().destination),
            ("memory".to_string(), "memory".to_string())
        );
        delivery.settle(Settle::Ack).await.unwrap();
    }
}
