//! Errors that need no populated database: bad usage (exit 2), bad or unreachable URLs and
//! backends not built (exit 1), each one line on stderr naming the problem.

mod common;

use common::{idem, mysql_url, postgres_url, remove_sqlite, sqlite_url, with_database};

#[test]
fn bad_usage_exits_2_with_clap_s_message() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["inspect", "cli::credit"],
        &["inspect", "cli::credit", "k", "--part", "a"],
        &["purge", "--batch", "0"],
        &["stats", "--scope"],
        &["dead-letters"],
        &["dead-letters", "show"],
        &["dead-letters", "show", "seven"],
        &["dead-letters", "list", "--limit", "0"],
        &["dead-letters", "list", "--state", "zombie"],
        &["dead-letters", "replay", "--id", "x"],
    ] {
        let run = idem(Some("sqlite::memory:"), args);
        assert_eq!(run.code, Some(2), "{args:?}: {run:#?}");
        assert_eq!(run.stdout, "", "{args:?}");
        assert!(run.stderr.starts_with("error: "), "{args:?}: {run:#?}");
        assert!(run.stderr.contains("--help"), "{args:?}: {run:#?}");
    }
}

#[test]
fn help_and_version_exit_0() {
    let help = idem(None, &["--help"]);
    assert!(help.ok().contains("Commands:") && help.stdout.contains("--database-url <URL>"));
    for command in [
        "migrate",
        "stats",
        "inspect",
        "forget",
        "release",
        "purge",
        "poisoned",
        "outbox",
        "clear-attempts",
        "dead-letters",
    ] {
        assert!(help.stdout.contains(&format!("  {command} ")), "{command}");
    }
    // The former name of clear-attempts still parses, but is not offered.
    assert!(!help.stdout.contains("  retry "), "{}", help.stdout);
    assert!(idem(None, &["--version"]).ok().starts_with("idem "));
}

#[test]
fn keys_the_runtime_never_stores_are_usage_errors() {
    let err = idem(Some("sqlite::memory:"), &["inspect", "s", ""])
        .fails(2)
        .to_string();
    assert!(err.contains("empty key"), "{err}");
    let parts = [
        "inspect", "s", "--part", "1", "--part", "2", "--part", "3", "--part", "4", "--part", "5",
    ];
    let err = idem(Some("sqlite::memory:"), &parts).fails(2).to_string();
    assert!(err.contains("1 to 4 parts, not 5"), "{err}");
    let err = idem(Some("sqlite::memory:"), &["inspect", "s", "--hex", "0xfg"])
        .fails(2)
        .to_string();
    assert!(err.contains("not hexadecimal"), "{err}");
}

