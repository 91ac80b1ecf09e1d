//! The command line: `idem [--database-url URL] COMMAND`, parsed by clap.

use clap::{Args, Parser, Subcommand};
use idem::Key;

use crate::error::CliError;
use crate::output;

/// Inspect and repair idem's idempotency records: was a message handled, when, what version
/// an entity stands at, which messages keep failing; forget a message, end a stuck lease, clear
/// a message's counted failures, purge expired records; see, replay and discard dead letters.
#[derive(Debug, Parser)]
#[command(name = "idem", version, propagate_version = true)]
pub struct Cli {
    /// Where the database is.
    #[command(flatten)]
    pub connect: ConnectOpts,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How to reach the database, for every command.
#[derive(Debug, Args)]
pub struct ConnectOpts {
    /// The database: `sqlite:PATH`, `postgres://USER@HOST/DB` or `mysql://USER@HOST/DB`
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        global = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,
    /// Seconds to wait for the database to answer
    #[arg(long, global = true, default_value_t = 5, value_name = "SECS")]
    pub connect_timeout: u64,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update idem's tables (safe to run again, also while consumers run)
    Migrate,
    /// Count records and version rows per scope
    Stats {
        /// Only this scope
        #[arg(long)]
        scope: Option<String>,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::STATS_JSON_HELP)]
        json: bool,
    },
    /// Show a message's record (when processed, when it expires, its lease) and, if KEY is an
    /// entity, its version
    Inspect {
        /// The handler's scope
        scope: String,
        /// The key
        #[command(flatten)]
        key: KeyArgs,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::INSPECT_JSON_HELP)]
        json: bool,
    },
    /// Delete a done message's record, so that its next delivery applies again
    Forget {
        /// The handler's scope
        scope: String,
        /// The key
        #[command(flatten)]
        key: KeyArgs,
        /// Do not ask for confirmation (needed when stdin is not a terminal)
        #[arg(long, short)]
        yes: bool,
    },
    /// End the lease of a message in progress (its worker is gone), so that its next delivery
    /// runs the handler
    Release {
        /// The handler's scope
        scope: String,
        /// The key
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Delete every record past its retention, in batches, and every dead letter past
    /// --dead-letter-retention (parked retries overdue by as long become dead letters first)
    Purge {
        /// Records per statement (each its own short transaction)
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        batch: u64,
        /// How long dead letters are kept: replayed and discarded ones from when they were
        /// settled, open ones from their last failure. Parked retries due longer ago than this
        /// (their consumer is gone or renamed) become dead letters with reason `abandoned`.
        /// A number and a unit (ms, s, m, h, d, w): 30d, 2w, 36h
        #[arg(long, default_value = "30d", value_name = "DURATION")]
        dead_letter_retention: String,
    },
    /// List messages whose handler failed and was counted (`max_attempts`), most attempts first
    Poisoned {
        /// Only this scope
        #[arg(long)]
        scope: Option<String>,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::POISONED_JSON_HELP)]
        json: bool,
    },
    /// Clear a message's counted failures (`max_attempts`), so that its next delivery runs the
    /// handler again
    ClearAttempts {
        /// The handler's scope
        scope: String,
        /// The key
        #[command(flatten)]
        key: KeyArgs,
    },
    /// Show the transactional outbox per destination: messages pending (not yet confirmed by
    /// the broker), the oldest one's age, failed publishes, and sent rows not purged yet
    Outbox {
        /// Only this destination
        #[arg(long)]
        destination: Option<String>,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::OUTBOX_JSON_HELP)]
        json: bool,
    },
    /// See, replay and discard the deliveries consumers gave up on (dead letters kept in the
    /// database): `summary` groups them by the shape of their error
    #[command(subcommand)]
    DeadLetters(DeadLetterCommand),
    /// The former name of `clear-attempts` (deprecated: says so on stderr, then clears)
    #[command(hide = true)]
    Retry {
        /// The handler's scope
        scope: String,
        /// The key
        #[command(flatten)]
        key: KeyArgs,
    },
}

