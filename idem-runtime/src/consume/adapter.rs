//! For adapter authors: what every broker's [`Source`](super::Source) needs the same way. A
//! [`Lifecycle`] is the stop signal and the count of what is out that `close` waits on;
//! [`redact`] takes the password out of a URL before it goes into an error.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::time::Duration;
//! use futures_util::{stream, StreamExt as _};
//! use idem::consume::adapter::Lifecycle;
//!
//! let lifecycle = Lifecycle::new();
//! // A stream of the source ends once the source stops taking; it and each delivery it
//! // yields are out until dropped.
//! let stream = lifecycle.track();
//! let mut deliveries = stream::pending::<u32>().take_until(lifecycle.stopped()).boxed();
//! let delivery = lifecycle.track();
//!
//! lifecycle.stop(); // `close`, first step
//! assert_eq!(deliveries.next().await, None);
//! drop((deliveries, stream));
//! assert!(!lifecycle.drained(Duration::from_millis(10)).await, "a delivery is still out");
//! drop(delivery); // settled
//! assert!(lifecycle.drained(Duration::from_millis(10)).await);
//! # });
//! ```

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

/// How long an adapter's `close` waits for the deliveries still out (and the streams still
/// alive) to be settled or dropped before it leaves the broker anyway: 30 s, above the
/// consumer's default drain (10 s) and settle time-out (5 s), so that a `close` called while
/// [`Consumer::run`](super::Consumer::run) drains waits for that drain.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

/// A source's stop signal and the count of what it has out: its streams, the deliveries they
/// yielded and not yet settled or dropped, and the tasks that hold one (a delayed requeue).
/// Clones share it.
///
/// An adapter's `close` calls [`stop`](Lifecycle::stop) (every stream ends, every delay is
/// cut short), then [`drained`](Lifecycle::drained) with [`CLOSE_TIMEOUT`], then leaves the
/// broker.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    stopped: watch::Sender<bool>,
    out: AtomicUsize,
    /// Woken when the last thing out comes back.
    back: Notify,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    /// Not stopped, nothing out.
    pub fn new() -> Self {
        Lifecycle {
            inner: Arc::new(Inner {
                stopped: watch::channel(false).0,
                out: AtomicUsize::new(0),
                back: Notify::new(),
            }),
        }
    }

    /// Stops taking: every [`stopped`](Lifecycle::stopped) future completes. Idempotent.
    pub fn stop(&self) {
        self.inner.stopped.send_replace(true);
    }

    /// Whether [`stop`](Lifecycle::stop) was called.
    pub fn is_stopped(&self) -> bool {
        *self.inner.stopped.borrow()
    }

    /// Completes once [`stop`](Lifecycle::stop) is called (at once if it was): end a stream
    /// with `take_until(lifecycle.stopped())`, cut a delay short with `tokio::select!`.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopped = self.inner.stopped.subscribe();
        async move {
            // An error means every handle is gone: nothing can stop it any more, or be out.
            let _ = stopped.wait_for(|stopped| *stopped).await;
        }
    }

    /// Counts one thing out until the returned guard is dropped: keep it in a delivery, a
    /// stream, or a task that holds a delivery.
    pub fn track(&self) -> InFlight {
        self.inner.out.fetch_add(1, Ordering::AcqRel);
        InFlight {
            inner: self.inner.clone(),
        }
    }

    /// How many [`InFlight`] guards are alive.
    pub fn in_flight(&self) -> usize {
        self.inner.out.load(Ordering::Acquire)
    }

    /// Waits until no [`InFlight`] guard is alive, at most `timeout`: `true` if none is.
    pub async fn drained(&self, timeout: Duration) -> bool {
        let all_back = async {
            loop {
                let mut back = pin!(self.inner.back.notified());
                back.as_mut().enable();
                if self.in_flight() == 0 {
                    return;
                }
                back.await;
            }
        };
        tokio::time::timeout(timeout, all_back).await.is_ok()
    }
}

/// One thing a [`Lifecycle`] counts as out, until dropped.
#[derive(Debug)]
pub struct InFlight {
    inner: Arc<Inner>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.inner.out.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.back.notify_waiters();
        }
    }
}

/// `url` without its secrets, for errors and logs: `amqp://guest:***@host:5672/%2f`. The
/// password of the user information goes, and so does a bare user part on NATS URLs (`nats://`,
/// `tls://`, `ws://`, `wss://`, or none), where it is a token; so does the value of a `password` or
/// `token` query parameter. A list of URLs separated by commas (several servers) is redacted
/// one by one. A user name without a password is kept elsewhere.
///
/// ```
/// use idem::consume::adapter::redact;
/// assert_eq!(redact("redis://:secret@127.0.0.1:6379"), "redis://:***@127.0.0.1:6379");
/// assert_eq!(redact("nats://a:x@h1:4222,nats://b:y@h2"), "nats://a:***@h1:4222,nats://b:***@h2");
/// assert_eq!(redact("nats://s3cr3t@h1:4222"), "nats://***@h1:4222");
/// assert_eq!(redact("postgres://h/db?password=x&sslmode=require"), "postgres://h/db?password=***&sslmode=require");
/// ```
pub fn redact(url: &str) -> String {
    url.split(',').map(redact_one).collect::<Vec<_>>().join(",")
}

