-- idem on MySQL 8 / MariaDB 10.5+ (InnoDB): one row per applied (or, in lease mode, in-progress)
-- message, and one version high-water mark per entity.
--
-- Keys and entities are VARBINARY, compared byte for byte. Scope is text, compared exactly too:
-- a binary NO PAD collation (a `_ci` one would merge scopes that differ in case, a PAD SPACE one
-- such as utf8mb4_bin scopes that differ in trailing spaces). MariaDB calls it
-- utf8mb4_nopad_bin; on MySQL 8 (8.0.17+) use utf8mb4_0900_bin instead (idem::migrate does).
-- Lengths are idem's maxima (MAX_SCOPE_LEN = 255 bytes, which fit 255 characters, and
-- MAX_KEY_LEN = 512 bytes, refused before anything is written), so a primary key is at most
-- 4 * 255 + 512 = 1532 bytes: within InnoDB's 3072-byte index limit (DYNAMIC rows).
--
-- Times that idem compares (expires_at, lease_until, updated_ms) are Unix epoch milliseconds of
-- the database's UTC clock, as BIGINT: no 2038 limit (TIMESTAMP), no time-zone setting involved.
-- processed_at is DATETIME(6) in UTC, for people reading the table.
--
-- DDL commits implicitly on MySQL: each statement here is safe to run again (IF NOT EXISTS),
-- and idem records the migration only after all of them ran.
CREATE TABLE IF NOT EXISTS idem_records (
    scope        VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    msg_key      VARBINARY(512) NOT NULL,
    processed_at DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- When the record may be purged (processed_at + the handler's retention), epoch ms.
    expires_at   BIGINT         NOT NULL,
    -- Lease mode: set while the message is in progress (epoch ms), NULL once done.
    lease_until  BIGINT         NULL,
    lease_token  BIGINT         NULL,
    -- Deliveries that found this record already there. The claim's duplicate path bumps it,
    -- because sqlx sets CLIENT_FOUND_ROWS: an upsert that changes nothing reports 1 row, like
    -- an insert; one that changes this column reports 2.
    dup_count    BIGINT         NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, msg_key),
    -- Purges find expired records without scanning the table.
    INDEX idem_records_expires_at (expires_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

CREATE TABLE IF NOT EXISTS idem_versions (
    scope      VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    entity     VARBINARY(512) NOT NULL,
    version    BIGINT         NOT NULL,
    -- What the last upsert found (NULL: the row was inserted), and how many upserts found the
    -- row: the version upsert reads these back, since its rows affected cannot tell.
    prev       BIGINT         NULL,
    bumps      BIGINT         NOT NULL DEFAULT 0,
    -- When the version last advanced, epoch ms (purge_versions).
    updated_ms BIGINT         NOT NULL,
    PRIMARY KEY (scope, entity),
    INDEX idem_versions_updated_ms (updated_ms)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
