-- What a record costs the PostgreSQL server, per retention-index option (issue 15), measured
-- inside the server: no client, no network, no fsync (synchronous_commit = off), so only the
-- insert's CPU and its WAL remain. Each option claims 4,000 new UUID-shaped keys, one
-- transaction each; 7 rounds interleaved; the median per claim is printed. Run:
--
--   psql "$IDEM_POSTGRES_URL" -v ON_ERROR_STOP=1 -f benches/sql/retention_options.sql
--
-- It works in a schema of its own (idem_retention_options), dropped at the end.
--   one        the seed's pattern: message_id TEXT PRIMARY KEY
--   one_btree  the same plus a processed_at column with a B-tree (a purge index)
--   rec_none   idem's record row (0001 + 0002 columns) without a retention index
--   rec_brin   idem's record row with a BRIN index on expires_at
--   rec_btree  idem's record row as migrated: a B-tree on expires_at
SET synchronous_commit = off;
DROP SCHEMA IF EXISTS idem_retention_options CASCADE;
CREATE SCHEMA idem_retention_options;
SET search_path = idem_retention_options;
CREATE TABLE one (message_id text PRIMARY KEY);
CREATE TABLE one_btree (message_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX ON one_btree (processed_at);
CREATE TABLE rec_btree (scope text NOT NULL, msg_key bytea NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), expires_at timestamptz NOT NULL,
    lease_until timestamptz, lease_token bigint, fingerprint bytea, result bytea,
    PRIMARY KEY (scope, msg_key));
CREATE INDEX ON rec_btree (expires_at);
CREATE TABLE rec_none (LIKE rec_btree INCLUDING DEFAULTS);
ALTER TABLE rec_none ADD PRIMARY KEY (scope, msg_key);
CREATE TABLE rec_brin (LIKE rec_btree INCLUDING DEFAULTS);
ALTER TABLE rec_brin ADD PRIMARY KEY (scope, msg_key);
CREATE INDEX ON rec_brin USING brin (expires_at);
CREATE TABLE results (tbl text, round int, wal_bytes numeric, ms numeric);

CREATE PROCEDURE fill(tbl text, n int, round int) LANGUAGE plpgsql AS $$
DECLARE l0 pg_lsn; t0 timestamptz; id text;
BEGIN
  l0 := pg_current_wal_insert_lsn(); t0 := clock_timestamp();
  FOR i IN 1..n LOOP
    id := md5(tbl || round || '-' || i)::uuid::text;
    IF tbl = 'one' THEN
      INSERT INTO one VALUES (id) ON CONFLICT DO NOTHING;
    ELSIF tbl = 'one_btree' THEN
      INSERT INTO one_btree (message_id) VALUES (id) ON CONFLICT DO NOTHING;
    ELSIF tbl = 'rec_btree' THEN
      INSERT INTO rec_btree (scope, msg_key, expires_at) VALUES ('bench::credit',
        convert_to(id, 'UTF8'), now() + 604800000::bigint * interval '1 millisecond') ON CONFLICT DO NOTHING;
    ELSIF tbl = 'rec_none' THEN
      INSERT INTO rec_none (scope, msg_key, expires_at) VALUES ('bench::credit',
        convert_to(id, 'UTF8'), now() + 604800000::bigint * interval '1 millisecond') ON CONFLICT DO NOTHING;
    ELSIF tbl = 'rec_brin' THEN
      INSERT INTO rec_brin (scope, msg_key, expires_at) VALUES ('bench::credit',
        convert_to(id, 'UTF8'), now() + 604800000::bigint * interval '1 millisecond') ON CONFLICT DO NOTHING;
    END IF;
    COMMIT;
  END LOOP;
  INSERT INTO results VALUES (tbl, round, pg_current_wal_insert_lsn() - l0,
    extract(epoch FROM clock_timestamp() - t0) * 1000);
  COMMIT;
END $$;
-- A procedure that commits must be called outside a transaction block: \gexec sends each CALL
-- as a statement of its own.
SELECT format('CALL fill(%L, 4000, %s)', t, r)
  FROM generate_series(1, 7) r,
       unnest(ARRAY['one', 'one_btree', 'rec_none', 'rec_brin', 'rec_btree']) WITH ORDINALITY u (t, k)
  ORDER BY r, k \gexec
SELECT tbl AS option,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY wal_bytes / 4000)::numeric) AS wal_bytes_per_claim,
       round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms * 1000 / 4000)::numeric, 1) AS us_per_claim,
       round(min(ms * 1000 / 4000), 1) AS us_min, round(max(ms * 1000 / 4000), 1) AS us_max
  FROM results GROUP BY tbl ORDER BY us_per_claim;
DROP SCHEMA idem_retention_options CASCADE;
