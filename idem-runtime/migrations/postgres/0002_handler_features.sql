-- idem 0002: what the handler options `fingerprint`, `replay` and `max_attempts` store.
-- Databases created by 0001 gain the columns empty (NULL): their records still dedupe, and a
-- record without a fingerprint or a result is a plain duplicate.

-- `fingerprint = "..."`: SHA-256 of the payload (32 bytes); `replay = true`: the handler's
-- `Ok` value as JSON. On the record, and on the version row in key + version mode.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS fingerprint BYTEA;
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS result BYTEA;
ALTER TABLE idem_versions ADD COLUMN IF NOT EXISTS fingerprint BYTEA;
ALTER TABLE idem_versions ADD COLUMN IF NOT EXISTS result BYTEA;

-- `max_attempts = N`: failed attempts of a message, committed in a transaction of their own
-- (never in the rolled-back one); removed when the message is applied.
CREATE TABLE IF NOT EXISTS idem_attempts (
    scope      TEXT        NOT NULL,
    msg_key    BYTEA       NOT NULL,
    attempts   INTEGER     NOT NULL,
    last_error TEXT,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, msg_key)
);
