//! The conformance suite of [idem](https://docs.rs/idem): every behaviour test of idem, run on a
//! backend from one macro invocation, so a new [`Store`](idem::store::Store) (yours, or idem's
//! own SQLite and PostgreSQL) is checked rule by rule.
//!
//! ```ignore
//! // tests/conformance.rs of a crate with a backend
//! idem_testkit::suite!(my_crate::MyBackend);
//! ```
//!
//! This emits one `#[test]` per rule, named `capability__rule` (`store__insert_record_is_new_once`,
//! `claim__second_delivery_is_duplicate`, `lease__error_releases_the_lease`, …), so a failure
//! names one rule and `cargo test store__` runs one capability. The store rules come first: each
//! calls one [`Store`](idem::store::Store) method directly, so a new backend's first failure
//! points at one method. The bodies are public async fns in [`rules`], generic over the
//! [`Backend`] (`idem_testkit::rules::claim::second_delivery_is_duplicate::<B>()`), each documented
//! by the rule it checks.
//!
//! A backend implements [`Backend`]: its database type, a setup that opens a fresh migrated
//! database of its own (or skips, saying why), a teardown, and the [`Dialect`] of the suite's
//! business tables. Features `sqlite` and `postgres` give ready ones in [`backends`].
//!
//! **Stability**: this crate is not a stable API; breaking changes may come in any release,
//! including patch releases. Pin it with `=` if you depend on it.
#![warn(missing_docs)]

mod backend;
pub mod backends;
pub mod dialect;
pub mod fixtures;
pub mod rules;

pub use backend::{exec, fetch, Backend, BoxFuture, Kit, KitDb, Ty, Value};
pub use dialect::Dialect;

/// What [`suite!`] expands to. Not public API.
#[doc(hidden)]
pub mod __private {
    /// Runs one rule on a multi-threaded runtime with 4 workers (the concurrency rules need
    /// them), as `#[tokio::test(flavor = "multi_thread")]` would, without the caller depending
    /// on tokio.
    pub fn run(rule: impl std::future::Future<Output = ()>) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(rule)
    }
}

/// Emits one test per rule of the suite for a [`Backend`]: `idem_testkit::suite!(MyBackend);`
/// at the top level (or in a module) of an integration test file. Needs no `use` lines.
#[macro_export]
macro_rules! suite {
    ($backend:ty) => {
        $crate::__tests! { $backend;
            claim__first_delivery_applies => claim::first_delivery_applies,
            claim__second_delivery_is_duplicate => claim::second_delivery_is_duplicate,
            claim__handler_error_rolls_back_and_the_redelivery_applies => claim::handler_error_rolls_back_and_the_redelivery_applies,
            claim__handler_panic_rolls_back_and_the_redelivery_applies => claim::handler_panic_rolls_back_and_the_redelivery_applies,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __tests {
    ($backend:ty; $($name:ident => $cap:ident :: $rule:ident,)*) => {
        $(
            #[test]
            #[allow(non_snake_case)]
            fn $name() {
                $crate::__private::run($crate::rules::$cap::$rule::<$backend>());
            }
        )*
    };
}
