-- idem: one row per applied (or, in lease mode, in-progress) message, and one version
-- high-water mark per entity. Times in SQLite are Unix epoch milliseconds (the database's clock),
-- except processed_at/updated_at, kept as ISO-8601 text for people reading the table.
CREATE TABLE IF NOT EXISTS idem_records (
    scope        TEXT    NOT NULL,
    msg_key      BLOB    NOT NULL,
    processed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- When the record may be purged (processed_at + the handler's retention).
    expires_at   INTEGER NOT NULL,
    -- Lease mode: set while the message is in progress, NULL once done.
    lease_until  INTEGER,
    lease_token  INTEGER,
    PRIMARY KEY (scope, msg_key)
) WITHOUT ROWID;

-- Purges find expired records without scanning the table.
CREATE INDEX IF NOT EXISTS idem_records_expires_at ON idem_records (expires_at);

CREATE TABLE IF NOT EXISTS idem_versions (
    scope      TEXT    NOT NULL,
    entity     BLOB    NOT NULL,
    version    INTEGER NOT NULL,
    updated_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (scope, entity)
) WITHOUT ROWID;
