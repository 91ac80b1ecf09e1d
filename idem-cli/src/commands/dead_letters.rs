//! `idem dead-letters summary|list|show|replay|discard`: the deliveries consumers gave up on,
//! kept in `idem_dead_letters` (migration 4).

use std::collections::HashSet;

use idem::admin::{
    replay_id, DeadLetter, DeadLetterAdmin, DeadLetterFilter, DeadLetterInfo, DeadLetterState,
    Page, ReplayOutcome, ReplayTo,
};
use sqlx::Pool;

use crate::cli::{DeadLetterCommand, DeadLetterFilters, Selection, StateArg};
use crate::error::{one_line, CliError};
use crate::output::{
    json, rfc3339, when, DeadLetterJson, DiscardJson, FullDeadLetterJson, GroupJson, ListJson,
    PayloadView, RefusedJson, ReplayJson, ReplayedJson, ShowJson, SkippedJson, SummaryJson,
};
use crate::when::{self, Time};

/// Dead letters per statement when `replay` and `discard` go through a selection.
const PAGE: u64 = 500;

/// The longest error a `list` line shows, in characters (`show` prints it whole).
const LIST_ERROR_CHARS: usize = 160;

/// The times of a command's filters, parsed before connecting (bad usage needs no database).
#[derive(Debug, Clone, Copy, Default)]
pub struct Times {
    since: Option<Time>,
    until: Option<Time>,
}

/// Checks a command's arguments before connecting: its times, its group, and that `replay`
/// and `discard` select something.
pub fn check(command: &DeadLetterCommand) -> Result<Times, CliError> {
    let filters = match command {
        DeadLetterCommand::Summary { filters, .. } | DeadLetterCommand::List { filters, .. } => {
            filters
        }
        DeadLetterCommand::Show { .. } => return Ok(Times::default()),
        DeadLetterCommand::Replay { selection, .. } => {
            check_selection("replay", selection)?;
            &selection.filters
        }
        DeadLetterCommand::Discard { selection, .. } => {
            check_selection("discard", selection)?;
            &selection.filters
        }
    };
    if let Some(group) = &filters.group {
        if group.len() != 16 || !group.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CliError::usage(format!(
                "`{group}` is not a group: a group is the 16 hex digits `idem dead-letters summary` shows"
            )));
        }
    }
    let time = |option: &str, text: &Option<String>| {
        text.as_deref()
            .map(when::time)
            .transpose()
            .map_err(|err| CliError::usage(format!("{option}: {err}")))
    };
    Ok(Times {
        since: time("--since", &filters.since)?,
        until: time("--until", &filters.until)?,
    })
}

/// `replay` and `discard` change only what they are told to: ids, or filters, or `--all`.
fn check_selection(verb: &str, selection: &Selection) -> Result<(), CliError> {
    let by_id = !selection.ids.is_empty();
    let filtered = !selection.filters.is_empty();
    if selection.all && (by_id || filtered) {
        return Err(CliError::usage(
            "--all selects every open dead letter: give it alone, or selectors without it",
        ));
    }
    if by_id && filtered {
        return Err(CliError::usage(
            "--id selects dead letters by id: give it without --group, --scope, --reason, --source, --consumer, --since and --until",
        ));
    }
    if !selection.all && !by_id && !filtered {
        return Err(CliError::usage(format!(
            "{verb} needs a selector (--id, --group, --scope, --reason, --source, --consumer, --since, --until), or --all for every open dead letter"
        )));
    }
    Ok(())
}

