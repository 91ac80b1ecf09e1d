//! Which message failed: a consumer with recovery on runs each message's handler inside
//! [`watching`], and a delivery that fails or is poisoned notes its scope, key and error there,
//! so that its parked retry or dead letter names the handler and key. Only the failure paths
//! write; outside [`watching`] a note is one thread-local check.

use std::cell::RefCell;
use std::future::Future;

/// The handler, key and error of a failed delivery, as its claim saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) scope: &'static str,
    pub(crate) key: Vec<u8>,
    /// The handler's error or panic, as counted for `max_attempts`; `None` when it did not run
    /// (poisoned).
    pub(crate) error: Option<String>,
}

tokio::task_local! {
    static SEEN: RefCell<Option<Seen>>;
}

/// Runs `work` and returns what the first failure inside it noted, if any.
pub(crate) async fn watching<F: Future>(work: F) -> (F::Output, Option<Seen>) {
    SEEN.scope(RefCell::new(None), async {
        let output = work.await;
        let seen = SEEN.with(|seen| seen.borrow_mut().take());
        (output, seen)
    })
    .await
}

/// Notes a failure of the delivery of `key` in `scope`, when a consumer is watching; the first
/// note of a message wins (a handler that calls others fails where it failed first).
pub(crate) fn note(scope: &'static str, key: &[u8], error: Option<&str>) {
    let _ = SEEN.try_with(|seen| {
        let mut seen = seen.borrow_mut();
        if seen.is_none() {
            *seen = Some(Seen {
                scope,
                key: key.to_vec(),
                error: error.map(str::to_owned),
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_note_inside_is_returned_and_none_leaks_outside() {
        note("outside", b"k", None);
        let ((), seen) = watching(async {
            note("billing", b"17", Some("card declined"));
            note("other", b"18", None);
        })
        .await;
        assert_eq!(
            seen,
            Some(Seen {
                scope: "billing",
                key: b"17".to_vec(),
                error: Some("card declined".into()),
            })
        );
        let ((), nothing) = watching(async {}).await;
        assert_eq!(nothing, None);
    }
}
