package postgres

// SerializeEventsSQL is the statement every event writer runs before its
// INSERT, for tests that play a writer caught between INSERT and COMMIT.
var SerializeEventsSQL = dialect{}.SerializeEvents()
