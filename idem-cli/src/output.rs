//! How results look: keys shown readably, times as RFC 3339 and "N ago", payloads as JSON,
//! text or base64, and the JSON of `stats --json`, `inspect --json`, `poisoned --json`,
//! `outbox --json` and `dead-letters … --json`, whose fields are stable and listed in each
//! command's `--help` (the `*_JSON_HELP` texts below).

use idem::admin::{
    AttemptInfo, DeadLetter, DeadLetterGroup, DeadLetterInfo, DestinationStats, RecordInfo,
    ScopeStats, VersionInfo,
};
use idem::key::KeyDisplay;
use serde::Serialize;

use crate::error::CliError;

/// A stored key as people read it: a tuple split into its parts, text when it is UTF-8,
/// otherwise `0x` and hex (each part alike).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyView {
    /// A single key, shown by [`KeyDisplay`] (text, or hex when not UTF-8).
    Plain(String),
    /// A tuple key's parts, each shown by [`KeyDisplay`].
    Tuple(Vec<String>),
}

impl KeyView {
    /// Reads the canonical bytes of a key: a tuple when they are 1 to 4 length-prefixed,
    /// non-empty parts that use every byte (as `idem::Key` writes tuples), else one key.
    pub fn of(bytes: &[u8]) -> KeyView {
        match split_tuple(bytes) {
            Some(parts) => KeyView::Tuple(
                parts
                    .into_iter()
                    .map(|p| KeyDisplay(p).to_string())
                    .collect(),
            ),
            None => KeyView::Plain(KeyDisplay(bytes).to_string()),
        }
    }
}

impl std::fmt::Display for KeyView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyView::Plain(text) => f.write_str(text),
            KeyView::Tuple(parts) => write!(f, "({})", parts.join(", ")),
        }
    }
}

/// The parts of a tuple key, if `bytes` is one.
fn split_tuple(bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        if len == 0 || len > tail.len() || parts.len() == 4 {
            return None;
        }
        let (part, tail) = tail.split_at(len);
        parts.push(part);
        rest = tail;
    }
    (!parts.is_empty()).then_some(parts)
}

/// Epoch milliseconds as RFC 3339 in UTC, to the millisecond: `2026-12-03T07:14:58.123Z`.
pub fn rfc3339(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let of_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1_000 % 60,
        of_day % 1_000
    )
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// How far `then` is from `now` (both epoch milliseconds), in its two largest units:
/// `5s ago`, `3m 12s ago`, `in 6d 23h`, `now` within a second.
pub fn ago(now: i64, then: i64) -> String {
    let diff = now.saturating_sub(then);
    let secs = diff.unsigned_abs() / 1_000;
    if secs == 0 {
        return "now".to_string();
    }
    let (d, h, m, s) = (secs / 86_400, secs / 3_600 % 24, secs / 60 % 60, secs % 60);
    let span = match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) if s == 0 => format!("{m}m"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, 0) => format!("{h}h"),
        (0, _, _) => format!("{h}h {m}m"),
        (_, 0, _) => format!("{d}d"),
        _ => format!("{d}d {h}h"),
    };
    if diff > 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// A time for people: `2026-12-03T07:14:58.123Z (5s ago)`.
pub fn when(now: i64, ms: i64) -> String {
    format!("{} ({})", rfc3339(ms), ago(now, ms))
}

/// The state of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Handled and committed.
    Done,
    /// Held by a running delivery under a lease.
    InProgress,
    /// Held under a lease that ran out: its worker is gone, the next delivery takes it over.
    LeaseLapsed,
}

impl State {
    /// The state of `record` at `now`.
    pub fn of(record: &RecordInfo, now: i64) -> State {
        match record.lease_until_ms {
            None => State::Done,
            Some(until) if until >= now => State::InProgress,
            Some(_) => State::LeaseLapsed,
        }
    }
}

/// The first lines of every `--json` long help.
macro_rules! json_intro {
    () => {
        concat!(
            "Print JSON instead of text, with these fields (they stay stable; times are RFC 3339\n",
            "in UTC, null when absent):\n",
        )
    };
}

