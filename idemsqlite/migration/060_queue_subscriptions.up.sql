-- Subscriptions: fan-out on the queue table. A publish to a topic with subscriptions inserts one
-- job per subscription, in the queue topic || '#' || name, in the same transaction; a topic
-- without any keeps one job in the queue named like the topic (competing consumers). The
-- primary key makes registering a subscription idempotent and serves the publish's lookup.
CREATE TABLE IF NOT EXISTS {{prefix}}queue_subscriptions (
    topic      TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (topic, name)
) WITHOUT ROWID;
