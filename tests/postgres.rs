//! The behaviour suite (`idem-testkit`) on PostgreSQL (`IDEM_POSTGRES_URL`, default the local
//! server), one schema per rule. Built without `IDEM_POSTGRES_URL` (and without
//! `CI`), the rules are ignored, saying so; a server that does not answer fails them in CI and
//! skips them, saying why, elsewhere.
#![cfg(feature = "postgres")]

idem_testkit::suite!(idem_testkit::backends::Postgres; absent(
    idem_no_postgres = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
));
