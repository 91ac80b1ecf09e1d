//! The compile-time contract of `#[idempotent]`, as trybuild cases in `tests/ui/` (this crate
//! has no code of its own; see `tests/ui.rs`).
