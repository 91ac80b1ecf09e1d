//! `ctx.publish(..)`: an outbox row written in the handler's own transaction, with an id
//! derived from the delivery.

use std::future::Future;

use serde::Serialize;

use crate::context::{Context, OutboxLabel};
use crate::store::Tx;

use super::message::{check_headers, check_names, encode_headers, partition_of, InvalidMessage};
use super::store::{NewRow, OutboxStore};

impl Context {
    /// Publishes `payload` (as serde JSON) to `destination` through the outbox: inserts the
    /// message into `idem_outbox` in the handler's transaction `tx`, so that it reaches the
    /// broker (through an [`outbox::Relay`](crate::outbox::Relay)) if and only if the
    /// transaction commits. Returns the message's id, derived from this delivery and the
    /// publish's ordinal among the handler's unlabelled publishes (0, 1, ...), so a handler
    /// that runs again publishes the same ids if it publishes in the same order.
    ///
    /// For a partition key, a label or headers, use [`outgoing`](Context::outgoing).
    /// A payload that does not serialize, or a bad destination, fails with
    /// `sqlx::Error::Encode` (an [`InvalidMessage`]) and writes nothing.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?;
    /// idem::migrate(&pool).await?;
    /// let ctx = idem::Context::new("orders::on_placed", b"order-7".to_vec(), None);
    /// let mut tx = pool.begin().await?;
    /// let id = ctx.publish(&mut tx, "payments", &"charge 7").await?;
    /// tx.commit().await?;
    /// let stored: String = sqlx::query_scalar("SELECT id FROM idem_outbox").fetch_one(&pool).await?;
    /// assert_eq!(stored, id);
    /// # Ok::<(), sqlx::Error>(()) }).unwrap();
    /// ```
    pub fn publish<'t, 'c, DB, P>(
        &self,
        tx: &'t mut Tx<'c, DB>,
        destination: &str,
        payload: &P,
    ) -> impl Future<Output = Result<String, sqlx::Error>> + Send + use<'t, 'c, DB, P>
    where
        DB: OutboxStore,
        P: Serialize + ?Sized,
    {
        self.outgoing(destination).publish(tx, payload)
    }

    /// A message to `destination` to shape before [`Outgoing::publish`]: a partition key (the
    /// order the relay keeps), a label (what its id derives from instead of the ordinal), and
    /// headers.
    pub fn outgoing(&self, destination: &str) -> Outgoing<'_> {
        Outgoing {
            ctx: self,
            destination: destination.to_owned(),
            partition_key: String::new(),
            label: None,
            headers: Vec::new(),
        }
    }
}

/// A message being shaped for the outbox ([`Context::outgoing`]); nothing is written until
/// [`publish`](Outgoing::publish).
#[derive(Debug)]
#[must_use = "nothing is written until `publish`"]
pub struct Outgoing<'a> {
    ctx: &'a Context,
    destination: String,
    partition_key: String,
    label: Option<String>,
    headers: Vec<(String, String)>,
}

impl Outgoing<'_> {
    /// Messages with one destination and partition key are published in the order they were
    /// written (an order id, an account). Without one, all of a destination's messages are
    /// one ordered sequence. Publishers carry it in a header, so `publish` refuses one over 255
    /// bytes or with a line break or NUL.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.partition_key = key.into();
        self
    }

    /// Derives the id from `label` (unique within the handler) instead of the publish's
    /// ordinal: the id then stays the same when the handler's other publishes change.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Adds a header, which publishers pass on (AMQP headers, NATS headers). `publish` refuses a
    /// name that is not 1 to 255 visible ASCII characters (or holds `:`), or a value with a line
    /// break or NUL: every broker must be able to carry it.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Writes the message into `idem_outbox` through `tx` and returns its id. Everything is
    /// checked before the write: on error nothing is written and no ordinal is taken.
    pub fn publish<'t, 'c, DB, P>(
        self,
        tx: &'t mut Tx<'c, DB>,
        payload: &P,
    ) -> impl Future<Output = Result<String, sqlx::Error>> + Send + use<'t, 'c, DB, P>
    where
        DB: OutboxStore,
        P: Serialize + ?Sized,
    {
        let prepared = self.prepare(payload);
        async move {
            let (id, partition_no, payload, headers, destination, partition_key) = prepared?;
            let row = NewRow {
                id: &id,
                destination: &destination,
                partition_key: &partition_key,
                partition_no,
                payload: &payload,
                headers: headers.as_deref(),
            };
            DB::insert_outbox(&mut **tx, row).await?;
            Ok(id)
        }
    }

    /// Checks and encodes the message, then takes its id.
    #[allow(clippy::type_complexity)]
    fn prepare<P: Serialize + ?Sized>(
        #[cfg_attr(not(feature = "otel"), allow(unused_mut))] mut self,
        payload: &P,
    ) -> Result<(String, i32, Vec<u8>, Option<String>, String, String), sqlx::Error> {
        // The trace of the transaction that writes the row, taken now, not when it is sent.
        #[cfg(feature = "otel")]
        crate::otel::capture(&mut self.headers);
        let refuse = |why: InvalidMessage| sqlx::Error::Encode(Box::new(why));
        check_names(&self.destination, &self.partition_key).map_err(refuse)?;
        check_headers(&self.headers).map_err(refuse)?;
        if self.label.as_deref() == Some("") {
            return Err(refuse(InvalidMessage::new("the label is empty")));
        }
        let payload = serde_json::to_vec(payload).map_err(|err| {
            refuse(InvalidMessage::new(format!(
                "the payload does not serialize: {err}"
            )))
        })?;
        let id = match &self.label {
            Some(label) => self.ctx.outbox_id(OutboxLabel::Label(label)),
            None => self
                .ctx
                .outbox_id(OutboxLabel::Ordinal(self.ctx.next_ordinal())),
        };
        let partition_no = partition_of(&self.destination, &self.partition_key);
        let headers = encode_headers(&self.headers);
        Ok((
            id,
            partition_no,
            payload,
            headers,
            self.destination,
            self.partition_key,
        ))
    }
}
