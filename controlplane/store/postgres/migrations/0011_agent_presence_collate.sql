-- agent_presence.instance_id was made with the database's default
-- collation, while instances.id is COLLATE "C" like every other key (see
-- 0001). A claim's presence test compares the two under "C", which the
-- default-collation primary key cannot serve, so PostgreSQL scanned every
-- open presence for each candidate member: 32 claimers' p99 went from 22 ms
-- to 54-102 ms with 1,000 members (docs/benchmarks-pools.md). In "C" the
-- key is an index lookup again.
ALTER TABLE agent_presence ALTER COLUMN instance_id TYPE TEXT COLLATE "C";
ALTER TABLE agent_presence ALTER COLUMN replica TYPE TEXT COLLATE "C";
