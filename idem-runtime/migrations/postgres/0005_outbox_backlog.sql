-- idem 0005: the outbox's backlog per destination, for the gauges (`idem::gauges`): how many
-- rows wait and since when, read from the pending rows alone (an index-only scan of this
-- partial index), however many sent rows the relay keeps for its retention.
CREATE INDEX IF NOT EXISTS idem_outbox_backlog ON idem_outbox (destination, created_at)
    WHERE sent_at IS NULL;
