-- idem 0004: recoverability. Deliveries whose handler failed, parked for a retry later
-- (`idem_parked`), and deliveries that gave up (`idem_dead_letters`), each written in a
-- transaction before the broker is told, so nothing is lost between the two.

-- A failed delivery waiting for its retry: taken by one consumer at a time under a lease, run
-- through the handler again when due, deleted in the transaction of the run that decides it.
CREATE TABLE IF NOT EXISTS idem_parked (
    id              BIGSERIAL   PRIMARY KEY,
    -- The consumer's name (`Recovery::new(name)`): the consumers that run this row again.
    consumer        TEXT        NOT NULL,
    payload         BYTEA       NOT NULL,
    -- The delivery's headers as a JSON array of [name, value] pairs, or NULL.
    headers         TEXT,
    -- Where it came from: the broker, its queue/stream/topic, the broker's coordinates
    -- (partition and offset, sequence, entry id), and where a replay publishes it.
    broker          TEXT        NOT NULL,
    source          TEXT        NOT NULL,
    coordinates     TEXT        NOT NULL,
    destination     TEXT        NOT NULL,
    -- Failed runs so far, and the last one's error.
    attempts        INTEGER     NOT NULL,
    last_error      TEXT,
    first_failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Not run before this time.
    due_at          TIMESTAMPTZ NOT NULL,
    -- Taken by the consumer whose token this is, until then (a consumer killed mid-retry
    -- gives the row back when its lease runs out).
    lease_until     TIMESTAMPTZ,
    lease_token     BIGINT
);
-- The due rows of a consumer, oldest due first.
CREATE INDEX IF NOT EXISTS idem_parked_due ON idem_parked (consumer, due_at);

-- A delivery that gave up (poisoned, undecodable, bad key, conflict, over max_deliveries, out
-- of retries), for an operator to see, group, replay or discard (`idem dead-letters`).
CREATE TABLE IF NOT EXISTS idem_dead_letters (
    id              BIGSERIAL   PRIMARY KEY,
    consumer        TEXT        NOT NULL,
    -- The handler's scope and encoded key, where known (not for an undecodable payload).
    scope           TEXT,
    msg_key         BYTEA,
    -- Why: `idem::consume::DeadLetterReason::as_str` (poisoned, undecodable, ...).
    reason          TEXT        NOT NULL,
    -- The error's message, its shape (digits and ids taken out) and the group it falls in (a
    -- short hash of consumer, scope, reason and shape).
    error           TEXT        NOT NULL,
    error_shape     TEXT        NOT NULL,
    error_group     TEXT        NOT NULL,
    payload         BYTEA       NOT NULL,
    headers         TEXT,
    broker          TEXT        NOT NULL,
    source          TEXT        NOT NULL,
    coordinates     TEXT        NOT NULL,
    destination     TEXT        NOT NULL,
    attempts        INTEGER     NOT NULL,
    first_failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_failed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- dead, replayed or discarded; `settled_at` is when it stopped being dead, and retention
    -- counts from it.
    state           TEXT        NOT NULL DEFAULT 'dead',
    settled_at      TIMESTAMPTZ,
    -- The outbox message id of its last replay.
    replayed_as     TEXT
);
-- The operator's view: open dead letters by group.
CREATE INDEX IF NOT EXISTS idem_dead_letters_open ON idem_dead_letters (state, error_group, id);
-- Retention: dead letters by the time they died or were settled.
CREATE INDEX IF NOT EXISTS idem_dead_letters_age ON idem_dead_letters (last_failed_at);
