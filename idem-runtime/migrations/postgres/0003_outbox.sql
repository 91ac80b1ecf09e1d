-- idem 0003: the transactional outbox. A handler's `ctx.publish(..)` inserts a row here in the
-- handler's own transaction; `idem::outbox::Relay` publishes committed rows in `seq` order per
-- partition and marks them sent only after the broker confirmed them.
CREATE TABLE IF NOT EXISTS idem_outbox (
    -- Insertion order: the order of the rows of one partition.
    seq           BIGSERIAL   PRIMARY KEY,
    -- The message id, derived from the incoming message's scope and key plus a label or the
    -- publish's ordinal: a replayed handler writes the same id.
    id            TEXT        NOT NULL,
    destination   TEXT        NOT NULL,
    -- Messages with one destination and partition key are published in order ('' = none).
    partition_key TEXT        NOT NULL DEFAULT '',
    -- A hash of destination and partition key (0..255): the unit one relay owns at a time.
    partition_no  INTEGER     NOT NULL,
    payload       BYTEA       NOT NULL,
    -- Extra headers as a JSON object of strings, or NULL.
    headers       TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Not published before this time (a failed publish moves it on, with backoff).
    available_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts      INTEGER     NOT NULL DEFAULT 0,
    last_error    TEXT,
    -- Set once the broker confirmed the message; sent rows are purged after a retention.
    sent_at       TIMESTAMPTZ
);

CREATE UNIQUE INDEX IF NOT EXISTS idem_outbox_id ON idem_outbox (id);
-- The next rows of a partition, in order.
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (partition_no, seq)
    WHERE sent_at IS NULL;
-- Bounded retention of sent rows.
CREATE INDEX IF NOT EXISTS idem_outbox_sent ON idem_outbox (sent_at) WHERE sent_at IS NOT NULL;