/// The `--help` of `stats --json`: every field of [`StatsJson`].
pub const STATS_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the counts were taken\n",
    "  scopes                     one object per scope, sorted by scope:\n",
    "    scope                    the handler's scope\n",
    "    records                  every record: done, in progress, or expired and not purged\n",
    "    in_progress              records under a running lease\n",
    "    lapsed_leases            records whose lease ran out (the next delivery takes over)\n",
    "    expired                  records a purge would delete now\n",
    "    versions                 version rows (entities)\n",
    "    oldest_processed_at      when the oldest record was processed; null without records\n",
    "    newest_processed_at      when the newest record was processed; null without records",
);

/// The `--help` of `inspect --json`: every field of [`InspectJson`].
pub const INSPECT_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the record was read\n",
    "  scope                      the scope asked for\n",
    "  key                        the key asked for:\n",
    "    display                  as the text output shows it: text, (42, eu) or 0x and hex\n",
    "    parts                    a tuple key's parts, each text or 0x and hex; null for one key\n",
    "    hex                      the stored bytes in hex, without 0x\n",
    "  record                     the message's record; null when there is none:\n",
    "    state                    done, in_progress, or lease_lapsed (its worker is gone)\n",
    "    processed_at             when processed (under a lease: when claimed)\n",
    "    expires_at               when a purge may delete it\n",
    "    expired                  whether that time has passed (true or false)\n",
    "    lease_until              until when the lease holds; null once done\n",
    "  version                    the key's version row as an entity; null when there is none:\n",
    "    version                  the entity's highest applied version\n",
    "    updated_at               when it was applied",
);

/// The `--help` of `poisoned --json`: every field of [`PoisonedJson`].
pub const POISONED_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the list was taken\n",
    "  complete                   false when only the first 1,000 messages are listed\n",
    "  messages                   the messages with counted failures, most attempts first:\n",
    "    scope                    the handler's scope\n",
    "    key                      the key, as inspect --json shows it:\n",
    "      display                as the text output shows it: text, (42, eu) or 0x and hex\n",
    "      parts                  a tuple key's parts, each text or 0x and hex; null for one key\n",
    "      hex                    the stored bytes in hex, without 0x\n",
    "    attempts                 failed attempts counted\n",
    "    last_error               what the last failure said; null when its error said nothing\n",
    "    last_failed_at           when the last failure was counted",
);

/// The `--help` of `outbox --json`: every field of [`OutboxJson`].
pub const OUTBOX_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the counts were taken\n",
    "  destinations               one object per destination, sorted by destination:\n",
    "    destination              where the messages go\n",
    "    pending                  messages committed and not yet confirmed by the broker\n",
    "    oldest_pending_at        when the oldest pending message was written; null if none\n",
    "    oldest_pending_age_secs  its age in whole seconds (for an alert); null if none\n",
    "    failed                   pending messages whose publish failed (retried after a backoff)\n",
    "    most_attempts            the most failed publishes of one pending message\n",
    "    last_error               that message's last error; null without failures\n",
    "    sent                     sent messages kept until the relay purges them",
);

/// `stats --json`.
#[derive(Debug, Serialize)]
pub struct StatsJson {
    /// The database's clock when the counts were taken.
    pub now: String,
    /// One entry per scope, sorted by scope.
    pub scopes: Vec<ScopeJson>,
}

/// One scope of `stats --json`.
#[derive(Debug, Serialize)]
pub struct ScopeJson {
    /// The handler's scope.
    pub scope: String,
    /// Every record: done, in progress, or expired and not purged yet.
    pub records: u64,
    /// Records under a running lease.
    pub in_progress: u64,
    /// Records under a lease that ran out.
    pub lapsed_leases: u64,
    /// Records a purge would delete now.
    pub expired: u64,
    /// Version rows (entities).
    pub versions: u64,
    /// When the oldest record was processed; null without records.
    pub oldest_processed_at: Option<String>,
    /// When the newest record was processed; null without records.
    pub newest_processed_at: Option<String>,
}

