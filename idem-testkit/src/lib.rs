//! The conformance suite of [idem](https://docs.rs/idem): every behaviour test of idem, run on a
//! backend from one macro invocation, so a new [`Store`](idem::store::Store) (yours, or idem's
//! own SQLite and PostgreSQL) is checked rule by rule.
//!
//! ```ignore
//! // tests/conformance.rs of a crate with a backend
//! idem_testkit::suite!(my_crate::MyBackend);
//! ```
//!
//! This emits one `#[test]` per rule, named `capability__rule` (`store__insert_record_is_new_once`,
//! `claim__second_delivery_is_duplicate`, `lease__error_releases_the_lease`, …), so a failure
//! names one rule and `cargo test store__` runs one capability. The store rules come first: each
//! calls one [`Store`](idem::store::Store) method directly, so a new backend's first failure
//! points at one method. The bodies are public async fns in [`rules`], generic over the
//! [`Backend`] (`idem_testkit::rules::claim::second_delivery_is_duplicate::<B>()`), each documented
//! by the rule it checks.
//!
//! The capabilities, in the order the tests are emitted: `store` (each `Store` method alone),
//! `claim` (key only), `versions` (key + version), `entity` (key + version + entity),
//! `savepoints` (inside a caller's transaction), `scopes`, `concurrency`, `batch`, `lease` (and
//! `Context`), `pause` (a lease holder paused past its lease), `lease_versions` (lease mode with
//! `version`), `replay`, `fingerprint`, `attempts`
//! (the handler options, on every path), `retention`, `bad_input`, `props` (random streams against an exactly-once oracle;
//! `PROPTEST_CASES`, default 32, and `IDEM_PROPTEST_SEED` to replay), `spans`, `recovery`
//! (parked retries and dead letters, [`RecoveryStore`](idem::recover::RecoveryStore)). Every
//! rule asserts the database's state, not only what a handler returned. With this crate's feature `metrics`, the
//! suite ends with `metrics__counts_equal_the_outcomes` (a test recorder of the `metrics` facade).
//! Last come the `admin` rules: the operator's queries of the `idem` command line
//! ([`Admin`](idem::admin::Admin)), and the `gauges` rules: the queries behind `idem::gauges`
//! (the outbox's backlog, parked retries and dead letters per consumer; they need the `admin`
//! capability, with [`OutboxAdmin`](idem::admin::OutboxAdmin), and `recovery`, with
//! [`DeadLetterAdmin`](idem::admin::DeadLetterAdmin)). With the feature `metrics`,
//! `metrics__gauges_…` checks that the gauges publish them.
//!
//! Each test is a plain `#[test]` that runs its rule on a multi-threaded tokio runtime of its own
//! (4 workers), as `#[tokio::test(flavor = "multi_thread")]` would, so the calling crate needs
//! neither tokio nor any `use` line; the expansion names everything through `$crate::`. To run
//! the suite on two backends in one file, invoke it in two modules.
//!
//! A backend implements [`Backend`]: its database type, a setup that opens a fresh migrated
//! database of its own (or skips, saying why), a teardown, and the [`Dialect`] of the suite's
//! business tables. Features `sqlite` and `postgres` give ready ones in [`backends`].
//!
//! **Capabilities.** Only the core contract, [`Store`](idem::store::Store), is required of a
//! backend; each handler option needs a capability more: `leases`
//! ([`Leases`](idem::store::Leases), `mode = "lease"`), `stamps` ([`Stamps`](idem::store::Stamps),
//! `fingerprint` and `replay`), `attempts` ([`Attempts`](idem::store::Attempts), `max_attempts`),
//! the operator's queries, `admin` ([`Admin`](idem::admin::Admin)), and parked retries and
//! dead letters, `recovery` ([`RecoveryStore`](idem::recover::RecoveryStore)). `suite!(MyBackend)`
//! runs the rules of all of them; a backend that lacks some names them,
//! `suite!(MyBackend; without(leases, stamps))`, and their rules are emitted as ignored tests
//! whose reason names the trait (`the backend does not implement idem::store::Stamps`): they
//! show as ignored, never as passed, and they do not name the backend, so they need not compile
//! against it. A rule that needs two capabilities (`fingerprint__conflict_in_lease_mode`) runs
//! only when the backend has both.
//!
//! **Brokers.** With the feature `broker` (and `postgres` for the rules on PostgreSQL),
//! `broker_suite!` does the same for a broker adapter (`idem::consume::Source`), against its
//! real server: exactly once under duplicates and reordering, settle only after commit (a
//! consumer SIGKILLed between the two), poison and undecodable messages dead-lettered with the
//! reason, a graceful shutdown that drains, SIGKILL and restart losing nothing,
//! `max_deliveries`, and the outbox publisher (`broker::rules`). A new adapter's crate
//! implements `broker::Broker` once in `tests/conformance.rs`: how to make one rule's input
//! (a queue, a stream, a topic, with its dead-letter place) and delete it, publish into it,
//! connect the adapter's `Source` and `OutboxPublisher` to it, and read back its dead letters,
//! what is left unsettled and what the outbox delivered. Then
//! `idem_testkit::broker_suite!(MyBroker);` emits the rules, and
//! `broker_suite!(MyBroker; without(max_deliveries = "why"))` marks what the broker cannot do
//! (those rules show as ignored, with the reason). `cargo test --test conformance` runs them;
//! each is a test named `capability__rule` (the module `broker` says more).
//!
//! **Stability**: this crate is not a stable API; breaking changes may come in any release,
//! including patch releases. Pin it with `=` if you depend on it.
#![warn(missing_docs)]

