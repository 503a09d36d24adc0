package postgres

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tetherfleet/tether/controlplane/store/sqlstore"
)

// Advisory lock keys. Each is one 64-bit key in PostgreSQL's single
// advisory lock space, so they are drawn from a hash of a tether-specific
// name rather than small integers another application might use too.
var (
	migrateLockKey = lockKey("tether/migrate")
	eventsLockKey  = lockKey("tether/events")
)

// dialect is PostgreSQL's side of sqlstore. lost, when set, is told
// about every error that means a lost connection (see Store.connLost).
type dialect struct{ lost func() }

var (
	_ sqlstore.Dialect         = dialect{}
	_ sqlstore.EventSerializer = dialect{}
	_ sqlstore.TxRetrier       = dialect{}
	_ sqlstore.StatementCacher = dialect{}
)

// CachesStatements implements sqlstore.StatementCacher: pgx prepares
// each query text once per connection and keeps it (its default
// QueryExecModeCacheStatement).
func (dialect) CachesStatements() bool { return true }

func (dialect) Name() string       { return "postgres" }
func (dialect) LockRow() string    { return " FOR UPDATE" }
func (dialect) SkipLocked() string { return " FOR UPDATE SKIP LOCKED" }

// SerializeEvents implements sqlstore.EventSerializer. Sequence values are
// drawn at INSERT but become visible at COMMIT, so two transactions can
// publish event ids out of order. Each writer holds the events lock in
// shared mode from just before its INSERT to the end of its transaction:
// writers do not wait for each other, and their commits share WAL
// flushes. Only EventHorizon's brief exclusive hold waits for them.
func (dialect) SerializeEvents() string {
	return "SELECT pg_advisory_xact_lock_shared(" + strconv.FormatInt(eventsLockKey, 10) + ")"
}

// EventHorizon implements sqlstore.EventSerializer with the function of
// migration 0009: the events lock in exclusive mode, then the sequence's
// last value.
func (dialect) EventHorizon() string {
	return "SELECT tether_event_horizon(" + strconv.FormatInt(eventsLockKey, 10) + ")"
}

// Rebind turns ? placeholders into $1, $2, ... It leaves quoted text
// alone, so a literal '?' in a query stays a question mark.
func (dialect) Rebind(q string) string {
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	var quote byte
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// IsRetryable implements sqlstore.TxRetrier: 40P01 deadlock_detected (this
// transaction was chosen as the victim) and 40001 serialization_failure.
// Either way PostgreSQL rolled it back and a new attempt can succeed.
func (dialect) IsRetryable(err error) bool {
	c := sqlState(err)
	return c == "40P01" || c == "40001"
}

func (dialect) IsUniqueViolation(err error) bool     { return sqlState(err) == "23505" }
func (dialect) IsForeignKeyViolation(err error) bool { return sqlState(err) == "23503" }

func (d dialect) IsUnavailable(err error) bool {
	u := isUnavailable(err)
	if u && d.lost != nil {
		d.lost()
	}
	return u
}

// isUnavailable reports an error that says the server cannot be reached
// or is going away, not that it refused what we asked: a retry later can
// succeed without anyone changing anything.
func isUnavailable(err error) bool {
	if err == nil {
		return false
	}
	// The server answered. Only a few answers mean "not now": class 08
	// (connection exception), 57P01 admin_shutdown (fast shutdown or
	// pg_terminate_backend), 57P02 crash_shutdown, 57P03
	// cannot_connect_now (starting up, shutting down, recovering) and
	// 53300 too_many_connections. Anything else (a bad password, a missing
	// database, a constraint) would fail the same way on retry.
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"):
			return true
		case pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", pe.Code == "53300":
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.As(err, &ce): // dial or TLS failure; server-side refusals were handled above
		return true
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone), errors.Is(err, pgconn.ErrConnClosed):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	case errors.As(err, &ne):
		return true
	}
	// pgconn reports some broken connections only in text (for example
	// "conn closed" from a pooled connection the server dropped).
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "connection reset by peer") ||
		strings.Contains(msg, "broken pipe")
}
