//! The broker conformance kit: the same rules on every broker adapter, against its real server.
//!
//! A broker crate's test implements [`Broker`] once (in `tests/conformance.rs`), for its adapter
//! and its server, and invokes [`broker_suite!`](crate::broker_suite):
//!
//! ```ignore
//! struct Rabbit { /* the names of one rule's queue and exchanges, a channel */ }
//!
//! impl idem_testkit::broker::Broker for Rabbit { /* … */ }
//!
//! idem_testkit::broker_suite!(Rabbit);
//! // A broker that cannot do something says what and why; those rules show as ignored:
//! // idem_testkit::broker_suite!(Kafka; without(max_deliveries = "Kafka keeps no delivery count"));
//! ```
//!
//! This emits one `#[test]` per rule, named `capability__rule` (`exactly_once__…`, `health__…`,
//! `settle_after_commit__…`, `dead_letter__…`, `recovery__…`, `max_deliveries__…`, `lag__…`,
//! `shutdown__…`, `crash__…`, `outbox__…`), each on a multi-threaded tokio runtime of its own;
//! the bodies are public async fns in [`rules`], generic over the [`Broker`] and the database ([`Backend`](crate::Backend):
//! SQLite always, PostgreSQL with this crate's feature `postgres`, else those rules are ignored
//! saying so). Every rule asserts the database against an exactly-once oracle and the broker's
//! own state ([`Broker::unsettled`], [`Broker::dead_letters`], [`Broker::arrived`]).
//!
//! **Capabilities.** `without(...)` takes `max_deliveries` (the broker does not count
//! deliveries), `processes` (its input cannot be reached from a second process, so the rules
//! that SIGKILL a child cannot run) and `outbox` (no outbox publisher), each with the reason
//! that the ignored tests carry. A rule the broker cannot run is never dropped silently, nor
//! reported as passed. Nor is a rule whose server is absent: `absent(...)` names the cfg (set
//! by the calling crate's build script) under which the rules are ignored with the reason, and
//! the rules on PostgreSQL are ignored, saying so, when this crate was built without
//! `IDEM_POSTGRES_URL` (each outside CI only). A server named but not answering makes a rule
//! say `skipped:` and return outside CI, and fail in CI.
//!
//! **Child processes.** The crash rules re-run the test binary
//! (`std::env::current_exe()` with `--exact <module>::broker_suite_child --ignored
//! --nocapture`): the macro emits that `#[ignore]`d entry, `broker_suite_child`, which does
//! nothing unless the environment variables of [`child`] name its role. The child rebuilds the
//! broker from [`Broker::names`] with [`Broker::attach`], and reopens the rule's database.
//!
//! **Sizes.** Each rule is a few seconds on a small machine; `IDEM_SOAK=1` runs the long sizes
//! (more messages and more SIGKILLs). `IDEM_KIT_SEED` replays the random streams (the seed is
//! printed).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use idem::consume::Source;
use idem::outbox::Publisher;

pub mod child;
pub mod harness;
pub mod model;
pub mod rules;

/// The names of idem's headers (Redis: entry fields) that the rules read, the same on every
/// broker (the table of `idem::consume`'s docs, and each broker crate's `headers` module).
pub mod fields {
    /// An outbox message's id.
    pub const MESSAGE_ID: &str = "idem-message-id";
    /// An outbox message's partition key.
    pub const PARTITION_KEY: &str = "idem-partition-key";
    /// A dead letter's reason (`undecodable`, `bad_key`, `too_many_deliveries`, `poisoned`, …).
    pub const REASON: &str = "idem-reason";
    /// A dead letter's reason in words.
    pub const DETAIL: &str = "idem-detail";
    /// How many times the broker had delivered a dead letter's original, where it counts.
    pub const DELIVERIES: &str = "idem-deliveries";
    /// How many times the handler failed on a dead letter's original, when `poisoned`.
    pub const ATTEMPTS: &str = "idem-attempts";
    /// Where a dead letter was consumed from (a queue, stream or topic).
    pub const SOURCE: &str = "idem-source";
}

