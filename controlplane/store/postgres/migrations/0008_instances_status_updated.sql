-- The liveness loop asks every tick for booting instances whose row has
-- not changed for the boot timeout. Through the status index that read
-- visited every booting instance: in a mass boot of 40,000, a third of
-- tetherd's CPU. Keyed on (status, updated_at) it visits only the rows
-- past the limit. Heartbeats do not touch updated_at, so the index costs
-- nothing on the hot write. It serves every status-only lookup the old
-- index did, so that one goes.
CREATE INDEX instances_status_updated ON instances (status, updated_at);
DROP INDEX instances_status;
-- Without statistics SQLite's planner took the new index over the
-- terminate reconciler's partial one (both keyed on status alone); with
-- the intent's time as its second column the partial index matches one
-- more term of that query and is chosen again.
DROP INDEX instances_terminate_requested;
CREATE INDEX instances_terminate_requested ON instances (status, terminate_requested_at) WHERE terminate_requested_at IS NOT NULL;