/// Runs a `dead-letters` command, its arguments checked ([`check`]).
pub async fn run<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    command: DeadLetterCommand,
    times: Times,
) -> Result<(), CliError> {
    if !DB::dead_letters_present(pool).await? {
        return Err(CliError::failure(
            "this database's idem schema predates dead letters (no idem_dead_letters table): run `idem migrate`",
        ));
    }
    let now = DB::now_ms(pool).await?;
    let dead = Some(DeadLetterState::Dead);
    match command {
        DeadLetterCommand::Summary { filters, json } => {
            let filter = filter_of(&filters, dead, times, now);
            summary(pool, &filter, now, json).await
        }
        DeadLetterCommand::List {
            filters,
            state,
            after,
            limit,
            json,
        } => {
            let state = match state {
                StateArg::Dead => dead,
                StateArg::Replayed => Some(DeadLetterState::Replayed),
                StateArg::Discarded => Some(DeadLetterState::Discarded),
                StateArg::All => None,
            };
            let filter = filter_of(&filters, state, times, now);
            list(pool, &filter, Page { after, limit }, now, json).await
        }
        DeadLetterCommand::Show { id, json } => show(pool, id, now, json).await,
        DeadLetterCommand::Replay {
            selection,
            to_consumer,
            dry_run,
            json,
        } => {
            let mut filter = filter_of(&selection.filters, dead, times, now);
            filter.ids = distinct(&selection.ids);
            let to = if to_consumer {
                ReplayTo::Consumer
            } else {
                ReplayTo::Outbox
            };
            replay(pool, &filter, now, to, dry_run, json).await
        }
        DeadLetterCommand::Discard {
            selection,
            dry_run,
            json,
        } => {
            let mut filter = filter_of(&selection.filters, dead, times, now);
            filter.ids = distinct(&selection.ids);
            discard(pool, &filter, now, dry_run, json).await
        }
    }
}

/// The runtime's filter of the command line's, with `now` the database's clock.
fn filter_of(
    filters: &DeadLetterFilters,
    state: Option<DeadLetterState>,
    times: Times,
    now: i64,
) -> DeadLetterFilter {
    DeadLetterFilter {
        ids: Vec::new(),
        consumer: filters.consumer.clone(),
        scope: filters.scope.clone(),
        group: filters.group.as_deref().map(str::to_ascii_lowercase),
        reason: filters.reason.clone(),
        source: filters.source.clone(),
        state,
        since_ms: times.since.map(|t| t.resolve(now)),
        until_ms: times.until.map(|t| t.resolve(now)),
    }
}

/// `ids` without repeats, in their first order.
fn distinct(ids: &[i64]) -> Vec<i64> {
    let mut seen = HashSet::new();
    ids.iter().copied().filter(|id| seen.insert(*id)).collect()
}

/// "1 dead letter", "3 dead letters".
fn dead_letters(n: u64) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("{n} dead letter{s}")
}

/// A scope, or what stands for an unknown one.
fn scope_shown(scope: Option<&str>) -> &str {
    scope.unwrap_or("(no scope)")
}

/// A key, or what stands for an unknown one.
fn key_shown(key: Option<&[u8]>) -> String {
    key.map_or_else(|| "(no key)".to_string(), super::shown)
}

/// The open dead letters per group.
async fn summary<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    filter: &DeadLetterFilter,
    now: i64,
    as_json: bool,
) -> Result<(), CliError> {
    let groups = DB::groups(pool, filter).await?;
    if as_json {
        let out = SummaryJson {
            now: rfc3339(now),
            groups: groups.iter().map(GroupJson::from).collect(),
        };
        outln!("{}", json(&out));
        return Ok(());
    }
    if groups.is_empty() {
        if filter.is_everything() {
            outln!("no dead letters: nothing waits for an operator");
        } else {
            outln!("no open dead letter matches");
        }
        return Ok(());
    }
    for (i, g) in groups.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        outln!("{}  {}", g.group, dead_letters(g.count));
        outln!("  consumer    {}", g.consumer);
        outln!("  scope       {}", scope_shown(g.scope.as_deref()));
        outln!("  reason      {}", g.reason);
        outln!("  error       {}", g.shape);
        outln!("  first       {}", when(now, g.first_failed_ms));
        outln!("  last        {}", when(now, g.last_failed_ms));
    }
    let total: u64 = groups.iter().map(|g| g.count).sum();
    let s = if groups.len() == 1 { "" } else { "s" };
    outln!();
    outln!(
        "{} group{s}, {}; `idem dead-letters list --group GROUP` lists one group",
        groups.len(),
        dead_letters(total)
    );
    Ok(())
}

