-- Event writers no longer take turns. Each takes the events lock in
-- shared mode just before it draws its ids and holds it to its commit;
-- a reader that follows ids calls this function first and reads only up
-- to the id it returns. Taking the lock in exclusive mode waits for every
-- writer that has drawn an id, so every id up to the sequence's last
-- value then belongs to a transaction that has ended: committed, and
-- visible to the reader's next statement, or rolled back. Run as its own
-- statement, the lock ends with it. The sequence draws one id at a time
-- (CACHE 1, the default): a session-cached range would put ids below
-- last_value that are not yet drawn.
CREATE FUNCTION tether_event_horizon(lock_key BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    RETURN COALESCE(pg_sequence_last_value('events_id_seq'), 0);
END
$$;
