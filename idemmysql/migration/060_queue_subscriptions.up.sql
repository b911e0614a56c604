-- Subscriptions: fan-out on the queue table. A publish to a topic with subscriptions inserts one
-- job per subscription, in the queue topic + '#' + name, in the same transaction; a topic
-- without any keeps one job in the queue named like the topic (competing consumers). The
-- primary key makes registering a subscription idempotent and serves the publish's lookup.
-- Binary like the queue column: the subscription's queue (topic, '#', name) must fit its 256 bytes.
CREATE TABLE IF NOT EXISTS {{prefix}}queue_subscriptions (
    topic      VARBINARY(255) NOT NULL,
    name       VARBINARY(255) NOT NULL,
    created_at BIGINT         NOT NULL,
    PRIMARY KEY (topic, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
