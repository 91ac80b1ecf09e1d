-- idem 0002 on MySQL 8 / MariaDB: what the handler options `fingerprint`, `replay` and
-- `max_attempts` store. Databases created by 0001 gain the columns empty (NULL): their records
-- still dedupe, and a record without a fingerprint or a result is a plain duplicate.
--
-- DDL commits implicitly on MySQL: each statement may run again (IF NOT EXISTS) if a migrator
-- stopped before idem recorded this migration. MariaDB takes `ADD COLUMN IF NOT EXISTS`;
-- MySQL 8 does not, so idem::migrate runs these statements there without it, one by one, and
-- takes "duplicate column" (1060) as "already added".

-- `fingerprint = "..."`: SHA-256 of the payload (32 bytes); `replay = true`: the handler's
-- `Ok` value as JSON, at most idem's MAX_REPLAY_LEN (64 KiB, one byte more than a BLOB holds).
-- On the record, and on the version row in key + version mode.
ALTER TABLE idem_records ADD COLUMN IF NOT EXISTS fingerprint VARBINARY(32) NULL,
    ADD COLUMN IF NOT EXISTS result MEDIUMBLOB NULL;
ALTER TABLE idem_versions ADD COLUMN IF NOT EXISTS fingerprint VARBINARY(32) NULL,
    ADD COLUMN IF NOT EXISTS result MEDIUMBLOB NULL;

-- `max_attempts = N`: failed attempts of a message, committed in a transaction of their own
-- (never in the rolled-back one); removed when the message is applied. `updated_ms`: when the
-- last failure was counted, epoch milliseconds of the server's UTC clock.
CREATE TABLE IF NOT EXISTS idem_attempts (
    scope      VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    msg_key    VARBINARY(512) NOT NULL,
    attempts   INT            NOT NULL,
    last_error MEDIUMTEXT     CHARACTER SET utf8mb4 NULL,
    updated_ms BIGINT         NOT NULL,
    PRIMARY KEY (scope, msg_key)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