impl From<&ScopeStats> for ScopeJson {
    fn from(s: &ScopeStats) -> Self {
        ScopeJson {
            scope: s.scope.clone(),
            records: s.records,
            in_progress: s.in_progress,
            lapsed_leases: s.lapsed_leases,
            expired: s.expired,
            versions: s.versions,
            oldest_processed_at: s.oldest_processed_ms.map(rfc3339),
            newest_processed_at: s.newest_processed_ms.map(rfc3339),
        }
    }
}

/// `inspect --json`.
#[derive(Debug, Serialize)]
pub struct InspectJson {
    /// The database's clock when the record was read.
    pub now: String,
    /// The scope asked for.
    pub scope: String,
    /// The key asked for.
    pub key: KeyJson,
    /// The message's record; null when there is none.
    pub record: Option<RecordJson>,
    /// The version row of the key as an entity; null when there is none.
    pub version: Option<VersionJson>,
}

/// A key in JSON.
#[derive(Debug, Serialize)]
pub struct KeyJson {
    /// As the human output shows it.
    pub display: String,
    /// A tuple key's parts, each shown as text or `0x` hex; null for a single key.
    pub parts: Option<Vec<String>>,
    /// The canonical bytes in hex, without `0x`.
    pub hex: String,
}

impl KeyJson {
    /// The JSON of the key with these canonical bytes.
    pub fn of(bytes: &[u8]) -> KeyJson {
        let view = KeyView::of(bytes);
        KeyJson {
            display: view.to_string(),
            parts: match view {
                KeyView::Tuple(parts) => Some(parts),
                KeyView::Plain(_) => None,
            },
            hex: bytes.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }
}

/// A record in JSON.
#[derive(Debug, Serialize)]
pub struct RecordJson {
    /// `done`, `in_progress` or `lease_lapsed`.
    pub state: State,
    /// When processed (for a lease: when claimed).
    pub processed_at: String,
    /// When the record may be purged.
    pub expires_at: String,
    /// Whether that time has passed.
    pub expired: bool,
    /// Until when the lease holds; null once done.
    pub lease_until: Option<String>,
}

impl RecordJson {
    /// The JSON of `record` at `now`.
    pub fn of(record: &RecordInfo, now: i64) -> RecordJson {
        RecordJson {
            state: State::of(record, now),
            processed_at: rfc3339(record.processed_ms),
            expires_at: rfc3339(record.expires_ms),
            expired: record.expires_ms < now,
            lease_until: record.lease_until_ms.map(rfc3339),
        }
    }
}

/// A version row in JSON.
#[derive(Debug, Serialize)]
pub struct VersionJson {
    /// The entity's highest applied version.
    pub version: i64,
    /// When it was applied.
    pub updated_at: String,
}

impl From<&VersionInfo> for VersionJson {
    fn from(v: &VersionInfo) -> Self {
        VersionJson {
            version: v.version,
            updated_at: rfc3339(v.updated_ms),
        }
    }
}

/// `poisoned --json`.
#[derive(Debug, Serialize)]
pub struct PoisonedJson {
    /// The database's clock when the list was taken.
    pub now: String,
    /// Whether every counted message is listed (false: the first 1,000, most attempts first).
    pub complete: bool,
    /// The messages with counted failures, most attempts first.
    pub messages: Vec<FailedJson>,
}

/// One message of `poisoned --json`.
#[derive(Debug, Serialize)]
pub struct FailedJson {
    /// The handler's scope.
    pub scope: String,
    /// The key, as `inspect --json` shows it.
    pub key: KeyJson,
    /// Failed attempts counted.
    pub attempts: u32,
    /// What the last failure said; null when the handler's error said nothing.
    pub last_error: Option<String>,
    /// When the last failure was counted.
    pub last_failed_at: String,
}

impl From<&AttemptInfo> for FailedJson {
    fn from(row: &AttemptInfo) -> Self {
        FailedJson {
            scope: row.scope.clone(),
            key: KeyJson::of(&row.key),
            attempts: row.attempts,
            last_error: row.last_error.clone(),
            last_failed_at: rfc3339(row.updated_ms),
        }
    }
}

/// `outbox --json`.
#[derive(Debug, Serialize)]
pub struct OutboxJson {
    /// The database's clock when the counts were taken.
    pub now: String,
    /// One entry per destination, sorted by destination.
    pub destinations: Vec<DestinationJson>,
}

/// One destination of `outbox --json`.
#[derive(Debug, Serialize)]
pub struct DestinationJson {
    /// Where the messages go.
    pub destination: String,
    /// Messages committed and not yet confirmed by the broker.
    pub pending: u64,
    /// When the oldest pending message was written; null when nothing is pending.
    pub oldest_pending_at: Option<String>,
    /// How long ago, in whole seconds (for alerts); null when nothing is pending.
    pub oldest_pending_age_secs: Option<u64>,
    /// Pending messages whose publish failed at least once.
    pub failed: u64,
    /// The most failed publishes of one pending message.
    pub most_attempts: u64,
    /// What the last failure of that message said; null without failures.
    pub last_error: Option<String>,
    /// Sent messages kept until the relay purges them.
    pub sent: u64,
}

impl DestinationJson {
    /// The JSON of `d` at `now`.
    pub fn of(d: &DestinationStats, now: i64) -> DestinationJson {
        DestinationJson {
            destination: d.destination.clone(),
            pending: d.pending,
            oldest_pending_at: d.oldest_pending_ms.map(rfc3339),
            oldest_pending_age_secs: d
                .oldest_pending_ms
                .map(|then| now.saturating_sub(then).max(0).unsigned_abs() / 1_000),
            failed: d.failed,
            most_attempts: d.most_attempts,
            last_error: d.last_error.clone(),
            sent: d.sent,
        }
    }
}

/// The `--help` of `dead-letters summary --json`: every field of [`SummaryJson`].
pub const SUMMARY_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the counts were taken\n",
    "  groups                     one object per group, the largest first:\n",
    "    group                    the group's 16 hex digits (for --group)\n",
    "    consumer                 the consumer that gave up on them\n",
    "    scope                    the handler's scope; null where unknown (not decoded)\n",
    "    reason                   why: poisoned, undecodable, bad_key, conflict, abandoned, ...\n",
    "    error_shape              their error with numbers, ids and quoted values taken out\n",
    "    count                    how many dead letters are in the group\n",
    "    first_failed_at          the earliest first failure among them\n",
    "    last_failed_at           the latest last failure among them",
);

