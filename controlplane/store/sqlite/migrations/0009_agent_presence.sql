-- Agent presence (docs/design.md §2.10): which replica holds each agent's
-- stream, and until when its lease stands. A claim takes a member only
-- while its presence is open and its lease unexpired; the replica holding
-- the stream renews all its leases in one statement. No foreign key: a
-- pruned instance's presence is inert, and the stream path stays one write.
CREATE TABLE agent_presence (
    instance_id  TEXT PRIMARY KEY,
    replica      TEXT NOT NULL,
    stream_id    TEXT NOT NULL,
    connected_at BIGINT NOT NULL,
    lease_until  BIGINT NOT NULL,
    lost_at      BIGINT
);
CREATE INDEX agent_presence_replica ON agent_presence (replica) WHERE lost_at IS NULL;
