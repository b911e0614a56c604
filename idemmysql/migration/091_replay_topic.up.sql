-- Where a dead letter's message arrived (the JetStream subject, when the source knows it), so a
-- replay can go back there without the operator naming it; and where each replay went, so the
-- audit trail says it. '' when unknown (rows from before this migration, other actions).
--
-- MySQL has no ADD COLUMN IF NOT EXISTS and cannot roll DDL back, so each column is added only
-- when information_schema does not list it yet (an interrupted run is finished by the next).
SET @idem_ddl = (SELECT IF(count(*) = 0,
    'ALTER TABLE {{prefix}}dead_letters ADD COLUMN topic TEXT NULL',
    'DO 0')
    FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = '{{prefix}}dead_letters' AND column_name = 'topic');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
SET @idem_ddl = (SELECT IF(count(*) = 0,
    'ALTER TABLE {{prefix}}audit ADD COLUMN destination TEXT NULL',
    'DO 0')
    FROM information_schema.columns
    WHERE table_schema = DATABASE() AND table_name = '{{prefix}}audit' AND column_name = 'destination');
PREPARE idem_ddl FROM @idem_ddl;
EXECUTE idem_ddl;
DEALLOCATE PREPARE idem_ddl;