/// What `idem dead-letters` does.
#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// Count the open dead letters per group (one consumer, scope, reason and error shape:
    /// "order 17 not found" and "order 93 not found" are one group), the largest first
    Summary {
        /// Which dead letters
        #[command(flatten)]
        filters: DeadLetterFilters,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::SUMMARY_JSON_HELP)]
        json: bool,
    },
    /// List dead letters in id order, a page at a time, without their payloads (`show ID`
    /// prints one whole)
    List {
        /// Which dead letters
        #[command(flatten)]
        filters: DeadLetterFilters,
        /// Only those in this state
        #[arg(long, value_enum, default_value_t = StateArg::Dead)]
        state: StateArg,
        /// Only ids above this one: the last id of the page before
        #[arg(long, value_name = "ID")]
        after: Option<i64>,
        /// At most this many
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        limit: u64,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::LIST_JSON_HELP)]
        json: bool,
    },
    /// Print one dead letter: its error, where it came from, attempts, times, state, headers
    /// and payload (JSON pretty-printed, other text as it is, other bytes in base64)
    Show {
        /// The dead letter's id (`list` shows it)
        id: i64,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::SHOW_JSON_HELP)]
        json: bool,
    },
    /// Send dead letters back to their consumer through the outbox, each as a new message
    /// whose id is derived from the dead letter's, and clear their counted attempts; they
    /// become `replayed`. Run again (or after it was interrupted), it sends none twice
    Replay {
        /// Which dead letters (at least one selector, or --all)
        #[command(flatten)]
        selection: Selection,
        /// Instead of the outbox, put each back among its consumer's parked retries, due now:
        /// the consumer (with durable retries on) runs it in-process, without the broker
        #[arg(long)]
        to_consumer: bool,
        /// Print what would be replayed, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::REPLAY_JSON_HELP)]
        json: bool,
    },
    /// Mark dead letters discarded: they leave the summary and stay, `discarded`, until
    /// `idem purge` removes them after the retention
    Discard {
        /// Which dead letters (at least one selector, or --all)
        #[command(flatten)]
        selection: Selection,
        /// Print what would be discarded, change nothing
        #[arg(long)]
        dry_run: bool,
        /// Print JSON (`--help` lists its fields)
        #[arg(long, long_help = output::DISCARD_JSON_HELP)]
        json: bool,
    },
}

/// The dead letters a command looks at: each option given must match.
#[derive(Debug, Clone, Default, Args)]
pub struct DeadLetterFilters {
    /// Only this group: the 16 hex digits `summary` shows
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Only this handler scope's
    #[arg(long)]
    pub scope: Option<String>,
    /// Only this reason's: poisoned, undecodable, bad_key, conflict, too_many_deliveries,
    /// replay, retries_exhausted, abandoned
    #[arg(long)]
    pub reason: Option<String>,
    /// Only those consumed from this queue, stream or topic
    #[arg(long)]
    pub source: Option<String>,
    /// Only this consumer's (its `Recovery` name)
    #[arg(long)]
    pub consumer: Option<String>,
    /// Only those whose last failure was at or after TIME: RFC 3339 (2026-05-01T12:00:00Z,
    /// or a date) or a duration before now (2h, 30m, 7d)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only those whose last failure was before TIME (written as for --since)
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
}

impl DeadLetterFilters {
    /// Whether no option is given.
    pub fn is_empty(&self) -> bool {
        let DeadLetterFilters {
            group,
            scope,
            reason,
            source,
            consumer,
            since,
            until,
        } = self;
        [group, scope, reason, source, consumer, since, until]
            .iter()
            .all(|option| option.is_none())
    }
}

/// The dead letters `replay` and `discard` change: by id, by filters, or all of them.
#[derive(Debug, Clone, Default, Args)]
pub struct Selection {
    /// This dead letter; repeat for several (alone: not with the filters)
    #[arg(long = "id", value_name = "ID")]
    pub ids: Vec<i64>,
    /// Which dead letters
    #[command(flatten)]
    pub filters: DeadLetterFilters,
    /// Every open dead letter (needed when no selector is given)
    #[arg(long)]
    pub all: bool,
}

