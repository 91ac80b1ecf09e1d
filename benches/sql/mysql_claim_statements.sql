-- What a claim's INSERT costs the MariaDB / MySQL server, per statement (issue 15), measured
-- inside the server: no client, no network, and one transaction for each batch of 20,000
-- inserts, so no fsync either; only the statement's CPU and its row and index writes remain.
-- Five statements, 5 rounds interleaved, microseconds per insert printed each round. Run:
--
--   mariadb -h127.0.0.1 -uroot < benches/sql/mysql_claim_statements.sql    # from the repository's root
--
-- Times are SYSDATE(6): NOW() inside a procedure is the time its CALL started.
--
-- It works in a database of its own (idem_claim_statements), dropped at the end. Keys are
-- UUID() strings, as the modes bench's are UUID-shaped.
--   one-column     the seed's pattern: INSERT IGNORE INTO processed_messages (message_id)
--   classic        the classic pattern on a table of idem's shape (scope, key, time, its index)
--   idem           idem's claim as sent (binds inlined): the upsert, expires_at from the clock
--   idem-ignore    the same row with INSERT IGNORE in place of the upsert
--   idem-constant  the upsert with expires_at a constant, not computed from the clock
DROP DATABASE IF EXISTS idem_claim_statements;
CREATE DATABASE idem_claim_statements;
USE idem_claim_statements;
-- idem's tables as migrated (client-side `source`, paths from the repository's root).
source idem-runtime/migrations/mysql/0001_idempotency.sql
source idem-runtime/migrations/mysql/0002_handler_features.sql
-- The modes bench's tables for the hand-written patterns.
CREATE TABLE bench_processed (consumer VARCHAR(255) NOT NULL, message_id VARCHAR(255) NOT NULL,
    processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (consumer, message_id), INDEX bench_processed_at (processed_at)) ENGINE = InnoDB;
CREATE TABLE processed_messages (message_id VARCHAR(255) PRIMARY KEY) ENGINE = InnoDB;
CREATE TABLE timings (round INT, variant VARCHAR(20), us DOUBLE);

DELIMITER //
CREATE PROCEDURE claim(variant VARCHAR(20), n INT)
BEGIN
  DECLARE i INT DEFAULT 0;
  START TRANSACTION;
  WHILE i < n DO
    CASE variant
    WHEN 'one-column' THEN
      INSERT IGNORE INTO processed_messages (message_id) VALUES (UUID());
    WHEN 'classic' THEN
      INSERT IGNORE INTO bench_processed (consumer, message_id) VALUES ('bench::consumer', UUID());
    WHEN 'idem' THEN
      INSERT INTO idem_records (scope, msg_key, processed_at, expires_at)
      VALUES ('bench::credit_key', UUID(), UTC_TIMESTAMP(6),
              (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + 604800000)
      ON DUPLICATE KEY UPDATE dup_count = dup_count + 1;
    WHEN 'idem-ignore' THEN
      INSERT IGNORE INTO idem_records (scope, msg_key, processed_at, expires_at)
      VALUES ('bench::credit_key', UUID(), UTC_TIMESTAMP(6),
              (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + 604800000);
    WHEN 'idem-constant' THEN
      INSERT INTO idem_records (scope, msg_key, processed_at, expires_at)
      VALUES ('bench::credit_key', UUID(), UTC_TIMESTAMP(6), 1764800000000 + i)
      ON DUPLICATE KEY UPDATE dup_count = dup_count + 1;
    END CASE;
    SET i = i + 1;
  END WHILE;
  COMMIT;
END //

CREATE PROCEDURE rounds(n INT, inserts INT)
BEGIN
  DECLARE r INT DEFAULT 1;
  DECLARE t DATETIME(6);
  WHILE r <= n DO
    SET t = SYSDATE(6); CALL claim('one-column', inserts);
    INSERT INTO timings VALUES (r, 'one-column', TIMESTAMPDIFF(MICROSECOND, t, SYSDATE(6)) / inserts);
    SET t = SYSDATE(6); CALL claim('classic', inserts);
    INSERT INTO timings VALUES (r, 'classic', TIMESTAMPDIFF(MICROSECOND, t, SYSDATE(6)) / inserts);
    SET t = SYSDATE(6); CALL claim('idem', inserts);
    INSERT INTO timings VALUES (r, 'idem', TIMESTAMPDIFF(MICROSECOND, t, SYSDATE(6)) / inserts);
    SET t = SYSDATE(6); CALL claim('idem-ignore', inserts);
    INSERT INTO timings VALUES (r, 'idem-ignore', TIMESTAMPDIFF(MICROSECOND, t, SYSDATE(6)) / inserts);
    SET t = SYSDATE(6); CALL claim('idem-constant', inserts);
    INSERT INTO timings VALUES (r, 'idem-constant', TIMESTAMPDIFF(MICROSECOND, t, SYSDATE(6)) / inserts);
    SET r = r + 1;
  END WHILE;
END //
DELIMITER ;

CALL rounds(5, 20000);
SELECT variant, GROUP_CONCAT(ROUND(us, 2) ORDER BY round SEPARATOR ' ') AS us_per_insert_by_round
FROM timings GROUP BY variant ORDER BY MIN(us);
DROP DATABASE idem_claim_statements;