/// The fields of one dead letter, as `list --json` and `show --json` print them.
macro_rules! dead_letter_fields {
    () => {
        concat!(
            "    id                       the dead letter's id (for --id, show, --after)\n",
            "    state                    dead, replayed or discarded\n",
            "    consumer                 the consumer that gave up on it\n",
            "    scope                    the handler's scope; null where unknown (not decoded)\n",
            "    key                      the message's key; null where unknown:\n",
            "      display                as the text output shows it: text, (42, eu) or 0x and hex\n",
            "      parts                  a tuple key's parts, each text or 0x and hex; null for one key\n",
            "      hex                    the stored bytes in hex, without 0x\n",
            "    reason                   why: poisoned, undecodable, bad_key, conflict, abandoned, ...\n",
            "    error                    what the last failure said\n",
            "    group                    its group's 16 hex digits (for --group)\n",
            "    broker                   rabbitmq, nats, kafka, redis or memory\n",
            "    source                   the queue, stream or topic it was consumed from\n",
            "    coordinates              where the broker had it (partition and offset, sequence, ...)\n",
            "    destination              where a replay publishes it\n",
            "    attempts                 how many times it failed\n",
            "    first_failed_at          when it failed first\n",
            "    last_failed_at           when it failed last\n",
            "    settled_at               when it was replayed or discarded; null while dead\n",
            "    replayed_as              the outbox message id of its replay; null if never replayed",
        )
    };
}

/// The `--help` of `dead-letters list --json`: every field of [`ListJson`].
pub const LIST_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the list was taken\n",
    "  next_after                 the last id listed when the page is full (pass it to --after\n",
    "                             for the next page); null when this is the last page\n",
    "  dead_letters               one object per dead letter, in id order:\n",
    dead_letter_fields!(),
);

