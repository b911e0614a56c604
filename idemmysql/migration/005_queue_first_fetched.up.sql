-- When a job was first fetched (unix microseconds, like the table's other times), so that a
-- consumer's retry budget (elapsed time) counts from the first attempt even when the process
-- that made it is gone. A fetch sets it once (COALESCE); a release that takes the job's only
-- attempt back clears it. NULL: never fetched, or fetched before this migration (the next fetch
-- sets it). No index holds it.
--
-- MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB does), and a migration must be idempotent
-- (MySQL cannot roll DDL back, so an interrupted one runs again): the column is added only when
-- information_schema does not list it yet.
SET @idem_ddl = (SELECT IF(count(*) = 0,
    'ALTER TABLE {{prefix}}queue ADD COLUMN first_fetched_at BIGINT NULL',
    'DO 0')
    FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = '{{prefix}}queue' AND column_name = 'first_fetched_at');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
