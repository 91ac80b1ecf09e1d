//! The behaviour suite (`idem-testkit`) on SQLite: a file in WAL mode per rule, nothing to install.

idem_testkit::suite!(idem_testkit::backends::Sqlite);