mod backend;
pub mod backends;
#[cfg(feature = "broker")]
pub mod broker;
pub mod dialect;
pub mod fixtures;
pub mod options;
pub mod outbox;
pub mod rules;
#[cfg(feature = "servers")]
pub mod servers;

pub use backend::{exec, fetch, Backend, BoxFuture, Kit, KitDb, Ty, Value};
pub use dialect::Dialect;

/// What [`suite!`] expands to. Not public API.
#[doc(hidden)]
pub mod __private {
    /// Runs one rule on a multi-threaded runtime with 4 workers (the concurrency rules need
    /// them), as `#[tokio::test(flavor = "multi_thread")]` would, without the caller depending
    /// on tokio.
    pub fn run(rule: impl std::future::Future<Output = ()>) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(rule)
    }
}

/// Emits one test per rule of the suite for a [`Backend`]: `idem_testkit::suite!(MyBackend);`
/// at the top level (or in a module) of an integration test file. Needs no `use` lines.
///
/// A backend whose database lacks a capability says so, and the rules that need it are emitted
/// as ignored tests that give the reason (`cargo test` lists them as ignored, never as passed),
/// without naming the backend, so they need not compile against it:
///
/// ```ignore
/// idem_testkit::suite!(MyBackend);                           // every capability
/// idem_testkit::suite!(MyBackend; without(leases, stamps));  // no lease mode, no fingerprint/replay
/// ```
///
/// The capabilities: `leases` ([`Leases`](idem::store::Leases), `mode = "lease"`), `stamps`
/// ([`Stamps`](idem::store::Stamps), `fingerprint` and `replay`), `attempts`
/// ([`Attempts`](idem::store::Attempts), `max_attempts`), `admin` (the operator's queries,
/// [`Admin`](idem::admin::Admin)) and `recovery` (parked retries and dead letters,
/// [`RecoveryStore`](idem::recover::RecoveryStore)). `suite!(MyBackend; without_admin)` is
/// `suite!(MyBackend; without(admin))`.
///
/// A backend on a server that may be absent names a cfg of the calling crate, set when the server
/// is absent, and a reason: every rule that would run is then ignored with that reason (shown by
/// `cargo test`, never reported as passed; `--ignored` runs them). A build script of that crate
/// sets and declares the cfg, say when the server's environment variable is unset (idem's own
/// crates set `idem_no_postgres`, `idem_no_mysql`, … so, unless `CI` is set):
///
/// ```ignore
/// idem_testkit::suite!(MyBackend; absent(no_my_server = "set MY_SERVER_URL to run"));
/// idem_testkit::suite!(MyBackend; without(admin); absent(no_my_server = "set MY_SERVER_URL"));
/// ```
#[macro_export]
macro_rules! suite {
    ($backend:ty) => {
        $crate::suite!($backend; without());
    };
    ($backend:ty; without_admin) => {
        $crate::suite!($backend; without(admin));
    };
    ($backend:ty; absent($absent:ident = $why:literal)) => {
        $crate::suite!($backend; without(); absent($absent = $why));
    };
    ($backend:ty; without($($lacks:ident),* $(,)?) $(; absent($absent:ident = $why:literal))?) => {
        $crate::__capabilities! { $($lacks)* }
        $crate::__rules! { $backend; [$($lacks)*]; [$($absent = $why)?];
            [] store__insert_record_is_new_once => store::insert_record_is_new_once,
            [] store__insert_records_marks_a_repeated_key_new_once => store::insert_records_marks_a_repeated_key_new_once,
            [stamps] store__inserts_write_the_fingerprint_of_a_new_record => store::inserts_write_the_fingerprint_of_a_new_record,
            [stamps] store__insert_record_or_read_stamp_gives_a_duplicate_its_stamp => store::insert_record_or_read_stamp_gives_a_duplicate_its_stamp,
            [stamps] store__insert_records_reading_stamps_claims_and_never_reads_a_wrong_stamp => store::insert_records_reading_stamps_claims_and_never_reads_a_wrong_stamp,
            [stamps] store__save_stamps_writes_each_stamp_on_its_row => store::save_stamps_writes_each_stamp_on_its_row,
            [] store__delete_record_removes_only_that_record => store::delete_record_removes_only_that_record,
            [] store__advance_version_advances_a_new_entity_and_a_greater_version => store::advance_version_advances_a_new_entity_and_a_greater_version,
            [] store__advance_version_reports_equal => store::advance_version_reports_equal,
            [] store__advance_version_reports_behind_with_the_latest => store::advance_version_reports_behind_with_the_latest,
            [] store__record_and_advance_on_a_new_key_records_and_advances => store::record_and_advance_on_a_new_key_records_and_advances,
            [] store__record_and_advance_on_a_seen_key_is_none_and_leaves_the_version => store::record_and_advance_on_a_seen_key_is_none_and_leaves_the_version,
            [] store__advance_versions_decides_as_if_one_after_another => store::advance_versions_decides_as_if_one_after_another,
            [] store__purge_expired_is_bounded_by_its_limit => store::purge_expired_is_bounded_by_its_limit,
            [leases] store__purge_expired_skips_live_leases => store::purge_expired_skips_live_leases,
            [] store__purge_versions_removes_only_old_rows => store::purge_versions_removes_only_old_rows,
            [leases] store__claim_lease_acquires_a_new_message => store::claim_lease_acquires_a_new_message,
            [leases] store__claim_lease_on_a_held_lease_is_in_progress => store::claim_lease_on_a_held_lease_is_in_progress,
            [leases] store__claim_lease_on_a_done_message_is_done => store::claim_lease_on_a_done_message_is_done,
            [leases] store__claim_lease_takes_over_an_expired_lease => store::claim_lease_takes_over_an_expired_lease,
            [leases] store__complete_lease_with_the_right_token_marks_done => store::complete_lease_with_the_right_token_marks_done,
            [leases] store__complete_lease_with_a_wrong_token_changes_nothing => store::complete_lease_with_a_wrong_token_changes_nothing,
            [leases] store__release_lease_deletes_the_in_progress_record => store::release_lease_deletes_the_in_progress_record,
            [] store__migrate_twice_is_harmless => store::migrate_twice_is_harmless,
            [] store__migrate_concurrently_is_safe => store::migrate_concurrently_is_safe,
            [] store__is_transient_is_false_for_errors_that_repeat => store::is_transient_is_false_for_errors_that_repeat,
            [] claim__first_delivery_applies => claim::first_delivery_applies,
            [] claim__second_delivery_is_duplicate => claim::second_delivery_is_duplicate,
            [] claim__handler_error_rolls_back_and_the_redelivery_applies => claim::handler_error_rolls_back_and_the_redelivery_applies,
            [] claim__handler_panic_rolls_back_and_the_redelivery_applies => claim::handler_panic_rolls_back_and_the_redelivery_applies,
            [] versions__greater_version_applies => versions::greater_version_applies,
            [] versions__equal_version_is_duplicate => versions::equal_version_is_duplicate,
            [] versions__lower_version_is_stale => versions::lower_version_is_stale,
            [] entity__seen_key_is_duplicate => entity::seen_key_is_duplicate,
            [] entity__version_not_above_the_entitys_is_stale => entity::version_not_above_the_entitys_is_stale,
            [] entity__entities_are_ordered_independently => entity::entities_are_ordered_independently,
            [] savepoints__callers_rollback_leaves_nothing => savepoints::callers_rollback_leaves_nothing,
            [] savepoints__callers_commit_keeps_all_but_the_failed_handler => savepoints::callers_commit_keeps_all_but_the_failed_handler,
            [] scopes__two_scopes_each_handle_the_message_once => scopes::two_scopes_each_handle_the_message_once,
            [] concurrency__concurrent_deliveries_apply_each_message_exactly_once => concurrency::concurrent_deliveries_apply_each_message_exactly_once,
            [] concurrency__racing_versions_end_in_the_newest_state => concurrency::racing_versions_end_in_the_newest_state,
            [] batch__applies_each_message_once_in_one_transaction => batch::applies_each_message_once_in_one_transaction,
            [] batch__failing_message_splits_the_batch => batch::failing_message_splits_the_batch,
            [] batch__stale_and_duplicate_inside_a_batch_leave_no_trace => batch::stale_and_duplicate_inside_a_batch_leave_no_trace,
            [] batch__a_stale_message_twice_in_a_batch_is_stale_twice => batch::a_stale_message_twice_in_a_batch_is_stale_twice,
            [] batch__two_handlers_of_one_message_each_run_once => batch::two_handlers_of_one_message_each_run_once,
            [] batch__closure_branching_on_an_outcome_loses_nothing => batch::closure_branching_on_an_outcome_loses_nothing,
            [] batch__versions_decide_as_if_one_after_another => batch::versions_decide_as_if_one_after_another,
            [] batch__concurrent_batches_end_in_the_newest_state => batch::concurrent_batches_end_in_the_newest_state,
            [leases] lease__applies_once_and_marks_the_message_done => lease::applies_once_and_marks_the_message_done,
            [leases] lease__delivery_while_in_progress_runs_nothing => lease::delivery_while_in_progress_runs_nothing,
            [leases] lease__error_releases_the_lease => lease::error_releases_the_lease,
            [leases] lease__crash_leaves_the_lease_to_expire => lease::crash_leaves_the_lease_to_expire,
            [leases] lease__racing_workers_run_the_message_once => lease::racing_workers_run_the_message_once,
            [leases] lease__expired_lease_is_taken_over_and_the_slow_one_undone => lease::expired_lease_is_taken_over_and_the_slow_one_undone,
            [] lease__context_derives_the_same_key_every_time => lease::context_derives_the_same_key_every_time,
            [leases] pause__lease_holder_paused_past_its_lease_cannot_commit_over_the_new_holder => pause::lease_holder_paused_past_its_lease_cannot_commit_over_the_new_holder,
            [leases] lease_versions__key_version_decides_under_the_lease => lease_versions::key_version_decides_under_the_lease,
            [leases] lease_versions__entity_version_decides_under_the_lease => lease_versions::entity_version_decides_under_the_lease,
            [leases] lease_versions__failed_body_leaves_the_version => lease_versions::failed_body_leaves_the_version,
            [leases] lease_versions__version_advances_only_when_the_body_commits => lease_versions::version_advances_only_when_the_body_commits,
            [leases] lease_versions__racing_versions_end_in_the_newest_state => lease_versions::racing_versions_end_in_the_newest_state,
            [stamps] replay__replayed_on_a_pool => replay::replayed_on_a_pool,
            [stamps] replay__replayed_after_waiting_for_the_first => replay::replayed_after_waiting_for_the_first,
            [stamps] replay__replayed_in_a_savepoint => replay::replayed_in_a_savepoint,
            [stamps] replay__replayed_in_a_batch => replay::replayed_in_a_batch,
            [stamps] replay__replayed_after_a_batch_split_around_a_failure => replay::replayed_after_a_batch_split_around_a_failure,
            [stamps attempts] replay__replayed_in_a_batch_beside_a_handler_without_stamps => replay::replayed_in_a_batch_beside_a_handler_without_stamps,
            [stamps] replay__replayed_with_version_in_a_batch => replay::replayed_with_version_in_a_batch,
            [stamps leases] replay__replayed_in_lease_mode => replay::replayed_in_lease_mode,
            [stamps] replay__replayed_with_version => replay::replayed_with_version,
            [stamps] replay__over_the_cap_writes_nothing => replay::over_the_cap_writes_nothing,
            [stamps] fingerprint__conflict_on_a_pool => fingerprint::conflict_on_a_pool,
            [stamps] fingerprint__conflict_in_a_savepoint => fingerprint::conflict_in_a_savepoint,
            [stamps] fingerprint__conflict_in_a_batch => fingerprint::conflict_in_a_batch,
            [stamps leases] fingerprint__conflict_in_lease_mode => fingerprint::conflict_in_lease_mode,
            [stamps] fingerprint__conflict_with_version => fingerprint::conflict_with_version,
            [stamps] fingerprint__concurrent_payloads_one_applies_one_conflicts => fingerprint::concurrent_payloads_one_applies_one_conflicts,
            [attempts] attempts__counted_across_rollbacks_and_panics => attempts::counted_across_rollbacks_and_panics,
            [attempts] attempts__cleared_by_a_success => attempts::cleared_by_a_success,
            [attempts] attempts__counted_in_a_batch => attempts::counted_in_a_batch,
            [attempts leases] attempts__counted_in_lease_mode => attempts::counted_in_lease_mode,
            [] retention__purge_removes_exactly_the_expired => retention::purge_removes_exactly_the_expired,
            [] retention__versions_outlive_purged_records => retention::versions_outlive_purged_records,
            [] retention__purger_purges_until_stopped => retention::purger_purges_until_stopped,
            [] bad_input__empty_key_is_refused_before_any_write => bad_input::empty_key_is_refused_before_any_write,
            [] bad_input__megabyte_key_is_refused_before_any_write => bad_input::megabyte_key_is_refused_before_any_write,
            [] bad_input__keys_with_nul_bytes_are_stored_exactly => bad_input::keys_with_nul_bytes_are_stored_exactly,
            [] bad_input__non_utf8_byte_keys_are_stored_exactly => bad_input::non_utf8_byte_keys_are_stored_exactly,
            [] bad_input__unicode_keys_are_compared_byte_for_byte => bad_input::unicode_keys_are_compared_byte_for_byte,
            [] bad_input__extreme_versions_i64_min_and_max => bad_input::extreme_versions_i64_min_and_max,
            [] bad_input__unsigned_version_over_i64_max_is_refused_before_any_write => bad_input::unsigned_version_over_i64_max_is_refused_before_any_write,
            [] bad_input__negative_versions_order_as_signed_integers => bad_input::negative_versions_order_as_signed_integers,
            [] bad_input__sql_metacharacters_in_keys_and_scope_are_data => bad_input::sql_metacharacters_in_keys_and_scope_are_data,
            [] bad_input__bad_keys_and_versions_are_refused_before_any_write => bad_input::bad_keys_and_versions_are_refused_before_any_write,
            [] props__key_only_streams_apply_each_message_once => props::key_only_streams_apply_each_message_once,
            [] props__key_version_streams_end_in_the_newest_state => props::key_version_streams_end_in_the_newest_state,
            [] props__key_version_entity_streams_apply_each_event_once_in_order => props::key_version_entity_streams_apply_each_event_once_in_order,
            [] props__key_only_batches_decide_as_one_by_one => batch_props::key_only_batches_decide_as_one_by_one,
            [] props__key_version_batches_decide_as_one_by_one => batch_props::key_version_batches_decide_as_one_by_one,
            [] props__key_version_entity_batches_decide_as_one_by_one => batch_props::key_version_entity_batches_decide_as_one_by_one,
            [] spans__each_delivery_has_one_span_with_its_outcome => spans::each_delivery_has_one_span_with_its_outcome,
        }
        $crate::__rules! { $backend; [$($lacks)*]; [$($absent = $why)?];
            [recovery] recovery__park_writes_an_unleased_row_due_after_its_delay => recovery::park_writes_an_unleased_row_due_after_its_delay,
            [recovery] recovery__take_due_takes_a_row_only_once_due_oldest_due_first => recovery::take_due_takes_a_row_only_once_due_oldest_due_first,
            [recovery] recovery__a_held_row_is_taken_again_only_after_its_lease_ran_out => recovery::a_held_row_is_taken_again_only_after_its_lease_ran_out,
            [recovery] recovery__concurrent_takes_return_each_due_row_exactly_once => recovery::concurrent_takes_return_each_due_row_exactly_once,
            [recovery] recovery__unpark_rolled_back_with_its_transaction_leaves_the_row => recovery::unpark_rolled_back_with_its_transaction_leaves_the_row,
            [recovery] recovery__repark_sets_attempts_error_and_due_and_clears_the_lease => recovery::repark_sets_attempts_error_and_due_and_clears_the_lease,
            [recovery] recovery__release_parked_clears_the_lease_and_keeps_the_due_time => recovery::release_parked_clears_the_lease_and_keeps_the_due_time,
            [recovery] recovery__bury_writes_every_column_of_a_dead_letter => recovery::bury_writes_every_column_of_a_dead_letter,
            [recovery] recovery__bury_of_a_parked_row_moves_it_and_a_stale_token_moves_nothing => recovery::bury_of_a_parked_row_moves_it_and_a_stale_token_moves_nothing,
            [recovery] recovery__headers_origin_and_payload_round_trip => recovery::headers_origin_and_payload_round_trip,
            [recovery] recovery__values_no_database_could_hold_are_refused_before_any_write => recovery::values_no_database_could_hold_are_refused_before_any_write,
            [recovery] recovery__a_nul_in_an_error_is_written_as_backslash_zero => recovery::a_nul_in_an_error_is_written_as_backslash_zero,
            [recovery attempts] recovery__last_error_reads_the_counted_error_of_a_key => recovery::last_error_reads_the_counted_error_of_a_key,
        }
        $crate::__metrics_tests! { $backend; [$($lacks)*]; [$($absent = $why)?];
            [stamps leases attempts] metrics__counts_equal_the_outcomes => metrics::counts_equal_the_outcomes,
            [admin recovery] metrics__gauges_publish_what_waits_and_zero_what_is_gone => metrics::gauges_publish_what_waits_and_zero_what_is_gone,
        }
        $crate::__rules! { $backend; [$($lacks)*]; [$($absent = $why)?];
            [admin leases] admin__stats_count_records_leases_expired_and_versions => admin::stats_count_records_leases_expired_and_versions,
            [admin leases] admin__record_and_version_read_back_what_was_written => admin::record_and_version_read_back_what_was_written,
            [admin leases] admin__forget_then_a_redelivery_applies => admin::forget_then_a_redelivery_applies,
            [admin leases] admin__release_lets_the_next_delivery_run => admin::release_lets_the_next_delivery_run,
            [admin leases] admin__purge_batch_removes_exactly_the_expired => admin::purge_batch_removes_exactly_the_expired,
            [admin attempts] admin__attempts_list_the_poisoned_and_clear_attempts_reopens_them => admin::attempts_list_the_poisoned_and_clear_attempts_reopens_them,
            [admin] gauges__outbox_backlog_counts_pending_rows_per_destination => gauges::outbox_backlog_counts_pending_rows_per_destination,
            [admin recovery] gauges__recovery_counts_count_parked_and_open_dead_letters_per_consumer => gauges::recovery_counts_count_parked_and_open_dead_letters_per_consumer,
        }
    };
}

