-- idem: one row per applied message, and one version high-water mark per entity.
CREATE TABLE IF NOT EXISTS idem_records (
    scope        TEXT NOT NULL,
    msg_key      BLOB NOT NULL,
    processed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (scope, msg_key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS idem_versions (
    scope      TEXT    NOT NULL,
    entity     BLOB    NOT NULL,
    version    INTEGER NOT NULL,
    updated_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (scope, entity)
) WITHOUT ROWID;