/// A dead letter's state, as `list --state` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StateArg {
    /// Open: waiting for an operator
    Dead,
    /// Sent back through the outbox
    Replayed,
    /// Given up on, kept until the retention
    Discarded,
    /// Every state
    All,
}

/// A key as the operator types it.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The key's text: a string as itself, an integer in decimal (42 and "42" are one key)
    #[arg(required_unless_present = "part", conflicts_with = "part")]
    pub key: Option<String>,
    /// One part of a tuple key, in order; repeat for each part (up to 4): --part 7 --part eu
    #[arg(long, value_name = "PART")]
    pub part: Vec<String>,
    /// KEY (or each PART) is hexadecimal bytes, `0x` optional: for keys that are not text
    #[arg(long)]
    pub hex: bool,
}

impl KeyArgs {
    /// The key's canonical bytes, encoded by idem's own [`Key`] implementations.
    pub fn encode(&self) -> Result<Vec<u8>, CliError> {
        let texts: Vec<&str> = match &self.key {
            Some(key) => vec![key.as_str()],
            None => self.part.iter().map(String::as_str).collect(),
        };
        let bytes = if self.hex {
            let parts = texts
                .iter()
                .map(|t| parse_hex(t))
                .collect::<Result<Vec<_>, _>>()?;
            encode_parts(&parts, self.key.is_some())
        } else {
            encode_parts(&texts, self.key.is_some())
        }?;
        if bytes.is_empty() {
            return Err(CliError::usage(
                "an empty key (or key part) is never stored: give the key's text",
            ));
        }
        Ok(bytes)
    }
}

/// One key (`single`), or a tuple of up to four parts.
fn encode_parts<K: Key>(parts: &[K], single: bool) -> Result<Vec<u8>, CliError> {
    let mut out = Vec::new();
    match parts {
        [key] if single => key.write_key(&mut out),
        [a] => (a,).write_key(&mut out),
        [a, b] => (a, b).write_key(&mut out),
        [a, b, c] => (a, b, c).write_key(&mut out),
        [a, b, c, d] => (a, b, c, d).write_key(&mut out),
        _ => {
            return Err(CliError::usage(format!(
                "a tuple key has 1 to 4 parts, not {}: repeat --part once per part",
                parts.len()
            )))
        }
    }
    Ok(out)
}

/// Hexadecimal text (`0x` optional) as bytes.
fn parse_hex(text: &str) -> Result<Vec<u8>, CliError> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    let bad = || CliError::usage(format!("`{text}` is not hexadecimal bytes (--hex)"));
    if !digits.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            digits
                .get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn key(key: Option<&str>, parts: &[&str], hex: bool) -> Result<Vec<u8>, CliError> {
        KeyArgs {
            key: key.map(str::to_string),
            part: parts.iter().map(|p| p.to_string()).collect(),
            hex,
        }
        .encode()
    }

    fn runtime(k: impl Key) -> Vec<u8> {
        let mut out = Vec::new();
        k.write_key(&mut out);
        out
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn typed_keys_encode_as_the_runtime_encodes_them() {
        assert_eq!(key(Some("evt-1"), &[], false).unwrap(), runtime("evt-1"));
        assert_eq!(key(Some("42"), &[], false).unwrap(), runtime(42_u64));
        assert_eq!(key(None, &["7", "eu"], false).unwrap(), runtime((7, "eu")));
        assert_eq!(key(None, &["x"], false).unwrap(), runtime(("x",)));
        assert_eq!(
            key(None, &["1", "2", "3", "4"], false).unwrap(),
            runtime((1, 2, 3, 4))
        );
        assert_eq!(key(Some("0xff00"), &[], true).unwrap(), vec![0xff, 0]);
        assert_eq!(
            key(None, &["ff", "0x01"], true).unwrap(),
            runtime((vec![0xff_u8], vec![1_u8]))
        );
    }

    #[test]
    fn bad_keys_are_usage_errors() {
        for bad in [
            key(Some(""), &[], false),
            key(None, &["a", ""], false),
            key(None, &["1", "2", "3", "4", "5"], false),
            key(Some("0xf"), &[], true),
            key(Some("zz"), &[], true),
        ] {
            assert!(bad.is_err());
        }
    }
}
