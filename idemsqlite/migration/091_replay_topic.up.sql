-- Where a dead letter's message arrived (the JetStream subject, when the source knows it), so a
-- replay can go back there without the operator naming it; and where each replay went, so the
-- audit trail says it. '' when unknown (rows from before this migration, other actions).
ALTER TABLE {{prefix}}dead_letters ADD COLUMN topic TEXT NOT NULL DEFAULT '';
ALTER TABLE {{prefix}}audit ADD COLUMN destination TEXT NOT NULL DEFAULT '';