fn redact_one(url: &str) -> String {
    let (scheme, start) = match url.find("://") {
        Some(end) => (&url[..end], end + 3),
        None => ("", 0),
    };
    // The authority ends at the path, the query or the fragment; its user information ends at
    // its last `@`.
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |end| start + end);
    let authority = &url[start..end];
    let mut shown = url[..start].to_string();
    let at = authority.rfind('@');
    if let Some(at) = at {
        match authority[..at].find(':') {
            Some(colon) => shown.push_str(&format!("{}:***", &authority[..colon])),
            None if is_nats(scheme) => shown.push_str("***"),
            None => shown.push_str(&authority[..at]),
        }
    }
    shown.push_str(&authority[at.unwrap_or(0)..]);
    shown.push_str(&redact_query(&url[end..]));
    shown
}

/// The URL schemes of NATS, whose bare user part is a token (a server's address without a
/// scheme is NATS' too: no other broker's URL goes without one).
fn is_nats(scheme: &str) -> bool {
    ["", "nats", "tls", "ws", "wss"]
        .iter()
        .any(|nats| scheme.eq_ignore_ascii_case(nats))
}

/// The path, query and fragment, with the values of `password` and `token` parameters masked.
fn redact_query(rest: &str) -> String {
    let Some(question) = rest.find('?') else {
        return rest.to_string();
    };
    let (path, query) = rest.split_at(question + 1);
    let (query, fragment) = query.split_at(query.find('#').unwrap_or(query.len()));
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((name, _))
                if name.eq_ignore_ascii_case("password") || name.eq_ignore_ascii_case("token") =>
            {
                format!("{name}=***")
            }
            _ => param.to_string(),
        })
        .collect();
    format!("{path}{}{fragment}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(
            redact("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact("amqp://127.0.0.1"), "amqp://127.0.0.1");
        assert_eq!(redact("amqps://user@host/vh"), "amqps://user@host/vh");
        assert_eq!(
            redact("rediss://default:p%40ss@host:6380/0"),
            "rediss://default:***@host:6380/0"
        );
        assert_eq!(
            redact("nats://a:x@h1,nats://h2"),
            "nats://a:***@h1,nats://h2"
        );
        assert_eq!(redact("a:x@h1:4222"), "a:***@h1:4222");
        assert_eq!(redact("tok@h1:4222"), "***@h1:4222");
        assert_eq!(redact("h1:4222"), "h1:4222");
        assert_eq!(redact("nats://tok@h1,tls://h2"), "nats://***@h1,tls://h2");
        assert_eq!(redact("postgres://u:p@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("postgres://h/db?x=a@b"), "postgres://h/db?x=a@b");
        assert_eq!(redact("postgres://h/db?x=a:b@c"), "postgres://h/db?x=a:b@c");
        assert_eq!(
            redact("mysql://u@h/db?Password=x&ssl-mode=REQUIRED#f"),
            "mysql://u@h/db?Password=***&ssl-mode=REQUIRED#f"
        );
        assert_eq!(redact("sqlite:a.db"), "sqlite:a.db");
        assert_eq!(redact("redis://u:p%40ss@h"), "redis://u:***@h");
    }

    #[tokio::test]
    async fn drained_waits_for_every_guard_and_gives_up_at_its_timeout() {
        let lifecycle = Lifecycle::new();
        assert!(lifecycle.drained(Duration::ZERO).await, "nothing out");
        let one = lifecycle.track();
        let two = lifecycle.track();
        assert_eq!(lifecycle.in_flight(), 2);
        assert!(!lifecycle.drained(Duration::from_millis(20)).await);
        drop(one);
        let waiting = tokio::spawn({
            let lifecycle = lifecycle.clone();
            async move { lifecycle.drained(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(two);
        assert!(waiting.await.unwrap(), "woken when the last guard went");
        assert_eq!(lifecycle.in_flight(), 0);
    }

    #[tokio::test]
    async fn stopped_completes_after_stop_and_at_once_once_stopped() {
        let lifecycle = Lifecycle::new();
        let before = tokio::spawn(lifecycle.stopped());
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!before.is_finished() && !lifecycle.is_stopped());
        lifecycle.stop();
        tokio::time::timeout(Duration::from_secs(5), before)
            .await
            .expect("woken by stop")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(5), lifecycle.stopped())
            .await
            .expect("already stopped");
        assert!(lifecycle.is_stopped());
    }
}
