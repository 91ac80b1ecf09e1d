-- What the outbox gauges' query costs PostgreSQL on a large outbox (issue 35): 1,000,000 rows
-- in `idem_outbox` over 8 destinations, 995,000 of them sent and kept for the relay's
-- retention, 5,050 pending (the newest 5,000, and 50 old ones whose publish keeps failing).
-- The query is `OutboxAdmin::outbox_backlog`'s, as idem sends it: per destination, the pending
-- rows and the oldest one's time. For each case it prints the plan (EXPLAIN ANALYZE, BUFFERS,
-- after 5 warm-up runs) and the median time of 200 runs inside the server (`median_ms`):
--
--   A. the pending rows together at the end of the table, on the indexes of migration 0003;
--   B. the same with migration 0005's index (`idem_outbox_backlog`);
--   C. 5,000 more pending rows of a ninth destination spread over every page of the table
--      (its relay failed all week), on the indexes of migration 0003;
--   D. case C with migration 0005's index;
--   E. for comparison, `idem outbox`'s count (`OutboxAdmin::outbox_stats`), which reads every
--      row.
--
-- Run, from the repository's root:
--
--   psql "$IDEM_POSTGRES_URL" -v ON_ERROR_STOP=1 -v schema=gauges_bench_$$ -f benches/sql/outbox_gauges.sql
--
-- It works in a schema of its own (`schema`, default idem_outbox_gauges), dropped at the end.
\if :{?schema}
\else
\set schema idem_outbox_gauges
\endif
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS :"schema" CASCADE;
CREATE SCHEMA :"schema";
SET search_path = :"schema";
-- The outbox as migrated (client-side include, paths from the repository's root).
\i idem-runtime/migrations/postgres/0003_outbox.sql

-- The median time of `n` runs of `query`, in milliseconds, measured in the server.
CREATE FUNCTION pg_temp.median_ms(query text, n int) RETURNS numeric AS $$
DECLARE
    started timestamptz;
    times numeric[] := '{}';
BEGIN
    FOR i IN 1..n LOOP
        started := clock_timestamp();
        EXECUTE query;
        times := times || (EXTRACT(EPOCH FROM clock_timestamp() - started) * 1000)::numeric;
    END LOOP;
    RETURN round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY t) FROM unnest(times) t)::numeric, 3);
END $$ LANGUAGE plpgsql;

-- 995,000 sent rows over the last week (sent a second after they were written), then 5,000
-- pending ones written in the last minute, round-robin over 8 destinations.
INSERT INTO idem_outbox (id, destination, partition_key, partition_no, payload, headers,
                         created_at, available_at, attempts, sent_at)
SELECT 'm-' || i, 'destination-' || (i % 8), 'k-' || (i % 1000), (i % 1000) % 256,
       convert_to(repeat('x', 200), 'UTF8'), NULL,
       now() - interval '7 days' + (i * interval '7 days' / 1000000),
       now() - interval '7 days' + (i * interval '7 days' / 1000000), 0,
       CASE WHEN i <= 995000 THEN now() - interval '7 days' + (i * interval '7 days' / 1000000)
                                  + interval '1 second' END
FROM generate_series(1, 1000000) AS i;
-- 50 old rows whose publish keeps failing: pending among the sent ones.
UPDATE idem_outbox SET sent_at = NULL, attempts = 12, last_error = 'refused'
WHERE seq % 19900 = 7;
-- What autovacuum does for a table the relay writes all day.
VACUUM ANALYZE idem_outbox;
SELECT COUNT(*) AS rows, COUNT(*) FILTER (WHERE sent_at IS NULL) AS pending FROM idem_outbox;

\set gauges 'SELECT destination, COUNT(*), (EXTRACT(EPOCH FROM MIN(created_at)) * 1000)::BIGINT FROM idem_outbox WHERE sent_at IS NULL GROUP BY destination ORDER BY destination'
\set stats 'SELECT destination, COUNT(CASE WHEN sent_at IS NULL THEN 1 END), MIN(CASE WHEN sent_at IS NULL THEN created_at END), COUNT(CASE WHEN sent_at IS NULL AND attempts > 0 THEN 1 END), COALESCE(MAX(CASE WHEN sent_at IS NULL THEN attempts END), 0), COUNT(CASE WHEN sent_at IS NOT NULL THEN 1 END) FROM idem_outbox GROUP BY destination ORDER BY destination'

\echo
\echo '== A. pending rows together, indexes of migration 0003'
SELECT pg_temp.median_ms(:'gauges', 5) AS warm_up \g /dev/null
EXPLAIN (ANALYZE, BUFFERS) :gauges;
SELECT pg_temp.median_ms(:'gauges', 200) AS median_ms;

\echo
\echo '== B. pending rows together, with the index of migration 0005'
\i idem-runtime/migrations/postgres/0005_outbox_backlog.sql
VACUUM ANALYZE idem_outbox;
SELECT pg_temp.median_ms(:'gauges', 5) AS warm_up \g /dev/null
EXPLAIN (ANALYZE, BUFFERS) :gauges;
SELECT pg_temp.median_ms(:'gauges', 200) AS median_ms;
:gauges;

\echo
\echo '== C. 5,000 more pending rows spread over the table, indexes of migration 0003'
DROP INDEX idem_outbox_backlog;
-- Free one row's room on every 199th row's page, then fill those rooms with pending rows of a
-- ninth destination: they land all over the table, as a week of failing publishes would.
DELETE FROM idem_outbox WHERE seq % 199 = 11 AND sent_at IS NOT NULL;
VACUUM idem_outbox;
INSERT INTO idem_outbox (id, destination, partition_key, partition_no, payload, created_at,
                         available_at, attempts, last_error)
SELECT 'stuck-' || i, 'destination-stuck', 'k-' || i, i % 256,
       convert_to(repeat('x', 200), 'UTF8'),
       now() - interval '7 days' + (i * interval '7 days' / 5000),
       now() + interval '1 hour', 9, 'refused'
FROM generate_series(1, 5000) AS i;
VACUUM ANALYZE idem_outbox;
SELECT COUNT(*) AS rows, COUNT(*) FILTER (WHERE sent_at IS NULL) AS pending,
       COUNT(DISTINCT (ctid::text::point)[0]) FILTER (WHERE sent_at IS NULL) AS pages_with_pending
FROM idem_outbox;
SELECT pg_temp.median_ms(:'gauges', 5) AS warm_up \g /dev/null
EXPLAIN (ANALYZE, BUFFERS) :gauges;
SELECT pg_temp.median_ms(:'gauges', 200) AS median_ms;

\echo
\echo '== D. spread, with the index of migration 0005'
\i idem-runtime/migrations/postgres/0005_outbox_backlog.sql
VACUUM ANALYZE idem_outbox;
SELECT pg_temp.median_ms(:'gauges', 5) AS warm_up \g /dev/null
EXPLAIN (ANALYZE, BUFFERS) :gauges;
SELECT pg_temp.median_ms(:'gauges', 200) AS median_ms;

\echo
\echo '== E. for comparison: idem outbox (OutboxAdmin::outbox_stats), which reads every row'
SELECT pg_temp.median_ms(:'stats', 1) AS warm_up \g /dev/null
EXPLAIN (ANALYZE, BUFFERS) :stats;
SELECT pg_temp.median_ms(:'stats', 5) AS median_ms;

DROP SCHEMA :"schema" CASCADE;
