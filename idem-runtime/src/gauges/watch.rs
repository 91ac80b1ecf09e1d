//! A watched source, whatever its adapter: its [`Source::lag`] behind one object-safe call, with
//! the adapter's error turned into text (each adapter's errors hold no credential).

use std::future::Future;
use std::pin::Pin;

use crate::consume::{Lag, Source};

/// What [`Watch::lag`] returns.
pub(super) type LagFuture<'s> = Pin<Box<dyn Future<Output = Result<Vec<Lag>, String>> + Send + 's>>;

/// A source whose lag the gauges read.
pub(super) trait Watch: Send + Sync {
    fn lag(&self) -> LagFuture<'_>;
}

impl<S: Source> Watch for &S {
    fn lag(&self) -> LagFuture<'_> {
        Box::pin(async move { Source::lag(*self).await.map_err(|err| err.to_string()) })
    }
}