/// What a rule asks of its input when it makes one ([`Broker::create`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// A short name of the rule, for the names of what the broker makes (`once`, `crash`, …).
    pub rule: &'static str,
    /// The input must count deliveries (RabbitMQ: a quorum queue), for `max_deliveries`.
    pub counted: bool,
    /// How soon what a consumer held when it died (SIGKILL, no goodbye) comes back to another:
    /// JetStream's `ack_wait`, Redis's `claim_idle`; a broker without such a timer ignores it.
    pub redelivery: Duration,
}

impl Spec {
    /// A spec for `rule`: not counted, what a dead consumer held back after 2 s.
    pub const fn new(rule: &'static str) -> Spec {
        Spec {
            rule,
            counted: false,
            redelivery: Duration::from_secs(2),
        }
    }
}

/// How a rule connects a [`Broker::source`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The source's `prefetch`.
    pub prefetch: usize,
    /// The consumer's name: a process that restarts under the same name resumes what it held
    /// (Redis Streams); another name takes it over. Brokers without consumer names ignore it.
    pub consumer: String,
}

impl Settings {
    /// `prefetch` and consumer name `consumer`.
    pub fn new(prefetch: usize, consumer: &str) -> Settings {
        Settings {
            prefetch,
            consumer: consumer.to_string(),
        }
    }
}

/// A message as a rule publishes it: a message id (the broker's own id property or header,
/// and [`fields::MESSAGE_ID`]) and the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    /// The message id.
    pub id: String,
    /// The payload.
    pub payload: Vec<u8>,
}

/// A dead letter as the broker holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The original's message id, where the dead letter kept it.
    pub id: Option<String>,
    /// The original's payload.
    pub payload: Vec<u8>,
    /// Its headers (Redis: fields) as text, idem's ([`fields`]) among them.
    pub fields: BTreeMap<String, String>,
}

impl DeadLetter {
    /// The value of `field`, if any.
    pub fn field(&self, field: &str) -> Option<&str> {
        self.fields.get(field).map(String::as_str)
    }

    /// Its [`fields::REASON`] (empty if missing).
    pub fn reason(&self) -> &str {
        self.field(fields::REASON).unwrap_or_default()
    }
}

/// An outbox message as it arrived at the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrived {
    /// Its id, as the broker carries it (AMQP `message_id`, `Nats-Msg-Id`, the id header or
    /// field).
    pub id: String,
    /// Its partition key, if it had one.
    pub partition_key: Option<String>,
    /// The broker's partition it landed in, where the broker has partitions (Kafka).
    pub partition: Option<i32>,
    /// The payload.
    pub payload: Vec<u8>,
    /// The headers the handler gave it (`Outgoing::header`), without idem's own.
    pub headers: BTreeMap<String, String>,
}

