//! [`StreamSource`]: reads a consumer group's entries in batches, with `XAUTOCLAIM` of entries a
//! dead consumer left pending.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures_util::stream::{self, Stream};
use redis::aio::MultiplexedConnection;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamPendingCountReply,
    StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands as _, RedisError, RedisResult};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::delivery::{Group, RedisDelivery};

/// A consumer of one stream in one consumer group. Build it with
/// [`connect`](StreamSource::connect), set its options, then hand
/// [`deliveries`](StreamSource::deliveries) to `idem::consume::Consumer::run`.
pub struct StreamSource {
    /// For the blocking `XREADGROUP` only: a blocked read would hold up other commands.
    reader: MultiplexedConnection,
    group: Group,
    count: usize,
    block: Duration,
    claim_idle: Duration,
}

impl StreamSource {
    /// Connects to `url` and creates the consumer group `group` on `stream` (and the stream)
    /// if it does not exist yet, starting from the stream's beginning. `consumer` names this
    /// process within the group: give each process its own, stable across restarts if you
    /// want it to resume its own pending entries at once.
    pub async fn connect(
        url: &str,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> RedisResult<StreamSource> {
        let client = redis::Client::open(url)?;
        let reader = client.get_multiplexed_async_connection().await?;
        let mut writer = client.get_multiplexed_async_connection().await?;
        let created: RedisResult<()> = writer.xgroup_create_mkstream(stream, group, "0").await;
        match created {
            Ok(()) => {}
            Err(err) if err.code() == Some("BUSYGROUP") => {}
            Err(err) => return Err(err),
        }
        let dead_letters = format!("{stream}:dead");
        Ok(StreamSource {
            reader,
            group: Group::new(writer, stream, group, consumer, &dead_letters),
            count: 100,
            block: Duration::from_millis(500),
            claim_idle: Duration::from_secs(60),
        })
    }

    /// Entries read per `XREADGROUP` (default 100): match the consumer's `batch`.
    pub fn count(mut self, n: usize) -> Self {
        self.count = n.max(1);
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

    /// Where dead letters go (default `<stream>:dead`).
    pub fn dead_letter_stream(mut self, stream: &str) -> Self {
        self.group.set_dead_letters(stream);
        self
    }

    /// The deliveries, for `Consumer::run`. An error item (a lost connection) is followed by a
    /// short pause; the stream goes on.
    pub fn deliveries(self) -> impl Stream<Item = Result<RedisDelivery, RedisError>> + Send {
        let (retries, retried) = mpsc::unbounded_channel();
        let state = Reading {
            source: self,
            buffered: VecDeque::new(),
            retries,
            retried,
            last_claim: None,
            claim_cursor: "0-0".to_string(),
            history: Some("0".to_string()),
            claimed_last: false,
            failed: false,
        };
        stream::unfold(state, |mut state| async move {
            let next = state.next().await;
            Some((next, state))
        })
    }
}

/// The state of a stream of deliveries.
struct Reading {
    source: StreamSource,
    buffered: VecDeque<RedisDelivery>,
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
}

impl Reading {
    async fn next(&mut self) -> Result<RedisDelivery, RedisError> {
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
                    .is_none_or(|at| at.elapsed() >= self.source.claim_idle / 2);
            self.claimed_last = due && self.history.is_none();
            let result = if self.history.is_some() {
                self.recover().await
            } else if due {
                self.claim().await
            } else {
                self.read().await
            };
            if let Err(err) = result {
                self.failed = true;
                return Err(err);
            }
        }
    }

    fn buffer(&mut self, entry: StreamId, deliveries: u32) {
        self.buffered.push_back(RedisDelivery::new(
            self.source.group.clone(),
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
            .group(&*self.source.group.name, &*self.source.group.consumer)
            .count(self.source.count);
        let reply: Option<StreamReadReply> = self
            .source
            .reader
            .xread_options(&[&*self.source.group.stream], &[&after], &options)
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
        let mut conn = self.source.group.conn.clone();
        let counts = delivery_counts(&mut conn, &self.source.group, &entries).await?;
        tracing::info!(entries = entries.len(), stream = %self.source.group.stream, "resuming entries this consumer left pending");
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
            .group(&*self.source.group.name, &*self.source.group.consumer)
            .count(self.source.count)
            .block(self.source.block.as_millis() as usize);
        let reply: Option<StreamReadReply> = self
            .source
            .reader
            .xread_options(&[&*self.source.group.stream], &[">"], &options)
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
        let group = &self.source.group;
        let mut conn = group.conn.clone();
        let idle = self.source.claim_idle.as_millis() as u64;
        let reply: StreamAutoClaimReply = conn
            .xautoclaim_options(
                &*group.stream,
                &*group.name,
                &*group.consumer,
                idle,
                &self.claim_cursor,
                StreamAutoClaimOptions::default().count(self.source.count),
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
    conn: &mut MultiplexedConnection,
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