/// One page of dead letters.
async fn list<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    filter: &DeadLetterFilter,
    page: Page,
    now: i64,
    as_json: bool,
) -> Result<(), CliError> {
    let rows = DB::list(pool, filter, page).await?;
    let next_after = rows
        .last()
        .filter(|_| rows.len() as u64 == page.limit)
        .map(|d| d.id);
    if as_json {
        let out = ListJson {
            now: rfc3339(now),
            next_after,
            dead_letters: rows.iter().map(DeadLetterJson::from).collect(),
        };
        outln!("{}", json(&out));
        return Ok(());
    }
    if rows.is_empty() {
        let state = match filter.state {
            Some(DeadLetterState::Dead) => " open",
            Some(DeadLetterState::Replayed) => " replayed",
            Some(DeadLetterState::Discarded) => " discarded",
            None => "",
        };
        let after = if page.after.is_some() {
            " after that id"
        } else {
            ""
        };
        outln!("no{state} dead letter matches{after}");
        return Ok(());
    }
    for d in &rows {
        outln!("{}", list_line(d, now));
    }
    if let Some(last) = next_after {
        outln!("(the first {}; --after {last} lists the next)", page.limit);
    }
    Ok(())
}

/// A dead letter on one line: id, scope, key, reason, group, attempts, the last failure and
/// its error, and, once settled, how.
fn list_line(d: &DeadLetterInfo, now: i64) -> String {
    let s = if d.attempts == 1 { "" } else { "s" };
    let mut error = one_line(&d.error);
    if error.chars().count() > LIST_ERROR_CHARS {
        error = error.chars().take(LIST_ERROR_CHARS - 1).collect();
        error.push('…');
    }
    let mut line = format!(
        "{}  {}  {}  {}  {}  {} attempt{s}, the last {}: {error}",
        d.id,
        scope_shown(d.scope.as_deref()),
        key_shown(d.key.as_deref()),
        d.reason,
        d.group,
        d.attempts,
        when(now, d.last_failed_ms),
    );
    if d.state != DeadLetterState::Dead {
        line.push_str(&format!("  [{}", d.state));
        if let Some(settled) = d.settled_ms {
            line.push_str(&format!(" {}", when(now, settled)));
        }
        if let Some(outbox_id) = &d.replayed_as {
            line.push_str(&format!(" as {outbox_id}"));
        }
        line.push(']');
    }
    line
}

/// One dead letter, whole.
async fn show<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    id: i64,
    now: i64,
    as_json: bool,
) -> Result<(), CliError> {
    let Some(dead) = DB::dead_letter(pool, id).await? else {
        return Err(CliError::failure(format!(
            "no dead letter has id {id}: never written, or purged (`idem dead-letters list` lists them)"
        )));
    };
    if as_json {
        let out = ShowJson {
            now: rfc3339(now),
            dead_letter: FullDeadLetterJson::from(&dead),
        };
        outln!("{}", json(&out));
        return Ok(());
    }
    for line in show_lines(&dead, now) {
        outln!("{line}");
    }
    Ok(())
}

