-- idem 0005: the outbox's backlog per destination, for the gauges (`idem::gauges`): how many
-- rows wait and since when, read from the pending rows alone (`sent_at IS NULL` is one range
-- of this covering index; InnoDB has no partial indexes), however many sent rows the relay
-- keeps for its retention. Safe to run again (MySQL 8 runs it without IF NOT EXISTS and takes
-- "duplicate key name" as an index an earlier, unrecorded run made).
CREATE INDEX IF NOT EXISTS idem_outbox_backlog ON idem_outbox (sent_at, destination, created_at);