/// The `--help` of `dead-letters show --json`: every field of [`ShowJson`].
pub const SHOW_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when it was read\n",
    "  dead_letter                the dead letter:\n",
    dead_letter_fields!(),
    "\n",
    "    error_shape              its error with numbers, ids and quoted values taken out\n",
    "    headers                  the delivery's headers in order, each a [name, value] array\n",
    "    payload                  the delivery's bytes:\n",
    "      size                   how many bytes\n",
    "      encoding               json, text (UTF-8, not JSON) or binary (not UTF-8)\n",
    "      text                   the payload as text; null when binary\n",
    "      base64                 the bytes in standard base64, always there",
);

/// The `--help` of `dead-letters replay --json`: every field of [`ReplayJson`].
pub const REPLAY_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the replay began\n",
    "  dry_run                    true with --dry-run: the lists say what a replay would do\n",
    "  replayed                   the dead letters replayed (or that would be), in id order:\n",
    "    id                       the dead letter's id\n",
    "    outbox_id                the outbox message that carries it (null: --to-consumer)\n",
    "    destination              where the relay publishes it\n",
    "    consumer                 with --to-consumer, whose parked retries take it (else null)\n",
    "  skipped                    selected, but no longer dead:\n",
    "    id                       the dead letter's id\n",
    "    state                    replayed or discarded (before, or while this ran)\n",
    "  missing                    ids given with --id that no dead letter has (exit 1)\n",
    "  refused                    dead letters the outbox cannot take, left dead (exit 1):\n",
    "    id                       the dead letter's id\n",
    "    why                      what is wrong with its destination or headers",
);

/// The `--help` of `dead-letters discard --json`: every field of [`DiscardJson`].
pub const DISCARD_JSON_HELP: &str = concat!(
    json_intro!(),
    "  now                        the database's clock when the discard began\n",
    "  dry_run                    true with --dry-run: the counts say what a discard would do\n",
    "  discarded                  how many dead letters were discarded (or would be)\n",
    "  skipped                    selected by --id, but not dead:\n",
    "    id                       the dead letter's id\n",
    "    state                    replayed or discarded\n",
    "  missing                    ids given with --id that no dead letter has (exit 1)",
);

/// `dead-letters summary --json`.
#[derive(Debug, Serialize)]
pub struct SummaryJson {
    /// The database's clock when the counts were taken.
    pub now: String,
    /// One entry per group, the largest first.
    pub groups: Vec<GroupJson>,
}

/// One group of `dead-letters summary --json`.
#[derive(Debug, Serialize)]
pub struct GroupJson {
    /// The group's 16 hex digits.
    pub group: String,
    /// The consumer that gave up on them.
    pub consumer: String,
    /// The handler's scope; null where unknown.
    pub scope: Option<String>,
    /// Why they gave up.
    pub reason: String,
    /// Their error's shape.
    pub error_shape: String,
    /// How many.
    pub count: u64,
    /// The earliest first failure.
    pub first_failed_at: String,
    /// The latest last failure.
    pub last_failed_at: String,
}

impl From<&DeadLetterGroup> for GroupJson {
    fn from(g: &DeadLetterGroup) -> Self {
        GroupJson {
            group: g.group.clone(),
            consumer: g.consumer.clone(),
            scope: g.scope.clone(),
            reason: g.reason.clone(),
            error_shape: g.shape.clone(),
            count: g.count,
            first_failed_at: rfc3339(g.first_failed_ms),
            last_failed_at: rfc3339(g.last_failed_ms),
        }
    }
}

/// One dead letter in `dead-letters list --json` and `show --json`.
#[derive(Debug, Serialize)]
pub struct DeadLetterJson {
    /// The row's id.
    pub id: i64,
    /// `dead`, `replayed` or `discarded`.
    pub state: &'static str,
    /// The consumer that gave up on it.
    pub consumer: String,
    /// The handler's scope; null where unknown.
    pub scope: Option<String>,
    /// The message's key; null where unknown.
    pub key: Option<KeyJson>,
    /// Why it gave up.
    pub reason: String,
    /// The last failure's error.
    pub error: String,
    /// Its group.
    pub group: String,
    /// The broker.
    pub broker: String,
    /// The queue, stream or topic.
    pub source: String,
    /// The broker's coordinates of the delivery.
    pub coordinates: String,
    /// Where a replay publishes it.
    pub destination: String,
    /// How many times it failed.
    pub attempts: u32,
    /// When it failed first.
    pub first_failed_at: String,
    /// When it failed last.
    pub last_failed_at: String,
    /// When it was replayed or discarded; null while dead.
    pub settled_at: Option<String>,
    /// The outbox message id of its replay.
    pub replayed_as: Option<String>,
}