/// The lines `show` prints.
fn show_lines(dead: &DeadLetter, now: i64) -> Vec<String> {
    let d = &dead.info;
    let field = |label: &str, value: &str| format!("{label:<13}{value}");
    let mut lines = vec![
        field("id", &d.id.to_string()),
        field("state", d.state.as_str()),
        field("consumer", &d.consumer),
        field("scope", scope_shown(d.scope.as_deref())),
        field("key", &key_shown(d.key.as_deref())),
        field("reason", &d.reason),
        // A message of several lines keeps them, indented under its first.
        field(
            "error",
            &d.error.trim_end().replace('\n', "\n             "),
        ),
        field("group", &format!("{} ({})", d.group, dead.shape)),
        field("broker", &d.broker),
        field("source", &d.source),
        field("coordinates", &d.coordinates),
        field("destination", &d.destination),
        field("attempts", &d.attempts.to_string()),
        field("first failed", &when(now, d.first_failed_ms)),
        field("last failed", &when(now, d.last_failed_ms)),
    ];
    if let Some(settled) = d.settled_ms {
        lines.push(field("settled", &when(now, settled)));
    }
    if let Some(outbox_id) = &d.replayed_as {
        lines.push(field("replayed as", outbox_id));
    }
    if dead.headers.is_empty() {
        lines.push(field("headers", "none"));
    } else {
        lines.push(field("headers", &dead.headers.len().to_string()));
        for (name, value) in &dead.headers {
            lines.push(format!("  {name}: {value}"));
        }
    }
    let size = dead.payload.len();
    let s = if size == 1 { "" } else { "s" };
    match PayloadView::of(&dead.payload) {
        PayloadView::Json(pretty) => {
            lines.push(field("payload", &format!("JSON, {size} byte{s}")));
            lines.extend(pretty.lines().map(str::to_string));
        }
        PayloadView::Text(text) => {
            lines.push(field("payload", &format!("text, {size} byte{s}")));
            lines.extend(text.lines().map(str::to_string));
        }
        PayloadView::Binary(base64) => {
            lines.push(field(
                "payload",
                &format!("{size} byte{s}, not UTF-8, in base64 (`base64 -d` decodes it)"),
            ));
            let bytes = base64.as_bytes();
            lines.extend(
                bytes
                    .chunks(76)
                    .map(|line| String::from_utf8_lossy(line).into_owned()),
            );
        }
    }
    lines
}

/// The dead letters that a filter selects, a page at a time: the next page starts after the
/// last id of the one before, so a page may be settled before the next is read.
struct Pages<'a, DB: DeadLetterAdmin> {
    pool: &'a Pool<DB>,
    filter: &'a DeadLetterFilter,
    after: Option<i64>,
    done: bool,
    /// Every id of the pages so far.
    seen: HashSet<i64>,
}

impl<'a, DB: DeadLetterAdmin> Pages<'a, DB> {
    fn new(pool: &'a Pool<DB>, filter: &'a DeadLetterFilter) -> Self {
        Pages {
            pool,
            filter,
            after: None,
            done: false,
            seen: HashSet::new(),
        }
    }

    /// The next page, or `None` after the last.
    async fn next(&mut self) -> Result<Option<Vec<DeadLetterInfo>>, CliError> {
        if self.done {
            return Ok(None);
        }
        let page = Page {
            after: self.after,
            limit: PAGE,
        };
        let rows = DB::list(self.pool, self.filter, page).await?;
        self.done = (rows.len() as u64) < PAGE;
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        self.after = Some(last.id);
        self.seen.extend(rows.iter().map(|d| d.id));
        Ok(Some(rows))
    }
}

/// The ids given with `--id` that the selection did not see: not dead (with their state), or
/// missing.
async fn unselected<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    ids: &[i64],
    seen: &HashSet<i64>,
) -> Result<(Vec<SkippedJson>, Vec<i64>), CliError> {
    let rest: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !seen.contains(id))
        .collect();
    if rest.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let filter = DeadLetterFilter {
        ids: rest.clone(),
        state: None,
        ..DeadLetterFilter::default()
    };
    let page = Page {
        after: None,
        limit: rest.len() as u64,
    };
    let found = DB::list(pool, &filter, page).await?;
    let skipped = found
        .iter()
        .map(|d| SkippedJson {
            id: d.id,
            state: d.state.as_str(),
        })
        .collect();
    let found: HashSet<i64> = found.iter().map(|d| d.id).collect();
    let missing = rest.into_iter().filter(|id| !found.contains(id)).collect();
    Ok((skipped, missing))
}

