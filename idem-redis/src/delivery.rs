//! [`Delivery`]: one stream entry, settled with `XACK`, a delayed `XCLAIM`, or an `XADD`
//! to the dead-letter stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::consume::adapter::{InFlight, Lifecycle};
use idem_runtime::consume::{self, DeadLetterReason, Settle, SettleError};
use idem_runtime::recover::Origin;
use redis::streams::{StreamClaimReply, StreamId};
use redis::{AsyncCommands as _, Value};
use tokio::sync::mpsc;

use crate::headers::{self, PAYLOAD};
use crate::server::Conn;

/// Dead-letters one entry atomically (a script runs alone on the server): if the entry is still
/// pending in the group, `XADD` it to the dead-letter stream and `XACK` it; else nothing (another
/// consumer that took it over settled it first). So a crash never leaves a dead letter without its
/// ack or an ack without its dead letter, and two holders of one entry write one dead letter.
/// KEYS: stream, dead-letter stream. ARGV: group, entry id, then the dead letter's fields and
/// values. Returns 1 if written, 0 if not.
const DEAD_LETTER: &str = r"
if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1) == 0 then return 0 end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
";

/// The group a delivery belongs to, and the connection that settles it.
#[derive(Clone)]
pub(crate) struct Group {
    pub conn: Conn,
    pub stream: Arc<str>,
    pub name: Arc<str>,
    pub consumer: Arc<str>,
    pub dead_letters: Arc<str>,
    pub lifecycle: Lifecycle,
}

impl Group {
    pub fn new(
        conn: Conn,
        stream: &str,
        name: &str,
        consumer: &str,
        dead_letters: &str,
        lifecycle: Lifecycle,
    ) -> Self {
        Group {
            conn,
            stream: stream.into(),
            name: name.into(),
            consumer: consumer.into(),
            dead_letters: dead_letters.into(),
            lifecycle,
        }
    }
}

/// One entry of the stream, delivered to this consumer and not yet settled. Its payload is the
/// entry's [`PAYLOAD`] field (an entry without one is dead-lettered as undecodable).
pub struct Delivery {
    group: Group,
    id: String,
    payload: Vec<u8>,
    /// The entry's other fields (the outbox's [`headers::MESSAGE_ID`], ...).
    fields: HashMap<String, Value>,
    deliveries: u32,
    retries: mpsc::UnboundedSender<(StreamId, u32)>,
    /// Out until settled or dropped: the source's `close` waits for it.
    out: InFlight,
}

impl Delivery {
    pub(crate) fn new(
        group: Group,
        entry: StreamId,
        deliveries: u32,
        retries: mpsc::UnboundedSender<(StreamId, u32)>,
    ) -> Self {
        let mut fields = entry.map;
        let payload = match fields.remove(PAYLOAD) {
            Some(Value::BulkString(bytes)) => bytes,
            Some(Value::SimpleString(text)) => text.into_bytes(),
            _ => Vec::new(),
        };
        let out = group.lifecycle.track();
        Delivery {
            group,
            id: entry.id,
            payload,
            fields,
            deliveries,
            retries,
            out,
        }
    }

    /// The entry's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A field of the entry other than [`PAYLOAD`], such as the message id the outbox
    /// publisher writes ([`headers::MESSAGE_ID`]); `None` if the entry has no such field.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        match self.fields.get(name)? {
            Value::BulkString(bytes) => Some(bytes),
            Value::SimpleString(text) => Some(text.as_bytes()),
            _ => None,
        }
    }
}

impl consume::Delivery for Delivery {
    fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn deliveries(&self) -> Option<u32> {
        Some(self.deliveries)
    }