#[test]
fn dead_letter_selections_times_and_retentions_are_checked_before_connecting() {
    // A server that is not there: each is refused (exit 2) before connecting.
    let nowhere = Some("postgres://app@127.0.0.1:1/app");
    for (args, says) in [
        (&["dead-letters", "replay"][..], "replay needs a selector"),
        (
            &["dead-letters", "discard", "--dry-run"],
            "discard needs a selector",
        ),
        (
            &[
                "dead-letters",
                "replay",
                "--all",
                "--group",
                "0123456789abcdef",
            ],
            "give it alone",
        ),
        (
            &[
                "dead-letters",
                "discard",
                "--id",
                "4",
                "--reason",
                "poisoned",
            ],
            "--id selects dead letters by id",
        ),
        (
            &["dead-letters", "summary", "--group", "orders"],
            "`orders` is not a group",
        ),
        (
            &["dead-letters", "list", "--since", "yesterday"],
            "--since: `yesterday` is not a time",
        ),
        (
            &[
                "dead-letters",
                "replay",
                "--until",
                "2026-02-30",
                "--scope",
                "s",
            ],
            "--until: `2026-02-30` is not a time",
        ),
        (
            &["purge", "--dead-letter-retention", "30"],
            "--dead-letter-retention: `30` is not a duration: a number without a unit",
        ),
        (&["purge", "--dead-letter-retention", "0d"], "it is zero"),
    ] {
        let err = idem(nowhere, args).fails(2).to_string();
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_missing_url_is_bad_usage() {
    let err = idem(None, &["stats"]).fails(2).to_string();
    assert!(
        err.contains("--database-url") && err.contains("DATABASE_URL"),
        "{err}"
    );
}

#[test]
fn a_bad_url_names_the_url_and_what_to_use() {
    let err = idem(Some("orders.db"), &["stats"]).fails(1).to_string();
    assert!(
        err.contains("bad database URL `orders.db`") && err.contains("sqlite:PATH"),
        "{err}"
    );
    let err = idem(Some("postgres://h:notaport/db"), &["stats"])
        .fails(1)
        .to_string();
    assert!(err.contains("bad database URL"), "{err}");
}

#[test]
fn an_unreachable_server_is_named_without_its_password() {
    for url in [
        "postgres://app:s3cret@127.0.0.1:1/app",
        "mysql://app:s3cret@127.0.0.1:1/app",
        "mariadb://app:s3cret@127.0.0.1:1/app",
    ] {
        let err = idem(Some(url), &["stats"]).fails(1).to_string();
        let shown = url.replace("s3cret", "***");
        assert!(
            err.starts_with(&format!("error: cannot connect to `{shown}`")),
            "{err}"
        );
        assert!(
            err.contains("check the URL and that the server is running"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
    }
}

#[test]
fn no_command_shows_a_password_given_in_the_url() {
    const SECRET: &str = "s3cret-Pa55w0rd";
    let urls = [
        format!("postgres://app:{SECRET}@127.0.0.1:1/app"),
        format!("postgres://app@127.0.0.1:1/app?password={SECRET}&sslmode=prefer"),
        format!("mysql://app:{SECRET}@127.0.0.1:1/app"),
        format!("mariadb://app@127.0.0.1:1/app?password={SECRET}"),
        format!("postgres://app:{SECRET}@127.0.0.1:notaport/app"),
    ];
    let commands: [&[&str]; 5] = [
        &["stats"],
        &["migrate"],
        &["outbox", "--json"],
        &["dead-letters", "summary", "--json"],
        &["poisoned", "--json"],
    ];
    for url in &urls {
        for args in commands {
            let run = idem(Some(url), args);
            assert_eq!(run.code, Some(1), "{url} {args:?}: {run:#?}");
            let printed = format!("{}{}", run.stdout, run.stderr);
            assert!(!printed.contains(SECRET), "{url} {args:?}: {printed}");
            assert!(
                printed.contains("***"),
                "{url} {args:?} names the URL: {printed}"
            );
        }
    }
}

#[test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
fn a_refused_password_is_not_shown() {
    const SECRET: &str = "s3cret-Pa55w0rd";
    let url = mysql_url();
    let Some((_, rest)) = url.split_once("://") else {
        return;
    };
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let wrong = format!("mysql://idem_no_such_user:{SECRET}@{host}");
    let run = idem(Some(&wrong), &["stats"]);
    if run.stderr.contains("Connection refused") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: no MySQL/MariaDB at {url}");
        return;
    }
    let err = run.fails(1).to_string();
    assert!(
        err.contains("Access denied") && err.contains("***"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "{err}");
}

#[test]
#[cfg_attr(
    idem_no_postgres,
    ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
)]
fn a_missing_postgres_database_is_named() {
    let url = postgres_url();
    let Some((server, _)) = url.rsplit_once('/') else {
        return;
    };
    let missing = format!("{server}/idem_cli_no_such_database");
    let run = idem(Some(&missing), &["stats"]);
    if run.stderr.contains("Connection refused") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: no PostgreSQL at {url}");
        return;
    }
    let err = run.fails(1).to_string();
    assert!(err.contains("idem_cli_no_such_database"), "{err}");
}

#[test]
#[cfg_attr(
    idem_no_mysql,
    ignore = "set IDEM_MYSQL_URL (e.g. mysql://root@127.0.0.1:3306/test) to run"
)]
fn a_missing_mysql_database_is_named() {
    let url = mysql_url();
    let missing = with_database(&url, "idem_cli_no_such_database");
    let run = idem(Some(&missing), &["stats"]);
    if run.stderr.contains("Connection refused") && std::env::var_os("CI").is_none() {
        eprintln!("skipped: no MySQL/MariaDB at {url}");
        return;
    }
    let err = run.fails(1).to_string();
    assert!(
        err.contains("cannot connect to") && err.contains("idem_cli_no_such_database"),
        "{err}"
    );
}

#[test]
fn a_missing_sqlite_file_is_not_created_except_by_migrate() {
    let (url, path) = sqlite_url();
    let err = idem(Some(&url), &["stats"]).fails(1).to_string();
    assert!(
        err.contains("cannot open") && err.contains("idem migrate"),
        "{err}"
    );
    assert!(!path.exists());
    assert_eq!(
        idem(Some(&url), &["migrate"]).ok(),
        "idem's tables are up to date\n"
    );
    assert!(path.exists());
    remove_sqlite(&path);
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    let (url, path) = sqlite_url();
    idem(Some(&url), &["migrate"]).ok();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["stats", "--json"])
        .env("DATABASE_URL", &url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| head -0`: the reader is gone before anything is written
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr, "", "nothing to say: nobody reads it");
    assert_eq!(out.status.code(), Some(1));
    remove_sqlite(&path);
}
