package postgres

// SerializeEventsSQL is the lock every event writer takes first in its
// INSERT, for tests that play a writer caught between INSERT and COMMIT.
var SerializeEventsSQL = dialect{}.SerializeEvents()

// EventsLockKey is the advisory lock event writers hold shared.
var EventsLockKey = eventsLockKey
