package postgres

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRebind(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`SELECT * FROM t WHERE a = ? AND b = ?`, `SELECT * FROM t WHERE a = $1 AND b = $2`},
		{`INSERT INTO t VALUES (?,?,?)`, `INSERT INTO t VALUES ($1,$2,$3)`},
		{`SELECT '?' FROM t WHERE a = ?`, `SELECT '?' FROM t WHERE a = $1`},
		{`SELECT "we?ird" FROM t WHERE a = ? AND b = 'it''s?' AND c = ?`, `SELECT "we?ird" FROM t WHERE a = $1 AND b = 'it''s?' AND c = $2`},
	} {
		if got := (dialect{}).Rebind(tc.in); got != tc.want {
			t.Errorf("Rebind(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestIsUnavailable(t *testing.T) {
	pgErr := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code} }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"admin shutdown", pgErr("57P01"), true},
		{"crash shutdown", pgErr("57P02"), true},
		{"starting up", fmt.Errorf("connect: %w", pgErr("57P03")), true},
		{"connection exception class", pgErr("08006"), true},
		{"too many connections", pgErr("53300"), true},
		{"connect error", &pgconn.ConnectError{}, true},
		{"bad conn", fmt.Errorf("begin: %w", driver.ErrBadConn), true},
		{"conn closed", fmt.Errorf("query: %w", pgconn.ErrConnClosed), true},
		{"unexpected eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"refused", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, true},
		{"reset", fmt.Errorf("x: %w", syscall.ECONNRESET), true},
		{"unique violation", pgErr("23505"), false},
		{"bad password", pgErr("28P01"), false},
		{"no such database", pgErr("3D000"), false},
		{"syntax error", pgErr("42601"), false},
		{"plain error", errors.New("boom"), false},
	} {
		if got := isUnavailable(tc.err); got != tc.want {
			t.Errorf("%s: isUnavailable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
