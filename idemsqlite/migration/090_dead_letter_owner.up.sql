-- The owner of the consumer that wrote the dead letter (ConsumerConfig.Owner, a team or on-call
-- rotation), so that an operator sees whom a dead letter belongs to and alerts can route on it.
-- '' for dead letters written before this migration or by a consumer without an owner.
ALTER TABLE {{prefix}}dead_letters ADD COLUMN owner TEXT NOT NULL DEFAULT '';