    /// The entry's fields other than [`PAYLOAD`] and the outbox's own
    /// [`headers::MESSAGE_ID`] and [`headers::PARTITION_KEY`], by name, values as text (invalid
    /// UTF-8 replaced). A header the outbox wrote under [`headers::HEADER_PREFIX`] is given by
    /// its own name, so that a replay through the outbox writes it back as it was; any other
    /// field keeps its name (and a replay writes it as a header, under the prefix).
    fn headers(&self) -> Vec<(String, String)> {
        let mut pairs: Vec<(String, String)> = self
            .fields
            .iter()
            .filter(|(name, _)| {
                name.as_str() != headers::MESSAGE_ID && name.as_str() != headers::PARTITION_KEY
            })
            .map(|(name, value)| {
                let name = name.strip_prefix(headers::HEADER_PREFIX).unwrap_or(name);
                (name.to_string(), text(value))
            })
            .collect();
        pairs.sort();
        pairs
    }

    /// Broker [`BROKER`](crate::BROKER); source and destination the stream; coordinates
    /// `entry <id>`.
    fn origin(&self) -> Origin {
        Origin {
            broker: crate::BROKER.to_string(),
            source: self.group.stream.to_string(),
            coordinates: format!("entry {}", self.id),
            destination: self.group.stream.to_string(),
        }
    }

    /// The entry's [`headers::MESSAGE_ID`] field.
    fn message_id(&self) -> Option<String> {
        self.fields.get(headers::MESSAGE_ID).map(text)
    }

    /// The consumer group.
    fn consumer_group(&self) -> Option<String> {
        Some(self.group.name.to_string())
    }

    fn describe(&self) -> String {
        format!("{} {}", self.group.stream, self.id)
    }

    /// One `XACK` with every entry id of the batch (per stream and group), not one per entry.
    async fn ack_all(deliveries: Vec<Self>) -> Vec<Result<(), SettleError>> {
        let mut results: Vec<Result<(), SettleError>> = deliveries.iter().map(|_| Ok(())).collect();
        // A consumer reads one group of one stream, so this is one `XACK` in practice.
        let mut groups: Vec<(Group, Vec<(usize, String)>)> = Vec::new();
        for (at, delivery) in deliveries.into_iter().enumerate() {
            let group = &delivery.group;
            match groups
                .iter_mut()
                .find(|(g, _)| g.stream == group.stream && g.name == group.name)
            {
                Some((_, ids)) => ids.push((at, delivery.id)),
                None => groups.push((delivery.group, vec![(at, delivery.id)])),
            }
        }
        for (group, ids) in groups {
            let entry_ids: Vec<&str> = ids.iter().map(|(_, id)| id.as_str()).collect();
            let acked: redis::RedisResult<i64> = group
                .conn
                .clone()
                .xack(&*group.stream, &*group.name, &entry_ids)
                .await;
            if let Err(err) = acked {
                for (at, _) in &ids {
                    results[*at] = Err(format!("XACK {}: {err}", group.stream).into());
                }
            }
        }
        results
    }

