-- idem: one row per applied message, and one version high-water mark per entity.
CREATE TABLE IF NOT EXISTS idem_records (
    scope        TEXT        NOT NULL,
    msg_key      BYTEA       NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, msg_key)
);

CREATE TABLE IF NOT EXISTS idem_versions (
    scope      TEXT        NOT NULL,
    entity     BYTEA       NOT NULL,
    version    BIGINT      NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, entity)
);
