//! [`Probe`]: a check of a source's connection to its broker, for a consumer's readiness
//! ([`Health`](super::Health)).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A check of a source's connection to its broker, run on the health interval: each adapter's
/// `Source::probe` (through [`Source::probe`](super::Source::probe), so [`Consumer::health_of`](super::Consumer::health_of) takes any source),
/// or one of your own. Its error's text should say what is wrong, without credentials.
///
/// ```
/// use idem::consume::Probe;
///
/// let always = Probe::connected();
/// let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
/// let mine = Probe::new(move || {
///     let up = flag.load(std::sync::atomic::Ordering::Relaxed);
///     async move { if up { Ok(()) } else { Err("the link is down") } }
/// });
/// # let _ = (always, mine);
/// ```
#[derive(Clone)]
pub struct Probe(Arc<dyn Fn() -> Check + Send + Sync>);

/// One run of a probe.
type Check = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

impl Probe {
    /// A probe running `check`: `Ok` when the broker is reachable, an error saying why not.
    pub fn new<F, Fut, E>(check: F) -> Probe
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display,
    {
        Probe(Arc::new(move || {
            let check = check();
            Box::pin(async move { check.await.map_err(|err| err.to_string()) })
        }))
    }

    /// A probe that always says connected: [`MemoryQueue`](super::memory::MemoryQueue)'s, and
    /// a consumer's until it is given one.
    pub fn connected() -> Probe {
        Probe::new(|| async { Ok::<(), std::convert::Infallible>(()) })
    }

    /// Runs the probe, bounded by `timeout`.
    pub(crate) async fn check(&self, timeout: Duration) -> Result<(), String> {
        match tokio::time::timeout(timeout, (self.0)()).await {
            Ok(result) => result,
            Err(_) => Err(no_answer(timeout)),
        }
    }
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Probe")
    }
}

/// The error of a check that ran out of time.
pub(crate) fn no_answer(timeout: Duration) -> String {
    format!("no answer within {timeout:?}")
}
