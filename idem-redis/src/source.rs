//! [`Source`]: reads a consumer group's entries in batches, with `XAUTOCLAIM` of entries a
//! dead consumer left pending; from [`SourceBuilder::connect`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, Stream, StreamExt as _};
use idem_runtime::consume::adapter::{InFlight, Lifecycle, CLOSE_TIMEOUT};
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamPendingCountReply,
    StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands as _, RedisResult};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::delivery::{Delivery, Group};
use crate::error::Error;
use crate::server::{default_dead_letters, same_slot, Conn, Server};

/// How much longer than `block` the reader waits for `XREADGROUP`'s reply before it gives the
/// read up as lost.
const READ_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// The settings of a [`Source`], from [`Source::builder`]; nothing connects until
/// [`connect`](SourceBuilder::connect).
/// Its `Debug` shows the URL without its password.
#[derive(Clone, Debug)]
pub struct SourceBuilder {
    server: Server,
    stream: String,
    group: String,
    consumer: String,
    prefetch: usize,
    dead_letters: Option<String>,
    block: Duration,
    claim_idle: Duration,
}

impl SourceBuilder {
    /// Entries read per `XREADGROUP` (its `COUNT`; default 100, at least 1): match the
    /// consumer's `batch`.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// Where dead letters go (default `<stream>:dead`; on a Redis Cluster, `{<stream>}:dead`
    /// when the stream's name has no hash tag): a stream on the same server, and on a cluster
    /// in the stream's hash slot ([`connect`](SourceBuilder::connect) checks it:
    /// [`Error::CrossSlot`]). `connect` checks too that the key is a stream, or absent (the
    /// first dead letter creates it).
    pub fn dead_letters(mut self, stream: impl Into<String>) -> Self {
        self.dead_letters = Some(stream.into());
        self
    }

    /// How long one `XREADGROUP` waits for new entries (default 500 ms).
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block.max(Duration::from_millis(1));
        self
    }

    /// Entries pending longer than this (a consumer died holding them) are taken over
    /// (default 60 s). Keep it longer than the consumer's handler time-out and longest retry
    /// delay, or a live consumer's entries are taken over too (harmless, since handlers are
    /// idempotent, but wasted work).
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }

    /// On a Redis Cluster, checks that the dead-letter stream is in the stream's hash slot
    /// ([`Error::CrossSlot`]); connects ([`Error::Connect`]), creates the consumer group on the
    /// stream (and the stream) if it does not exist yet, starting from the stream's beginning
    /// ([`Error::Group`] if the key holds something else), and checks that the dead-letter
    /// key is a stream or absent ([`Error::DeadLetterNotAStream`]).
    pub async fn connect(self) -> Result<Source, Error> {
        let cluster = self.server.is_cluster();
        let dead_letters = self
            .dead_letters
            .unwrap_or_else(|| default_dead_letters(&self.stream, cluster));
        if cluster && !same_slot(&self.stream, &dead_letters) {
            return Err(Error::CrossSlot {
                stream: self.stream,
                dead_letters,
            });
        }
        let connect = |source| Error::Connect {
            url: self.server.describe(),
            source,
        };
        // The reader's `XREADGROUP` waits up to `block` on the server: its reply time-out must
        // be longer, or every read of an idle stream times out (the client's default is 500 ms,
        // `block`'s too).
        let reader = self
            .server
            .connect(Some(self.block + READ_TIMEOUT_MARGIN))
            .await
            .map_err(connect)?;
        let mut writer = self.server.connect(None).await.map_err(connect)?;
        let created: RedisResult<()> = writer
            .xgroup_create_mkstream(&self.stream, &self.group, "0")
            .await;
        match created {
            Ok(()) => {}
            Err(err) if err.code() == Some("BUSYGROUP") => {}
            Err(source) => {
                return Err(Error::Group {
                    stream: self.stream,
                    group: self.group,
                    source,
                })
            }
        }
        let found: String = redis::cmd("TYPE")
            .arg(&dead_letters)
            .query_async(&mut writer)
            .await
            .map_err(|source| Error::Request {
                what: format!("checking the dead-letter key {dead_letters:?}"),
                source,
            })?;
        if found != "stream" && found != "none" {
            return Err(Error::DeadLetterNotAStream {
                stream: dead_letters,
                found,
            });
        }
        Ok(Source {
            reader,
            group: Group::new(
                writer,
                &self.stream,
                &self.group,
                &self.consumer,
                &dead_letters,
                Lifecycle::new(),
            ),
            prefetch: self.prefetch,
            block: self.block,
            claim_idle: self.claim_idle,
            resumed: AtomicBool::new(false),
        })
    }
}

/// A consumer of one stream in one consumer group: hand [`deliveries`](Source::deliveries) to
/// `idem::consume::Consumer::run`, then [`close`](Source::close) it.
pub struct Source {
    /// For the blocking `XREADGROUP` only: a blocked read would hold up other commands.
    reader: Conn,
    pub(crate) group: Group,
    prefetch: usize,
    block: Duration,
    claim_idle: Duration,
    /// Whether a stream has taken the job of reading back this consumer's own pending entries
    /// (one stream does it, or they would be handed out twice).
    resumed: AtomicBool,
}