    async fn settle(self, settle: Settle) -> Result<(), SettleError> {
        let Delivery {
            group,
            id,
            payload,
            deliveries,
            retries,
            fields,
            out,
        } = self;
        let mut conn = group.conn.clone();
        match settle {
            Settle::Ack => {
                let _: i64 = conn.xack(&*group.stream, &*group.name, &[&id]).await?;
            }
            Settle::DeadLetter { reason } => {
                let mut own = vec![
                    (PAYLOAD, payload),
                    (headers::REASON, reason.as_str().as_bytes().to_vec()),
                    (headers::DETAIL, reason.to_string().into_bytes()),
                    (headers::DELIVERIES, deliveries.to_string().into_bytes()),
                ];
                if let DeadLetterReason::Poisoned { attempts } = &reason {
                    own.push((headers::ATTEMPTS, attempts.to_string().into_bytes()));
                }
                own.push((headers::SOURCE, group.stream.as_bytes().to_vec()));
                own.push((headers::SOURCE_ID, id.as_bytes().to_vec()));
                let fields = dead_letter_fields(own, fields);
                let mut eval = redis::cmd("EVAL");
                eval.arg(DEAD_LETTER)
                    .arg(2)
                    .arg(&*group.stream)
                    .arg(&*group.dead_letters)
                    .arg(&*group.name)
                    .arg(&id);
                for (field, value) in &fields {
                    eval.arg(field.as_str()).arg(value.as_slice());
                }
                let written: i64 = eval.query_async(&mut conn).await?;
                if written == 0 {
                    tracing::info!(entry = %id, stream = %group.stream, "not dead-lettered: another consumer settled the entry first");
                }
            }
            Settle::Requeue { delay } => {
                // The entry stays pending here; after the delay, claim it again (which counts a
                // delivery) and hand it back to the reader. If this process dies first, another
                // consumer's XAUTOCLAIM takes it over; if the source closes first, it stays
                // pending for the next run under this consumer name.
                let closing = group.lifecycle.stopped();
                tokio::spawn(async move {
                    let _out = out;
                    tokio::select! {
                        () = tokio::time::sleep(delay.min(Duration::from_secs(3600))) => {}
                        () = closing => return,
                    }
                    let claimed: redis::RedisResult<StreamClaimReply> = conn
                        .xclaim(&*group.stream, &*group.name, &*group.consumer, 0, &[&id])
                        .await;
                    match claimed {
                        Ok(reply) => {
                            for entry in reply.ids {
                                let _ = retries.send((entry, deliveries.saturating_add(1)));
                            }
                        }
                        Err(err) => {
                            tracing::warn!(entry = %id, error = %err, "could not claim a requeued entry back; XAUTOCLAIM will")
                        }
                    }
                });
            }
            _ => return Err("a settlement this adapter does not know".into()),
        }
        Ok(())
    }
}

/// A field's value as text (an entry's values are strings; anything else in a readable form).
fn text(value: &Value) -> String {
    match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

/// A dead letter's fields: its own (payload, reason, ...), then the entry's other fields as
/// they were (the outbox's message id and partition key, headers), by name, so that a replay from
/// the dead-letter stream keeps the id downstream consumers dedupe on. An entry's field named
/// like one of the dead letter's own is left out; a field that is not a string is too.
fn dead_letter_fields(
    own: Vec<(&str, Vec<u8>)>,
    entry: HashMap<String, Value>,
) -> Vec<(String, Vec<u8>)> {
    let mut carried: Vec<(String, Vec<u8>)> = entry
        .into_iter()
        .filter(|(name, _)| !own.iter().any(|(own, _)| own == name))
        .filter_map(|(name, value)| match value {
            Value::BulkString(bytes) => Some((name, bytes)),
            Value::SimpleString(text) => Some((name, text.into_bytes())),
            _ => None,
        })
        .collect();
    carried.sort();
    own.into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .chain(carried)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_letter_keeps_the_entrys_other_fields_after_its_own() {
        let entry = HashMap::from([
            (
                headers::MESSAGE_ID.to_string(),
                Value::BulkString(b"idem-1".to_vec()),
            ),
            (
                headers::REASON.to_string(),
                Value::BulkString(b"theirs".to_vec()),
            ),
            (
                "idem-header-trace".to_string(),
                Value::SimpleString("t".into()),
            ),
            ("odd".to_string(), Value::Int(7)),
        ]);
        let own = vec![
            (PAYLOAD, b"{}".to_vec()),
            (headers::REASON, b"ours".to_vec()),
            (headers::DETAIL, b"poisoned: ...".to_vec()),
            (headers::DELIVERIES, b"3".to_vec()),
            (headers::SOURCE, b"s".to_vec()),
            (headers::SOURCE_ID, b"1-0".to_vec()),
        ];
        let fields = dead_letter_fields(own, entry);
        let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                PAYLOAD,
                headers::REASON,
                headers::DETAIL,
                headers::DELIVERIES,
                headers::SOURCE,
                headers::SOURCE_ID,
                "idem-header-trace",
                headers::MESSAGE_ID,
            ]
        );
        assert_eq!(fields[1].1, b"ours");
        assert_eq!(fields[7].1, b"idem-1");
    }
}