/// Replays what `filter` selects (or says what a replay would do).
async fn replay<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    filter: &DeadLetterFilter,
    now: i64,
    to: ReplayTo,
    dry_run: bool,
    as_json: bool,
) -> Result<(), CliError> {
    let to_consumer = to == ReplayTo::Consumer;
    let mut report = ReplayJson {
        now: rfc3339(now),
        dry_run,
        ..ReplayJson::default()
    };
    let mut planned = Vec::new();
    let mut pages = Pages::new(pool, filter);
    while let Some(page) = pages.next().await? {
        if dry_run {
            for d in page {
                report.replayed.push(ReplayedJson {
                    id: d.id,
                    outbox_id: (!to_consumer).then(|| replay_id(d.id, d.replayed_as.as_deref())),
                    destination: d.destination.clone(),
                    consumer: to_consumer.then(|| d.consumer.clone()),
                });
                planned.push(d);
            }
            continue;
        }
        let ids: Vec<i64> = page.iter().map(|d| d.id).collect();
        let destinations: std::collections::HashMap<i64, String> =
            page.iter().map(|d| (d.id, d.destination.clone())).collect();
        for done in DB::replay_to(pool, &ids, to).await? {
            match done.outcome {
                ReplayOutcome::Replayed {
                    outbox_id,
                    destination,
                } => report.replayed.push(ReplayedJson {
                    id: done.id,
                    outbox_id: Some(outbox_id),
                    destination,
                    consumer: None,
                }),
                ReplayOutcome::Parked { consumer } => report.replayed.push(ReplayedJson {
                    id: done.id,
                    outbox_id: None,
                    destination: destinations.get(&done.id).cloned().unwrap_or_default(),
                    consumer: Some(consumer),
                }),
                ReplayOutcome::NotDead(state) => report.skipped.push(SkippedJson {
                    id: done.id,
                    state: state.as_str(),
                }),
                ReplayOutcome::Missing => report.missing.push(done.id),
                ReplayOutcome::Refused(why) => {
                    report.refused.push(RefusedJson { id: done.id, why })
                }
            }
        }
    }
    let seen = pages.seen;
    let (skipped, missing) = unselected(pool, &filter.ids, &seen).await?;
    report.skipped.extend(skipped);
    report.missing.extend(missing);

    if as_json {
        outln!("{}", json(&report));
    } else {
        let n = report.replayed.len() as u64;
        if dry_run {
            if n > 0 {
                outln!("would replay {}:", dead_letters(n));
            }
            for (d, r) in planned.iter().zip(&report.replayed) {
                let to = match (&r.outbox_id, &r.consumer) {
                    (Some(id), _) => format!("to {} as {id}", r.destination),
                    (None, consumer) => {
                        format!("to consumer {}", consumer.as_deref().unwrap_or_default())
                    }
                };
                outln!(
                    "  {}  {}  {}  {to}",
                    d.id,
                    scope_shown(d.scope.as_deref()),
                    key_shown(d.key.as_deref()),
                );
            }
        } else if n > 0 && to_consumer {
            let each = if n == 1 { "it" } else { "each" };
            outln!(
                "replayed {}: {each} is a parked retry of its consumer now, due at once (a consumer with durable retries runs it)",
                dead_letters(n)
            );
        } else if n > 0 {
            let each = if n == 1 { "it" } else { "each" };
            outln!(
                "replayed {}: {each} is an outbox message now, which the relay publishes to its destination (`idem outbox` shows them)",
                dead_letters(n)
            );
        }
        let nothing = report.skipped.is_empty() && report.missing.is_empty();
        if n == 0 && nothing && report.refused.is_empty() {
            outln!("no open dead letter matches: nothing to replay");
        }
        report_unselected(&report.skipped, &report.missing)?;
        for r in &report.refused {
            outln!("refused {}: {} (it stays dead)", r.id, r.why);
        }
        if dry_run {
            outln!("(a dry run: nothing was changed)");
        }
    }
    let failed = report.missing.len() + report.refused.len();
    if failed > 0 {
        return Err(CliError::failure(format!(
            "{failed} of the selected dead letters {} not replayed: {} missing, {} refused",
            if failed == 1 { "was" } else { "were" },
            report.missing.len(),
            report.refused.len()
        )));
    }
    Ok(())
}

