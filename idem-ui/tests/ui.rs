//! Compile-time contract of `#[idempotent]`: each misuse in `tests/ui/fail` is an error that
//! points at the mistake (the expected output is the checked-in `.stderr`), and each supported
//! form in `tests/ui/pass` compiles and runs.
//!
//! The `.stderr` files pin the output of the toolchain this project builds with (rustc 1.95).
//! After a deliberate change to a message, regenerate them with
//! `TRYBUILD=overwrite cargo test -p idem-ui --test ui` and review the diff. The cases build
//! against `idem` with the feature `sqlite` only (this crate's dev-dependencies).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