/// Checks the names given to `suite!`'s `without(...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __capabilities {
    () => {};
    (leases $($rest:ident)*) => { $crate::__capabilities! { $($rest)* } };
    (stamps $($rest:ident)*) => { $crate::__capabilities! { $($rest)* } };
    (attempts $($rest:ident)*) => { $crate::__capabilities! { $($rest)* } };
    (admin $($rest:ident)*) => { $crate::__capabilities! { $($rest)* } };
    (recovery $($rest:ident)*) => { $crate::__capabilities! { $($rest)* } };
    ($other:ident $($rest:ident)*) => {
        ::core::compile_error! { ::core::concat!(
            "unknown capability `", ::core::stringify!($other),
            "`: `without(...)` takes `leases`, `stamps`, `attempts`, `admin` and `recovery`"
        ) }
    };
}

/// One test per rule: `[needs] name => module::rule`, against the capabilities the backend
/// lacks.
#[doc(hidden)]
#[macro_export]
macro_rules! __rules {
    ($backend:ty; $lacks:tt; $absent:tt; $([$($needs:ident)*] $name:ident => $cap:ident :: $rule:ident,)*) => {
        $(
            $crate::__rule! { $backend; $lacks; $absent; [$($needs)*] $name => $cap::$rule }
        )*
    };
}

