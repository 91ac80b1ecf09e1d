-- idem: one row per applied (or, in lease mode, in-progress) message, and one version
-- high-water mark per entity. All times come from the database's clock.
CREATE TABLE IF NOT EXISTS idem_records (
    scope        TEXT        NOT NULL,
    msg_key      BYTEA       NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When the record may be purged (processed_at + the handler's retention).
    expires_at   TIMESTAMPTZ NOT NULL,
    -- Lease mode: set while the message is in progress, NULL once done.
    lease_until  TIMESTAMPTZ,
    lease_token  BIGINT,
    PRIMARY KEY (scope, msg_key)
);

-- Purges find expired records without scanning the table.
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);

CREATE TABLE IF NOT EXISTS idem_versions (
    scope      TEXT        NOT NULL,
    entity     BYTEA       NOT NULL,
    version    BIGINT      NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, entity)
);
