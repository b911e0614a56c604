-- Where a dead letter's message arrived (the JetStream subject, when the source knows it), so a
-- replay can go back there without the operator naming it; and where each replay went, so the
-- audit trail says it. '' when unknown (rows from before this migration, other actions).
ALTER TABLE "{{schema}}"."{{prefix}}dead_letters" ADD COLUMN IF NOT EXISTS topic text NOT NULL DEFAULT '';
ALTER TABLE "{{schema}}"."{{prefix}}audit" ADD COLUMN IF NOT EXISTS destination text NOT NULL DEFAULT '';