/// A broker under test: one rule's input (a queue, a stream and its durable consumer, a
/// topic and its group, a stream and its group, each with its dead-letter place), what the rules
/// publish into it and read from it, and the adapter's `Source` and `OutboxPublisher` on it.
///
/// Each rule makes its own input with [`create`](Broker::create) (names unique per run) and
/// deletes it with [`teardown`](Broker::teardown), also when it fails. Nothing broker-specific
/// reaches the rules: they see only these methods and constants.
pub trait Broker: Sized + Send + Sync + 'static {
    /// The adapter's entry type.
    type Source: Source;
    /// The adapter's outbox publisher.
    type Publisher: Publisher + 'static;

    /// The broker's name, for messages (`RabbitMQ`).
    const NAME: &'static str;
    /// Whether the broker counts deliveries (`Delivery::deliveries` is `Some`), which
    /// `Consumer::max_deliveries` reads. When false, invoke the suite `without(max_deliveries
    /// = "…")`.
    const COUNTS_DELIVERIES: bool;
    /// Whether a settled delivery leaves the input at once, whatever happens to the others.
    /// False where the broker keeps a position that moves only over a contiguous run of
    /// settled deliveries (Kafka's committed offsets): then deliveries settled past a gap come
    /// back after a restart, as duplicates.
    const SETTLES_EACH: bool;
    /// Whether the broker drops a message published again with an id it has seen (JetStream's
    /// duplicate window on `Nats-Msg-Id`); otherwise both copies arrive.
    const DROPS_REPUBLISHED: bool;
    /// How long, after consumers were killed, before fresh ones are sure to be handed what the
    /// dead ones held (Kafka: past the session timeout, when the group has forgotten them).
    const REJOIN: Duration = Duration::ZERO;

    /// Makes a fresh input of this rule's own (unique names), empty, with its dead-letter
    /// place, as `spec` asks. When the server is not there: prints one line starting with
    /// `skipped:` that says why and returns `None`, or panics when the environment variable
    /// `CI` is set ([`harness::skip`]).
    fn create(spec: Spec) -> impl Future<Output = Option<Self>> + Send;

    /// One line naming what [`create`](Broker::create) made, for [`attach`](Broker::attach)
    /// in a child process.
    fn names(&self) -> String;

    /// The input named by [`names`](Broker::names), in a child process.
    fn attach(names: &str) -> impl Future<Output = Self> + Send;

    /// Publishes `messages` in this order, each with its id, and waits until the broker has
    /// taken every one.
    fn publish(&self, messages: &[Raw]) -> impl Future<Output = ()> + Send;

    /// A connected source on the input, with the rule's `settings` and its dead-letter place.
    fn source(&self, settings: Settings) -> impl Future<Output = Self::Source> + Send;

    /// What was dead-lettered so far, in order.
    fn dead_letters(&self) -> impl Future<Output = Vec<DeadLetter>> + Send;

    /// How many published messages are not yet settled for good (ready, in flight, pending,
    /// past the committed position). Exact once no consumer is connected (after
    /// [`gone`](Broker::gone)); while consumers run it may leave out what they hold, but is
    /// 0 only when nothing is left to hand out.
    fn unsettled(&self) -> impl Future<Output = u64> + Send;

    /// Waits (bounded) until the consumers that closed or died have let go of the input, so
    /// that [`unsettled`](Broker::unsettled) is exact. By default at once.
    fn gone(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// An outbox publisher that delivers to [`destination`](Broker::destination).
    fn publisher(&self) -> impl Future<Output = Self::Publisher> + Send;

    /// The input's name as a dead letter's [`fields::SOURCE`] gives it: the queue, the stream,
    /// the topic.
    fn input(&self) -> String;

    /// The outbox destination (a queue, a subject, a topic, a stream) whose messages
    /// [`arrived`](Broker::arrived) reads.
    fn destination(&self) -> String;

    /// A destination the outbox publisher must refuse (no queue bound, no stream captures it,
    /// a key of another type, …), made here if need be and deleted by
    /// [`teardown`](Broker::teardown), and a piece of text the refusal's message contains.
    fn refusing_destination(&self) -> impl Future<Output = (String, String)> + Send;

    /// The outbox messages that arrived at [`destination`](Broker::destination), in the
    /// broker's order (partition after partition where it has them), once at least `expected`
    /// have (or after a bounded wait, so a rule with too few fails on its assertions).
    fn arrived(&self, expected: usize) -> impl Future<Output = Vec<Arrived>> + Send;

    /// Deletes what [`create`](Broker::create) and the rule made.
    fn teardown(self) -> impl Future<Output = ()> + Send;
}