/// The lines of ids selected but not dead, and of ids that no dead letter has.
fn report_unselected(skipped: &[SkippedJson], missing: &[i64]) -> Result<(), CliError> {
    for s in skipped {
        outln!("skipped {}: it is {}, not dead", s.id, s.state);
    }
    for id in missing {
        outln!("no dead letter has id {id}");
    }
    Ok(())
}

/// Discards what `filter` selects (or says what a discard would do).
async fn discard<DB: DeadLetterAdmin>(
    pool: &Pool<DB>,
    filter: &DeadLetterFilter,
    now: i64,
    dry_run: bool,
    as_json: bool,
) -> Result<(), CliError> {
    let mut report = DiscardJson {
        now: rfc3339(now),
        dry_run,
        ..DiscardJson::default()
    };
    let mut planned = Vec::new();
    let mut pages = Pages::new(pool, filter);
    while let Some(page) = pages.next().await? {
        if dry_run {
            report.discarded += page.len() as u64;
            planned.extend(page);
        } else {
            let ids: Vec<i64> = page.iter().map(|d| d.id).collect();
            report.discarded += DB::discard(pool, &ids).await?;
        }
    }
    let seen = pages.seen;
    let (skipped, missing) = unselected(pool, &filter.ids, &seen).await?;
    report.skipped = skipped;
    report.missing = missing;

    if as_json {
        outln!("{}", json(&report));
    } else {
        let n = report.discarded;
        if dry_run && n > 0 {
            outln!("would discard {}:", dead_letters(n));
            for d in &planned {
                outln!(
                    "  {}  {}  {}  {}: {}",
                    d.id,
                    scope_shown(d.scope.as_deref()),
                    key_shown(d.key.as_deref()),
                    d.reason,
                    one_line(&d.error)
                );
            }
        } else if n > 0 {
            let (they, them) = if n == 1 {
                ("it stays", "it")
            } else {
                ("they stay", "them")
            };
            outln!(
                "discarded {}: {they}, discarded, until `idem purge` removes {them} after the retention",
                dead_letters(n)
            );
        }
        if n == 0 && report.skipped.is_empty() && report.missing.is_empty() {
            outln!("no open dead letter matches: nothing to discard");
        }
        report_unselected(&report.skipped, &report.missing)?;
        if dry_run {
            outln!("(a dry run: nothing was changed)");
        }
    }
    if !report.missing.is_empty() {
        return Err(CliError::failure(format!(
            "{} of the selected dead letters {} not found",
            report.missing.len(),
            if report.missing.len() == 1 {
                "was"
            } else {
                "were"
            }
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn checked(args: &[&str]) -> Result<Times, CliError> {
        let cli = Cli::try_parse_from([&["idem", "dead-letters"], args].concat()).unwrap();
        match cli.command {
            crate::cli::Command::DeadLetters(command) => check(&command),
            other => panic!("{other:?}"),
        }
    }

    fn usage(args: &[&str]) -> String {
        let err = checked(args).unwrap_err();
        assert_eq!(err.code(), crate::error::USAGE, "{args:?}");
        err.message().to_string()
    }

    #[test]
    fn replay_and_discard_need_a_selector_or_all() {
        for verb in ["replay", "discard"] {
            assert!(usage(&[verb]).contains("needs a selector"));
            assert!(usage(&[verb, "--dry-run"]).contains("--all for every"));
            assert!(usage(&[verb, "--all", "--scope", "s"]).contains("give it alone"));
            assert!(usage(&[verb, "--id", "3", "--scope", "s"]).contains("without --group"));
            assert!(checked(&[verb, "--all"]).is_ok());
            assert!(checked(&[verb, "--id", "3", "--id", "4"]).is_ok());
            assert!(checked(&[verb, "--reason", "poisoned"]).is_ok());
        }
        assert!(checked(&["summary"]).is_ok());
        assert!(checked(&["list"]).is_ok());
    }

    #[test]
    fn groups_and_times_are_checked_before_connecting() {
        assert!(usage(&["summary", "--group", "abc"]).contains("16 hex digits"));
        assert!(checked(&["list", "--group", "0123456789ABCDEF"]).is_ok());
        let err = usage(&["list", "--since", "yesterday"]);
        assert!(
            err.starts_with("--since: `yesterday` is not a time"),
            "{err}"
        );
        let times = checked(&["list", "--since", "2h", "--until", "1970-01-01T00:00:01Z"]).unwrap();
        assert_eq!(times.since.map(|t| t.resolve(10_000_000)), Some(2_800_000));
        assert_eq!(times.until, Some(Time::At(1_000)));
    }

    #[test]
    fn repeated_ids_are_selected_once() {
        assert_eq!(distinct(&[3, 1, 3, 2, 1]), vec![3, 1, 2]);
    }

    fn info(id: i64) -> DeadLetterInfo {
        DeadLetterInfo {
            id,
            consumer: "orders".into(),
            scope: Some("billing::on_paid".into()),
            key: Some(b"evt-3".to_vec()),
            reason: "poisoned".into(),
            error: "order 17 not found".into(),
            group: "0123456789abcdef".into(),
            broker: "rabbitmq".into(),
            source: "orders".into(),
            coordinates: "delivery tag 5".into(),
            destination: "orders".into(),
            attempts: 5,
            first_failed_ms: 0,
            last_failed_ms: 1_000,
            state: DeadLetterState::Dead,
            settled_ms: None,
            replayed_as: None,
        }
    }

    #[test]
    fn a_list_line_says_what_failed_and_how_it_was_settled() {
        let now = 61_000;
        assert_eq!(
            list_line(&info(7), now),
            "7  billing::on_paid  evt-3  poisoned  0123456789abcdef  5 attempts, the last \
             1970-01-01T00:00:01.000Z (1m ago): order 17 not found"
        );
        let mut settled = info(8);
        settled.scope = None;
        settled.key = None;
        settled.attempts = 1;
        settled.error = format!("a\nb {}", "x".repeat(300));
        settled.state = DeadLetterState::Replayed;
        settled.settled_ms = Some(now);
        settled.replayed_as = Some("idem-0f".into());
        let line = list_line(&settled, now);
        assert!(
            line.starts_with("8  (no scope)  (no key)  poisoned  0123456789abcdef  1 attempt, "),
            "{line}"
        );
        assert!(
            line.contains(": a b xxx") && line.contains("x…  [replayed "),
            "{line}"
        );
        assert!(
            line.ends_with("1970-01-01T00:01:01.000Z (now) as idem-0f]"),
            "{line}"
        );
    }

    #[test]
    fn show_prints_json_text_and_bytes_each_its_way() {
        let dead = |payload: &[u8]| DeadLetter {
            info: info(7),
            shape: "order # not found".into(),
            payload: payload.to_vec(),
            headers: vec![("trace-id".into(), "t-1".into())],
        };
        let lines = show_lines(&dead(br#"{"order":17,"items":[1,2]}"#), 61_000);
        let text = lines.join("\n");
        assert!(
            text.starts_with("id           7\nstate        dead\n"),
            "{text}"
        );
        assert!(
            text.contains("group        0123456789abcdef (order # not found)\n"),
            "{text}"
        );
        assert!(
            text.contains("first failed 1970-01-01T00:00:00.000Z (1m 1s ago)\n"),
            "{text}"
        );
        assert!(
            text.contains("headers      1\n  trace-id: t-1\npayload      JSON, 26 bytes\n{\n  \"order\": 17,\n  \"items\": [\n    1,\n    2\n  ]\n}"),
            "{text}"
        );
        let lines = show_lines(&dead(b"plain words"), 0);
        assert_eq!(
            lines[lines.len() - 2..],
            ["payload      text, 11 bytes", "plain words"]
        );
        let lines = show_lines(&dead(&[0xff, 0x00, 0x01]), 0);
        assert_eq!(
            lines[lines.len() - 2..],
            [
                "payload      3 bytes, not UTF-8, in base64 (`base64 -d` decodes it)",
                "/wAB"
            ]
        );
    }
}
