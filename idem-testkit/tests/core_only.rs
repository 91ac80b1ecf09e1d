//! The suite for a backend that claims the core contract alone (`idem::store::Store`, none of
//! the capabilities): SQLite, told to claim none. The core rules run and must pass; each rule of
//! a capability is an ignored test whose reason names the trait it needs (and which fails if
//! run with `--ignored`: it was never checked).
#![cfg(feature = "sqlite")]

idem_testkit::suite!(idem_testkit::backends::Sqlite; without(leases, stamps, attempts, admin, recovery));