impl From<&DeadLetterInfo> for DeadLetterJson {
    fn from(d: &DeadLetterInfo) -> Self {
        DeadLetterJson {
            id: d.id,
            state: d.state.as_str(),
            consumer: d.consumer.clone(),
            scope: d.scope.clone(),
            key: d.key.as_deref().map(KeyJson::of),
            reason: d.reason.clone(),
            error: d.error.clone(),
            group: d.group.clone(),
            broker: d.broker.clone(),
            source: d.source.clone(),
            coordinates: d.coordinates.clone(),
            destination: d.destination.clone(),
            attempts: d.attempts,
            first_failed_at: rfc3339(d.first_failed_ms),
            last_failed_at: rfc3339(d.last_failed_ms),
            settled_at: d.settled_ms.map(rfc3339),
            replayed_as: d.replayed_as.clone(),
        }
    }
}

/// `dead-letters list --json`.
#[derive(Debug, Serialize)]
pub struct ListJson {
    /// The database's clock when the list was taken.
    pub now: String,
    /// The last id listed when the page is full; null on the last page.
    pub next_after: Option<i64>,
    /// The page, in id order.
    pub dead_letters: Vec<DeadLetterJson>,
}

/// `dead-letters show --json`.
#[derive(Debug, Serialize)]
pub struct ShowJson {
    /// The database's clock when it was read.
    pub now: String,
    /// The dead letter.
    pub dead_letter: FullDeadLetterJson,
}

/// A dead letter with everything, in `dead-letters show --json`.
#[derive(Debug, Serialize)]
pub struct FullDeadLetterJson {
    /// What `list --json` shows.
    #[serde(flatten)]
    pub info: DeadLetterJson,
    /// Its error's shape.
    pub error_shape: String,
    /// The headers, in order.
    pub headers: Vec<[String; 2]>,
    /// The payload.
    pub payload: PayloadJson,
}

impl From<&DeadLetter> for FullDeadLetterJson {
    fn from(d: &DeadLetter) -> Self {
        FullDeadLetterJson {
            info: DeadLetterJson::from(&d.info),
            error_shape: d.shape.clone(),
            headers: d
                .headers
                .iter()
                .map(|(name, value)| [name.clone(), value.clone()])
                .collect(),
            payload: PayloadJson::of(&d.payload),
        }
    }
}

/// A payload in JSON.
#[derive(Debug, Serialize)]
pub struct PayloadJson {
    /// How many bytes.
    pub size: usize,
    /// `json`, `text` or `binary`.
    pub encoding: &'static str,
    /// The payload as text; null when binary.
    pub text: Option<String>,
    /// The bytes in standard base64.
    pub base64: String,
}

impl PayloadJson {
    /// The JSON of a payload.
    pub fn of(bytes: &[u8]) -> PayloadJson {
        let view = PayloadView::of(bytes);
        PayloadJson {
            size: bytes.len(),
            encoding: view.encoding(),
            text: std::str::from_utf8(bytes).ok().map(str::to_string),
            base64: base64(bytes),
        }
    }
}

/// `dead-letters replay --json`.
#[derive(Debug, Default, Serialize)]
pub struct ReplayJson {
    /// The database's clock when the replay began.
    pub now: String,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Replayed (or, in a dry run, to replay), in id order.
    pub replayed: Vec<ReplayedJson>,
    /// Selected but not dead.
    pub skipped: Vec<SkippedJson>,
    /// Ids that no dead letter has.
    pub missing: Vec<i64>,
    /// Dead letters the outbox cannot take.
    pub refused: Vec<RefusedJson>,
}