impl Source {
    /// The consumer `consumer` of the group `group` on the stream `stream` of `server`: a URL
    /// (`redis://...`, `rediss://...` for TLS), a [`redis::Client`], or a Redis Cluster's
    /// [`redis::cluster::ClusterClient`] (see [`Server`]). `consumer` names this process
    /// within the group: give each process its own, stable across restarts if you want it to
    /// resume its own pending entries at once. Nothing connects until
    /// [`SourceBuilder::connect`].
    pub fn builder(
        server: impl Into<Server>,
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> SourceBuilder {
        SourceBuilder {
            server: server.into(),
            stream: stream.into(),
            group: group.into(),
            consumer: consumer.into(),
            prefetch: 100,
            dead_letters: None,
            block: Duration::from_millis(500),
            claim_idle: Duration::from_secs(60),
        }
    }

    /// The deliveries, for `Consumer::run`. An error item (a lost connection) is followed by a
    /// short pause; the stream goes on until [`close`](Source::close). May be called more than
    /// once: the streams read for the same consumer (over one connection, one read at a time),
    /// each entry going to one of them.
    pub fn deliveries(&self) -> Deliveries {
        let (retries, retried) = mpsc::unbounded_channel();
        let resume = !self.resumed.swap(true, Ordering::AcqRel);
        let state = Reading {
            reader: self.reader.clone(),
            group: self.group.clone(),
            count: self.prefetch,
            block: self.block,
            claim_idle: self.claim_idle,
            buffered: VecDeque::new(),
            retries,
            retried,
            last_claim: None,
            claim_cursor: "0-0".to_string(),
            history: resume.then(|| "0".to_string()),
            claimed_last: false,
            failed: false,
            _alive: self.group.lifecycle.track(),
        };
        let inner = stream::unfold(state, |mut state| async move {
            let next = state.next().await;
            Some((next, state))
        });
        Deliveries {
            inner: inner.take_until(self.group.lifecycle.stopped()).boxed(),
            stream: self.group.stream.to_string(),
        }
    }

    /// Stops reading (every stream of this source ends; a requeue waiting to claim its entry
    /// back is cut short), and waits up to [`CLOSE_TIMEOUT`] (30 s) for the streams and the
    /// deliveries still out to be settled or dropped. Entries read and not settled stay
    /// pending in the group: the next run under the same consumer name reads them back at
    /// once, and another consumer takes them over after `claim_idle`.
    pub async fn close(self) -> Result<(), Error> {
        let lifecycle = self.group.lifecycle.clone();
        lifecycle.stop();
        drop(self);
        if !lifecycle.drained(CLOSE_TIMEOUT).await {
            tracing::warn!(
                out = lifecycle.in_flight(),
                "deliveries still out {CLOSE_TIMEOUT:?} after close began; they stay pending"
            );
        }
        Ok(())
    }

    /// The dead-letter stream.
    pub fn dead_letter_stream(&self) -> &str {
        &self.group.dead_letters
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("stream", &self.group.stream)
            .field("group", &self.group.name)
            .field("consumer", &self.group.consumer)
            .field("dead_letters", &self.group.dead_letters)
            .finish_non_exhaustive()
    }
}

impl idem_runtime::consume::Source for Source {
    type Delivery = Delivery;
    type Error = Error;
    type Deliveries = Deliveries;

    fn deliveries(&self) -> Deliveries {
        Source::deliveries(self)
    }

    async fn lag(&self) -> Result<Vec<idem_runtime::consume::Lag>, Error> {
        Source::lag(self).await
    }

    async fn close(self) -> Result<(), Error> {
        Source::close(self).await
    }

    fn probe(&self) -> idem_runtime::consume::Probe {
        Source::probe(self)
    }
}

/// The deliveries of a [`Source`]: a `Stream<Item = Result<Delivery, Error>>` for
/// `Consumer::run`, until [`Source::close`].
pub struct Deliveries {
    inner: BoxStream<'static, Result<Delivery, Error>>,
    stream: String,
}

impl fmt::Debug for Deliveries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl Stream for Deliveries {
    type Item = Result<Delivery, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

/// The state of a stream of deliveries.
struct Reading {
    reader: Conn,
    pub(crate) group: Group,
    count: usize,
    block: Duration,
    claim_idle: Duration,
    buffered: VecDeque<Delivery>,
    /// Entries requeued with a delay come back here once claimed again.
    retries: mpsc::UnboundedSender<(StreamId, u32)>,
    retried: mpsc::UnboundedReceiver<(StreamId, u32)>,
    last_claim: Option<Instant>,
    claim_cursor: String,
    /// Until this consumer's own pending entries (left by an earlier run under the same name)
    /// are all read back: the id to read them after.
    history: Option<String>,
    /// The last step was a claim: read before claiming again.
    claimed_last: bool,
    failed: bool,
    /// The stream is out until dropped: the source's `close` waits for it.
    _alive: InFlight,
}

impl Reading {
    async fn next(&mut self) -> Result<Delivery, Error> {
        if std::mem::take(&mut self.failed) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        loop {
            if let Some(delivery) = self.buffered.pop_front() {
                return Ok(delivery);
            }
            while let Ok((entry, deliveries)) = self.retried.try_recv() {
                self.buffer(entry, deliveries);
            }
            if !self.buffered.is_empty() {
                continue;
            }
            // At least one read between two claims, so new entries flow even when claims are
            // due all the time (a short `claim_idle`).
            let due = !self.claimed_last
                && self
                    .last_claim
                    .is_none_or(|at| at.elapsed() >= self.claim_idle / 2);
            self.claimed_last = due && self.history.is_none();
            let result = if self.history.is_some() {
                self.recover().await
            } else if due {
                self.claim().await
            } else {
                self.read().await
            };
            if let Err(source) = result {
                self.failed = true;
                return Err(Error::Read {
                    stream: self.group.stream.to_string(),
                    source,
                });
            }
        }
    }

