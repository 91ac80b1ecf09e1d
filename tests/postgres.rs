//! The behaviour suite (`idem-testkit`) on PostgreSQL (`IDEM_POSTGRES_URL`, default the local
//! server), one schema per rule. Without a server each rule prints `skipped: …` (in CI, fails).
#![cfg(feature = "postgres")]

idem_testkit::suite!(idem_testkit::backends::Postgres);