/// One replayed dead letter.
#[derive(Debug, Serialize)]
pub struct ReplayedJson {
    /// The dead letter's id.
    pub id: i64,
    /// The outbox message's id (`None` with `--to-consumer`).
    pub outbox_id: Option<String>,
    /// Where the relay publishes it.
    pub destination: String,
    /// With `--to-consumer`, the consumer whose parked retries take it.
    pub consumer: Option<String>,
}

/// A dead letter selected that was not dead.
#[derive(Debug, Serialize)]
pub struct SkippedJson {
    /// The dead letter's id.
    pub id: i64,
    /// `replayed` or `discarded`.
    pub state: &'static str,
}

/// A dead letter the outbox cannot take.
#[derive(Debug, Serialize)]
pub struct RefusedJson {
    /// The dead letter's id.
    pub id: i64,
    /// What is wrong.
    pub why: String,
}

/// `dead-letters discard --json`.
#[derive(Debug, Default, Serialize)]
pub struct DiscardJson {
    /// The database's clock when the discard began.
    pub now: String,
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// How many were discarded (or, in a dry run, would be).
    pub discarded: u64,
    /// Selected but not dead.
    pub skipped: Vec<SkippedJson>,
    /// Ids that no dead letter has.
    pub missing: Vec<i64>,
}

/// How a payload is shown: JSON re-indented (its keys in their order), UTF-8 text as it is,
/// other bytes in base64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadView {
    /// Valid JSON, pretty-printed.
    Json(String),
    /// UTF-8 that is not JSON.
    Text(String),
    /// Not UTF-8: standard base64.
    Binary(String),
}

impl PayloadView {
    /// The view of `bytes`.
    pub fn of(bytes: &[u8]) -> PayloadView {
        match std::str::from_utf8(bytes) {
            Ok(text) if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => {
                PayloadView::Json(pretty_json(text))
            }
            Ok(text) => PayloadView::Text(text.to_string()),
            Err(_) => PayloadView::Binary(base64(bytes)),
        }
    }

    /// `json`, `text` or `binary`.
    pub fn encoding(&self) -> &'static str {
        match self {
            PayloadView::Json(_) => "json",
            PayloadView::Text(_) => "text",
            PayloadView::Binary(_) => "binary",
        }
    }
}

/// Valid JSON `text` indented by two spaces a level, its members in their order (a
/// `serde_json::Value` would sort them): whitespace outside strings is dropped, then written.
pub fn pretty_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0_usize;
    let (mut in_string, mut escaped) = (false, false);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                while chars.peek().is_some_and(|c| c.is_whitespace()) {
                    chars.next();
                }
                if matches!(chars.peek(), Some('}' | ']')) {
                    out.extend(chars.next());
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

/// `bytes` in standard base64 (RFC 4648, with padding).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0_u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Writes one line of results to stdout. A reader that went away (`idem stats | head -1`) ends
/// the command quietly with exit 1, as the signal would in a C tool; any other error says so.
pub fn line(args: std::fmt::Arguments<'_>) -> Result<(), CliError> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{args}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::silent()),
        Err(err) => Err(CliError::failure(format!("cannot write the output: {err}"))),
    }
}

