-- idem 0004: recoverability. Deliveries whose handler failed, parked for a retry later
-- (`idem_parked`), and deliveries that gave up (`idem_dead_letters`), each written in a
-- transaction before the broker is told, so nothing is lost between the two. Times are Unix
-- epoch milliseconds of the server's UTC clock (BIGINT). Each statement is safe to run again
-- (DDL commits implicitly on MySQL).

-- A failed delivery waiting for its retry: taken by one consumer at a time under a lease, run
-- through the handler again when due, deleted in the transaction of the run that decides it.
CREATE TABLE IF NOT EXISTS idem_parked (
    id              BIGINT         NOT NULL AUTO_INCREMENT,
    -- The consumer's name (`Recovery::new(name)`): the consumers that run this row again.
    consumer        VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    payload         LONGBLOB       NOT NULL,
    -- The delivery's headers as a JSON array of [name, value] pairs, or NULL.
    headers         MEDIUMTEXT     CHARACTER SET utf8mb4 NULL,
    -- Where it came from: the broker, its queue/stream/topic, the broker's coordinates
    -- (partition and offset, sequence, entry id), and where a replay publishes it.
    broker          VARCHAR(32)    CHARACTER SET ascii NOT NULL,
    source          VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    coordinates     VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    destination     VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    -- Failed runs so far, and the last one's error.
    attempts        INT            NOT NULL,
    last_error      MEDIUMTEXT     CHARACTER SET utf8mb4 NULL,
    first_failed_at BIGINT         NOT NULL,
    -- Not run before this time.
    due_at          BIGINT         NOT NULL,
    -- Taken by the consumer whose token this is, until then (a consumer killed mid-retry
    -- gives the row back when its lease runs out).
    lease_until     BIGINT         NULL,
    lease_token     BIGINT         NULL,
    PRIMARY KEY (id),
    -- The due rows of a consumer, oldest due first.
    INDEX idem_parked_due (consumer, due_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;

-- A delivery that gave up (poisoned, undecodable, bad key, conflict, over max_deliveries, out
-- of retries), for an operator to see, group, replay or discard (`idem dead-letters`).
CREATE TABLE IF NOT EXISTS idem_dead_letters (
    id              BIGINT         NOT NULL AUTO_INCREMENT,
    consumer        VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    -- The handler's scope and encoded key, where known (not for an undecodable payload).
    scope           VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NULL,
    msg_key         VARBINARY(512) NULL,
    -- Why: `idem::consume::DeadLetterReason::as_str` (poisoned, undecodable, ...).
    reason          VARCHAR(32)    CHARACTER SET ascii NOT NULL,
    -- The error's message, its shape (digits and ids taken out) and the group it falls in (a
    -- short hash of consumer, scope, reason and shape).
    error           MEDIUMTEXT     CHARACTER SET utf8mb4 NOT NULL,
    error_shape     MEDIUMTEXT     CHARACTER SET utf8mb4 NOT NULL,
    error_group     VARCHAR(16)    CHARACTER SET ascii NOT NULL,
    payload         LONGBLOB       NOT NULL,
    headers         MEDIUMTEXT     CHARACTER SET utf8mb4 NULL,
    broker          VARCHAR(32)    CHARACTER SET ascii NOT NULL,
    source          VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    coordinates     VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    destination     VARCHAR(255)   CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
    attempts        INT            NOT NULL,
    first_failed_at BIGINT         NOT NULL,
    last_failed_at  BIGINT         NOT NULL,
    -- dead, replayed or discarded; `settled_at` is when it stopped being dead, and retention
    -- counts from it.
    state           VARCHAR(16)    CHARACTER SET ascii NOT NULL DEFAULT 'dead',
    settled_at      BIGINT         NULL,
    -- The outbox message id of its last replay.
    replayed_as     VARCHAR(64)    CHARACTER SET ascii NULL,
    PRIMARY KEY (id),
    -- The operator's view: open dead letters by group.
    INDEX idem_dead_letters_open (state, error_group, id),
    -- Retention: dead letters by the time they died or were settled.
    INDEX idem_dead_letters_age (last_failed_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