/// A rule's test (ignored with the reason of `absent(...)` when its cfg holds), or, when the
/// backend lacks a capability the rule needs, an ignored test that says which (and does not
/// name the rule, which would not compile for that backend).
#[doc(hidden)]
#[macro_export]
macro_rules! __rule {
    ($backend:ty; $lacks:tt; [$($absent:ident = $why:literal)?]; [] $name:ident => $cap:ident :: $rule:ident) => {
        #[test]
        $(#[cfg_attr($absent, ignore = $why)])?
        #[allow(non_snake_case)]
        fn $name() {
            $crate::__private::run($crate::rules::$cap::$rule::<$backend>());
        }
    };
    ($backend:ty; [$($lacks:ident)*]; $absent:tt; [$need:ident $($more:ident)*] $name:ident => $cap:ident :: $rule:ident) => {
        $crate::__lacks! { $need [$($lacks)*]
            { $crate::__ignored! { $need $name } }
            { $crate::__rule! { $backend; [$($lacks)*]; $absent; [$($more)*] $name => $cap::$rule } }
        }
    };
}

/// The first block if `$need` is in the list of what the backend lacks, else the second.
#[doc(hidden)]
#[macro_export]
macro_rules! __lacks {
    ($need:ident [] $yes:tt { $($no:tt)* }) => { $($no)* };
    (leases [leases $($rest:ident)*] { $($yes:tt)* } $no:tt) => { $($yes)* };
    (stamps [stamps $($rest:ident)*] { $($yes:tt)* } $no:tt) => { $($yes)* };
    (attempts [attempts $($rest:ident)*] { $($yes:tt)* } $no:tt) => { $($yes)* };
    (admin [admin $($rest:ident)*] { $($yes:tt)* } $no:tt) => { $($yes)* };
    (recovery [recovery $($rest:ident)*] { $($yes:tt)* } $no:tt) => { $($yes)* };
    ($need:ident [$other:ident $($rest:ident)*] $yes:tt $no:tt) => {
        $crate::__lacks! { $need [$($rest)*] $yes $no }
    };
}

/// The ignored test of a rule whose capability the backend lacks. If run anyway
/// (`--ignored`), it fails: it was never checked.
#[doc(hidden)]
#[macro_export]
macro_rules! __ignored {
    (leases $name:ident) => {
        $crate::__ignored! { @ "the backend does not implement idem::store::Leases" $name }
    };
    (stamps $name:ident) => {
        $crate::__ignored! { @ "the backend does not implement idem::store::Stamps" $name }
    };
    (attempts $name:ident) => {
        $crate::__ignored! { @ "the backend does not implement idem::store::Attempts" $name }
    };
    (admin $name:ident) => {
        $crate::__ignored! { @ "the backend does not implement idem::admin::Admin" $name }
    };
    (recovery $name:ident) => {
        $crate::__ignored! { @ "the backend does not implement idem::recover::RecoveryStore" $name }
    };
    (@ $reason:literal $name:ident) => {
        #[test]
        #[ignore = $reason]
        #[allow(non_snake_case)]
        fn $name() {
            ::core::panic!($reason);
        }
    };
}

/// The rules of feature `metrics` (this crate's): emitted only when it is on.
#[cfg(feature = "metrics")]
#[doc(hidden)]
#[macro_export]
macro_rules! __metrics_tests {
    ($($rules:tt)*) => {
        $crate::__rules! { $($rules)* }
    };
}

/// The rules of feature `metrics` (this crate's): emitted only when it is on.
#[cfg(not(feature = "metrics"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __metrics_tests {
    ($($rules:tt)*) => {};
}