/// Pretty JSON text (serializing these types cannot fail).
pub fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem::Key;

    fn bytes(k: impl Key) -> Vec<u8> {
        let mut out = Vec::new();
        k.write_key(&mut out);
        out
    }

    #[test]
    fn keys_show_as_text_tuples_or_hex() {
        assert_eq!(KeyView::of(&bytes("evt-1")).to_string(), "evt-1");
        assert_eq!(KeyView::of(&bytes(42)).to_string(), "42");
        assert_eq!(KeyView::of(&bytes((7, "eu"))).to_string(), "(7, eu)");
        assert_eq!(
            KeyView::of(&bytes(("a", [0xff_u8]))),
            KeyView::Tuple(vec!["a".into(), "0xff".into()])
        );
        assert_eq!(KeyView::of(&bytes(("x",))).to_string(), "(x)");
        assert_eq!(KeyView::of(&[0xff, 0]).to_string(), "0xff00");
        // Length prefixes that do not use every byte exactly: not a tuple.
        assert_eq!(KeyView::of(b"\0\0\0\x05ab").to_string(), "0x000000056162");
        assert_eq!(KeyView::of(b"\0\0\0\0").to_string(), "0x00000000");
        assert!(matches!(
            KeyView::of(&bytes(("a", "b", "c", "d"))),
            KeyView::Tuple(p) if p.len() == 4
        ));
        let five = [bytes(("a", "b", "c", "d")), bytes(("e",))].concat();
        assert!(matches!(KeyView::of(&five), KeyView::Plain(_)));
    }

    #[test]
    fn key_json_has_parts_and_hex() {
        let key = KeyJson::of(&bytes((7, "eu")));
        assert_eq!(key.display, "(7, eu)");
        assert_eq!(key.parts, Some(vec!["7".into(), "eu".into()]));
        assert_eq!(key.hex, "0000000137000000026575");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_282_098_123), "2026-12-03T07:14:58.123Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(4_102_444_800_000), "2100-01-01T00:00:00.000Z");
    }

    #[test]
    fn ago_uses_two_units() {
        let now = 1_000_000_000_000;
        assert_eq!(ago(now, now - 400), "now");
        assert_eq!(ago(now, now - 5_000), "5s ago");
        assert_eq!(ago(now, now - 192_000), "3m 12s ago");
        assert_eq!(ago(now, now - 180_000), "3m ago");
        assert_eq!(ago(now, now - 7_500_000), "2h 5m ago");
        assert_eq!(ago(now, now - 3_600_000), "1h ago");
        assert_eq!(ago(now, now - 86_400_000 * 2), "2d ago");
        assert_eq!(ago(now, now + 86_400_000 * 7 - 3_600_000), "in 6d 23h");
        assert_eq!(
            when(now, now - 5_000),
            format!("{} (5s ago)", rfc3339(now - 5_000))
        );
    }

    #[test]
    fn json_payloads_are_indented_keeping_their_order() {
        assert_eq!(
            pretty_json(r#"{"b":1,"a":[1, {"x":"a,b:{c}"}],"e":{ },"f":[]}"#),
            "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    {\n      \"x\": \"a,b:{c}\"\n    }\n  ],\n  \"e\": {},\n  \"f\": []\n}"
        );
        assert_eq!(
            pretty_json(r#" {"q" : "say \"hi\", \\ ok"} "#),
            "{\n  \"q\": \"say \\\"hi\\\", \\\\ ok\"\n}"
        );
        assert_eq!(pretty_json("42"), "42");
        assert_eq!(pretty_json(r#""a b""#), r#""a b""#);
    }

    #[test]
    fn payloads_show_as_json_text_or_base64() {
        assert_eq!(
            PayloadView::of(br#"{"a":1}"#),
            PayloadView::Json("{\n  \"a\": 1\n}".into())
        );
        assert_eq!(
            PayloadView::of(b"order 17"),
            PayloadView::Text("order 17".into())
        );
        assert_eq!(
            PayloadView::of(&[0xff, 0, 1]),
            PayloadView::Binary("/wAB".into())
        );
        let json = PayloadJson::of(&[0xc3, 0x28]);
        assert_eq!(
            (json.size, json.encoding, json.text, json.base64.as_str()),
            (2, "binary", None, "wyg=")
        );
        let json = PayloadJson::of(b"[1]");
        assert_eq!((json.encoding, json.text.as_deref()), ("json", Some("[1]")));
    }

    #[test]
    fn base64_is_standard_with_padding() {
        for (bytes, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"foobar", "Zm9vYmFy"),
            (&[0xfb, 0xff, 0xbf], "+/+/"),
        ] {
            assert_eq!(base64(bytes), text, "{bytes:?}");
        }
    }

    #[test]
    fn states_follow_the_lease() {
        let mut record = RecordInfo {
            processed_ms: 0,
            expires_ms: 10,
            lease_until_ms: None,
        };
        assert_eq!(State::of(&record, 5), State::Done);
        record.lease_until_ms = Some(7);
        assert_eq!(State::of(&record, 5), State::InProgress);
        assert_eq!(State::of(&record, 8), State::LeaseLapsed);
        assert!(RecordJson::of(&record, 11).expired);
    }
}
