-- The owner of the consumer that wrote the dead letter (ConsumerConfig.Owner, a team or on-call
-- rotation), so that an operator sees whom a dead letter belongs to and alerts can route on it.
-- '' for dead letters written before this migration or by a consumer without an owner.
--
-- MySQL has no ADD COLUMN IF NOT EXISTS (MariaDB does), and a migration must be idempotent
-- (MySQL cannot roll DDL back, so an interrupted one runs again): the column is added only when
-- information_schema does not list it yet.
SET @idem_ddl = (SELECT IF(count(*) = 0,
    'ALTER TABLE {{prefix}}dead_letters ADD COLUMN owner VARCHAR(64) NOT NULL DEFAULT \'\'',
    'DO 0')
    FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = '{{prefix}}dead_letters' AND column_name = 'owner');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