    fn buffer(&mut self, entry: StreamId, deliveries: u32) {
        self.buffered.push_back(Delivery::new(
            self.group.clone(),
            entry,
            deliveries,
            self.retries.clone(),
        ));
    }

    /// This consumer's own pending entries, which an earlier run under the same name read and
    /// did not settle (it crashed, or shut down with entries read and not started): read back
    /// at once (`XREADGROUP` from id 0), a page at a time, with their delivery counts.
    async fn recover(&mut self) -> RedisResult<()> {
        let after = self.history.clone().unwrap_or_default();
        let options = StreamReadOptions::default()
            .group(&*self.group.name, &*self.group.consumer)
            .count(self.count);
        let reply: Option<StreamReadReply> = self
            .reader
            .xread_options(&[&*self.group.stream], &[&after], &options)
            .await?;
        let entries: Vec<StreamId> = reply
            .map(|r| r.keys)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|key| key.ids)
            .collect();
        let Some(last) = entries.last().map(|e| e.id.clone()) else {
            self.history = None;
            return Ok(());
        };
        let mut conn = self.group.conn.clone();
        let counts = delivery_counts(&mut conn, &self.group, &entries).await?;
        tracing::info!(entries = entries.len(), stream = %self.group.stream, "resuming entries this consumer left pending");
        self.history = Some(last);
        for entry in entries {
            let deliveries = counts.get(&entry.id).copied().unwrap_or(2);
            self.buffer(entry, deliveries);
        }
        Ok(())
    }

    /// New entries: their first delivery.
    async fn read(&mut self) -> RedisResult<()> {
        let options = StreamReadOptions::default()
            .group(&*self.group.name, &*self.group.consumer)
            .count(self.count)
            .block(self.block.as_millis() as usize);
        let reply: Option<StreamReadReply> = self
            .reader
            .xread_options(&[&*self.group.stream], &[">"], &options)
            .await?;
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            for entry in key.ids {
                self.buffer(entry, 1);
            }
        }
        Ok(())
    }

    /// Entries idle longer than `claim_idle` in any consumer of the group, with their delivery
    /// counts (one `XPENDING` for the claimed batch).
    async fn claim(&mut self) -> RedisResult<()> {
        self.last_claim = Some(Instant::now());
        let group = &self.group;
        let mut conn = group.conn.clone();
        let idle = self.claim_idle.as_millis() as u64;
        let reply: StreamAutoClaimReply = conn
            .xautoclaim_options(
                &*group.stream,
                &*group.name,
                &*group.consumer,
                idle,
                &self.claim_cursor,
                StreamAutoClaimOptions::default().count(self.count),
            )
            .await?;
        self.claim_cursor = reply.next_stream_id;
        if reply.claimed.is_empty() {
            return Ok(());
        }
        let counts = delivery_counts(&mut conn, group, &reply.claimed).await?;
        tracing::info!(entries = reply.claimed.len(), stream = %group.stream, "took over entries left pending");
        for entry in reply.claimed {
            let deliveries = counts.get(&entry.id).copied().unwrap_or(2);
            self.buffer(entry, deliveries);
        }
        Ok(())
    }
}

/// The delivery counts of `entries` (pending in `group`), from one `XPENDING` per entry,
/// pipelined: one round trip for them all. (One range query would also return this consumer's
/// other pending entries between them and cut the wanted ones off at its count.)
async fn delivery_counts(
    conn: &mut Conn,
    group: &Group,
    entries: &[StreamId],
) -> RedisResult<HashMap<String, u32>> {
    let mut pipe = redis::pipe();
    for entry in entries {
        pipe.cmd("XPENDING")
            .arg(&*group.stream)
            .arg(&*group.name)
            .arg(&entry.id)
            .arg(&entry.id)
            .arg(1);
    }
    let pending: Vec<StreamPendingCountReply> = pipe.query_async(conn).await?;
    Ok(pending
        .into_iter()
        .flat_map(|reply| reply.ids)
        .map(|p| (p.id, u32::try_from(p.times_delivered).unwrap_or(u32::MAX)))
        .collect())
}