/// What [`broker_suite!`](crate::broker_suite) expands to. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use super::child::run as child;

    tokio::task_local! {
        /// The name of the suite's child entry test, as libtest names it.
        pub static CHILD_TEST: String;
    }

    /// Runs one rule on a multi-threaded runtime of its own; `child` is the child entry's
    /// `module_path!()`-qualified name, which the rules that spawn children re-run.
    pub fn run(child: &'static str, rule: impl std::future::Future<Output = ()>) {
        // libtest names tests without the crate's name, which `module_path!` starts with.
        let name = child.split_once("::").map_or(child, |(_, rest)| rest);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(CHILD_TEST.scope(name.to_string(), rule))
    }
}

/// Emits one test per rule of the broker conformance kit for a [`Broker`](crate::broker::Broker):
/// `idem_testkit::broker_suite!(MyBroker);` in an integration test file (or a module of one).
/// Needs no `use` lines.
///
/// `idem_testkit::broker_suite!(MyBroker; without(max_deliveries = "…", processes = "…",
/// outbox = "…"))` emits the rules of the capabilities named as `#[ignore]`d tests carrying
/// the reason given (see the [module docs](crate::broker)). It also emits
/// `broker_suite_child`, an ignored test that is the child process of the crash rules.
///
/// `…; absent(no_my_broker = "set MY_BROKER_URL to run")` (after `without(...)`, if any) names a
/// cfg of the calling crate that is set when the broker's server is absent: every rule that would
/// run is then ignored with that reason (`--ignored` runs them). A build script of that crate
/// sets and declares it (idem's broker crates set `idem_no_kafka`, … when the server's
/// environment variable is unset and `CI` is not). The rules on PostgreSQL are ignored the same
/// way, saying so, when this crate was built without `IDEM_POSTGRES_URL` (and without `CI`).
#[macro_export]
macro_rules! broker_suite {
    ($broker:ty) => {
        $crate::broker_suite!($broker; without());
    };
    ($broker:ty; absent($absent:ident = $absent_why:literal)) => {
        $crate::broker_suite!($broker; without(); absent($absent = $absent_why));
    };
    ($broker:ty; without($($cap:ident = $why:literal),* $(,)?) $(; absent($absent:ident = $absent_why:literal))?) => {
        $( $crate::__broker_known!($cap); )*

        /// The child process of the broker suite's crash rules: does nothing unless a rule
        /// runs it.
        #[test]
        #[ignore = "the child process of the broker suite's crash rules, which run it"]
        fn broker_suite_child() {
            $crate::broker::__private::child::<$broker>();
        }

        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; []; [$($cap = $why,)*];
            exactly_once__duplicates_and_reordering_apply_once_on_sqlite => exactly_once::duplicates_and_reordering_apply_once(Sqlite),
            exactly_once__duplicates_and_reordering_apply_once_on_postgres => exactly_once::duplicates_and_reordering_apply_once(Postgres),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; []; [$($cap = $why,)*];
            health__ready_while_running_with_the_brokers_probe => health::ready_while_running_with_the_brokers_probe(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; [processes]; [$($cap = $why,)*];
            settle_after_commit__a_kill_between_commit_and_settle_redelivers_a_duplicate => settle_after_commit::a_kill_between_commit_and_settle_redelivers_a_duplicate(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; []; [$($cap = $why,)*];
            dead_letter__poison_undecodable_and_bad_keys_are_dead_lettered_with_the_reason => dead_letter::poison_undecodable_and_bad_keys_are_dead_lettered_with_the_reason(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; []; [$($cap = $why,)*];
            recovery__a_failing_delivery_waits_in_the_database_while_the_input_flows => recovery::a_failing_delivery_waits_in_the_database_while_the_input_flows(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; [max_deliveries]; [$($cap = $why,)*];
            max_deliveries__over_the_limit_is_dead_lettered_without_running => max_deliveries::over_the_limit_is_dead_lettered_without_running(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; []; [$($cap = $why,)*];
            lag__reads_what_waits_then_nothing_once_consumed => lag::reads_what_waits_then_nothing_once_consumed(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; []; [$($cap = $why,)*];
            shutdown__mid_stream_drains_settles_and_a_second_run_finishes => shutdown::mid_stream_drains_settles_and_a_second_run_finishes(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; [processes]; [$($cap = $why,)*];
            crash__sigkills_and_restarts_lose_nothing_on_sqlite => crash::sigkills_and_restarts_lose_nothing(Sqlite),
            crash__sigkills_and_restarts_lose_nothing_on_postgres => crash::sigkills_and_restarts_lose_nothing(Postgres),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; [outbox]; [$($cap = $why,)*];
            outbox__a_rolled_back_handler_publishes_nothing_and_committed_ones_arrive_once => outbox::a_rolled_back_handler_publishes_nothing_and_committed_ones_arrive_once(Sqlite),
            outbox__a_refused_destination_fails_the_batch_and_keeps_the_rows => outbox::a_refused_destination_fails_the_batch_and_keeps_the_rows(Sqlite),
            outbox__two_relays_keep_each_partition_keys_order => outbox::two_relays_keep_each_partition_keys_order(Postgres),
            outbox__a_publish_whose_result_was_lost_is_published_again_and_applied_once => outbox::a_publish_whose_result_was_lost_is_published_again_and_applied_once(Sqlite),
        }
        $crate::__broker_group! { $broker; [$($absent = $absent_why)?]; [outbox, processes]; [$($cap = $why,)*];
            outbox__a_relay_killed_before_publishing_publishes_each_once_after_a_restart => outbox::a_relay_killed_before_publishing_publishes_each_once_after_a_restart(Postgres),
            outbox__a_relay_killed_after_the_confirm_publishes_again_and_downstream_applies_once => outbox::a_relay_killed_after_the_confirm_publishes_again_and_downstream_applies_once(Postgres),
        }
    };
}

/// Refuses a capability name `without(...)` does not know. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_known {
    (max_deliveries) => {};
    (processes) => {};
    (outbox) => {};
    ($other:ident) => {
        compile_error!(concat!(
            "broker_suite!: unknown capability `",
            stringify!($other),
            "` in without(...); known: max_deliveries, processes, outbox"
        ));
    };
}

/// Emits a group of rules that need the capabilities in the second brackets: as tests, or as
/// ignored tests when `without(...)` (the third brackets) names one of them. The first brackets
/// hold `absent(...)`'s cfg and reason, if given. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_group {
    ($b:ty; $abs:tt; []; [$($w:tt)*]; $($tests:tt)*) => {
        $crate::__broker_tests! { $b; $abs; $($tests)* }
    };
    ($b:ty; $abs:tt; [$cap:ident $(, $more:ident)*]; [$($w:tt)*]; $($tests:tt)*) => {
        $crate::__broker_find! { $b; $abs; $cap; [$($more),*]; [$($w)*]; [$($w)*]; $($tests)* }
    };
}

/// Looks for one capability in the `without(...)` list (the last brackets). Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_find {
    ($b:ty; $abs:tt; max_deliveries; $more:tt; $all:tt; [max_deliveries = $why:literal, $($rest:tt)*]; $($tests:tt)*) => {
        $crate::__broker_ignored! { $why; $($tests)* }
    };
    ($b:ty; $abs:tt; processes; $more:tt; $all:tt; [processes = $why:literal, $($rest:tt)*]; $($tests:tt)*) => {
        $crate::__broker_ignored! { $why; $($tests)* }
    };
    ($b:ty; $abs:tt; outbox; $more:tt; $all:tt; [outbox = $why:literal, $($rest:tt)*]; $($tests:tt)*) => {
        $crate::__broker_ignored! { $why; $($tests)* }
    };
    ($b:ty; $abs:tt; $cap:ident; $more:tt; $all:tt; [$other:ident = $why:literal, $($rest:tt)*]; $($tests:tt)*) => {
        $crate::__broker_find! { $b; $abs; $cap; $more; $all; [$($rest)*]; $($tests)* }
    };
    ($b:ty; $abs:tt; $cap:ident; [$($more:ident),*]; $all:tt; []; $($tests:tt)*) => {
        $crate::__broker_group! { $b; $abs; [$($more),*]; $all; $($tests)* }
    };
}

/// Emits rules as tests, one at a time, each ignored with the reason of `absent(...)` when its
/// cfg holds. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_tests {
    ($b:ty; $abs:tt;) => {};
    ($b:ty; [$($absent:ident = $why:literal)?]; $name:ident => $cap:ident :: $rule:ident (Sqlite), $($rest:tt)*) => {
        #[test]
        $(#[cfg_attr($absent, ignore = $why)])?
        #[allow(non_snake_case)]
        fn $name() {
            $crate::broker::__private::run(
                concat!(module_path!(), "::broker_suite_child"),
                $crate::broker::rules::$cap::$rule::<$b, $crate::backends::Sqlite>(),
            );
        }
        $crate::__broker_tests! { $b; [$($absent = $why)?]; $($rest)* }
    };
    ($b:ty; $abs:tt; $name:ident => $cap:ident :: $rule:ident (Postgres), $($rest:tt)*) => {
        $crate::__broker_postgres! { $b; $abs; $name => $cap :: $rule }
        $crate::__broker_tests! { $b; $abs; $($rest)* }
    };
}

/// Emits rules as ignored tests with the reason `without(...)` gave. Not public API.
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_ignored {
    ($why:literal;) => {};
    ($why:literal; $name:ident => $cap:ident :: $rule:ident ($db:ident), $($rest:tt)*) => {
        #[test]
        #[ignore = $why]
        #[allow(non_snake_case)]
        fn $name() {}
        $crate::__broker_ignored! { $why; $($rest)* }
    };
}

/// A rule on PostgreSQL: a test with this crate's feature `postgres`, ignored with the reason of
/// `absent(...)` when its cfg holds. Not public API.
#[cfg(all(feature = "postgres", not(idem_no_postgres)))]
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_postgres {
    ($b:ty; [$($absent:ident = $why:literal)?]; $name:ident => $cap:ident :: $rule:ident) => {
        #[test]
        $(#[cfg_attr($absent, ignore = $why)])?
        #[allow(non_snake_case)]
        fn $name() {
            $crate::broker::__private::run(
                concat!(module_path!(), "::broker_suite_child"),
                $crate::broker::rules::$cap::$rule::<$b, $crate::backends::Postgres>(),
            );
        }
    };
}

/// A rule on PostgreSQL when this crate was built without `IDEM_POSTGRES_URL` (and without
/// `CI`): ignored, saying so (or with the reason of `absent(...)` when its cfg holds); it runs
/// with `--ignored`. Not public API.
#[cfg(all(feature = "postgres", idem_no_postgres))]
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_postgres {
    ($b:ty; [$($absent:ident = $why:literal)?]; $name:ident => $cap:ident :: $rule:ident) => {
        #[test]
        $(#[cfg_attr($absent, ignore = $why)])?
        #[cfg_attr(
            not(any($($absent)?)),
            ignore = "set IDEM_POSTGRES_URL (e.g. postgres://postgres@127.0.0.1:5432/test) to run"
        )]
        #[allow(non_snake_case)]
        fn $name() {
            $crate::broker::__private::run(
                concat!(module_path!(), "::broker_suite_child"),
                $crate::broker::rules::$cap::$rule::<$b, $crate::backends::Postgres>(),
            );
        }
    };
}

/// A rule on PostgreSQL: ignored without this crate's feature `postgres`. Not public API.
#[cfg(not(feature = "postgres"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __broker_postgres {
    ($b:ty; $abs:tt; $name:ident => $cap:ident :: $rule:ident) => {
        #[test]
        #[ignore = "a rule on PostgreSQL: idem-testkit's feature `postgres` is off"]
        #[allow(non_snake_case)]
        fn $name() {}
    };
}
