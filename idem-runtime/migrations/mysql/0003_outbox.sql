-- idem 0003: the transactional outbox. A handler's `ctx.publish(..)` inserts a row here in the
-- handler's own transaction; `idem::outbox::Relay` publishes committed rows in `seq` order per
-- partition and marks them sent only after the broker confirmed them. Depends on no object of
-- the other migrations. Times are Unix epoch milliseconds of the server's UTC clock (BIGINT).
-- Each statement is safe to run again (DDL commits implicitly on MySQL).
CREATE TABLE IF NOT EXISTS idem_outbox (
    -- Insertion order: the order of the rows of one partition.
    seq           BIGINT         NOT NULL AUTO_INCREMENT,
    -- The message id, derived from the incoming message's scope and key plus a label or the
    -- publish's ordinal ("idem-" and 32 hex digits): a replayed handler writes the same id.
    id            VARCHAR(64)    CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    destination   VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    -- Messages with one destination and partition key are published in order ('' = none).
    partition_key VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL DEFAULT '',
    -- A hash of destination and partition key (0..255): the unit one relay owns at a time.
    partition_no  INT            NOT NULL,
    payload       LONGBLOB       NOT NULL,
    -- Extra headers as a JSON object of strings, or NULL.
    headers       TEXT           CHARACTER SET utf8mb4 NULL,
    created_at    BIGINT         NOT NULL,
    -- Not published before this time (a failed publish moves it on, with backoff).
    available_at  BIGINT         NOT NULL,
    attempts      INT            NOT NULL DEFAULT 0,
    last_error    TEXT           CHARACTER SET utf8mb4 NULL,
    -- Set once the broker confirmed the message; sent rows are purged after a retention.
    sent_at       BIGINT         NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY idem_outbox_id (id),
    -- The next rows of a partition, in order (sent ones are skipped on the index).
    INDEX idem_outbox_pending (partition_no, sent_at, seq),
    -- Bounded retention of sent rows.
    INDEX idem_outbox_sent (sent_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
