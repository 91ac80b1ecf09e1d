//! [`Source::lag`]: the consumer group's lag and pending entries, as Redis tells them.

use idem_runtime::consume::Lag;
use redis::streams::StreamInfoGroupsReply;
use redis::AsyncCommands as _;

use crate::error::Error;
use crate::source::Source;
use crate::BROKER;

impl Source {
    /// How far behind the consumer group is, from `XINFO GROUPS` (Redis 7+): the group's
    /// `lag` (entries of the stream not yet delivered to the group: `undelivered`; `None` when
    /// Redis cannot tell, after entries were deleted from the middle of the stream) and its
    /// `pending` count (delivered to one of its consumers and not acked: `unacked`). `group`
    /// is the group's name. For `idem::gauges::Gauges::lag_of`.
    pub async fn lag(&self) -> Result<Vec<Lag>, Error> {
        let group = &self.group;
        let mut conn = group.conn.clone();
        let reply: StreamInfoGroupsReply =
            conn.xinfo_groups(&*group.stream)
                .await
                .map_err(|source| Error::Request {
                    what: format!("reading the groups of the stream {:?}", &*group.stream),
                    source,
                })?;
        let ours = reply
            .groups
            .into_iter()
            .find(|g| g.name == *group.name)
            .ok_or_else(|| Error::Request {
                what: format!(
                    "reading the group {:?} of the stream {:?}",
                    &*group.name, &*group.stream
                ),
                source: redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "the group is not on the stream any more",
                )),
            })?;
        Ok(vec![Lag {
            broker: BROKER,
            source: group.stream.to_string(),
            group: group.name.to_string(),
            partition: None,
            undelivered: ours.lag.map(|n| n as u64),
            unacked: Some(ours.pending as u64),
        }])
    }
}
