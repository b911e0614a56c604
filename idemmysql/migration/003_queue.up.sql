-- Queue: the embedded broker. A fetch leases a row until lease_until and increments its fencing
-- token; ack, nak and extend must present the current token. InnoDB keeps the AUTO_INCREMENT
-- counter across restarts (MySQL 8, MariaDB 10.2.4 and later), so a deleted job's id is never
-- reused and a stale (id, token) can never match a newer job.
CREATE TABLE IF NOT EXISTS {{prefix}}queue (
    id           BIGINT         NOT NULL AUTO_INCREMENT,
    queue        VARBINARY(256) NOT NULL,
    event_id     BLOB           NOT NULL,
    tenant       BLOB           NOT NULL,
    type         BLOB           NOT NULL,
    payload      LONGBLOB,
    headers      MEDIUMTEXT     NOT NULL,
    occurred_at  BIGINT         NULL,
    enqueued_at  BIGINT         NOT NULL,
    available_at BIGINT         NOT NULL,
    lease_until  BIGINT         NULL,
    token        BIGINT         NOT NULL DEFAULT 0,
    attempts     INT            NOT NULL DEFAULT 0,
    last_error   MEDIUMTEXT     NOT NULL,
    PRIMARY KEY (id),
    KEY {{prefix}}queue_fetch (queue, available_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
