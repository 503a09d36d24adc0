package sqlstore

import (
	"database/sql"
	"encoding/json"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Times are stored as BIGINT microseconds since the epoch: the same type on
// both backends, no time-zone surprises, and index-friendly.

func ts(t time.Time) int64 { return t.UnixMicro() }

func nts(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixMicro()
}

func fromTS(v int64) time.Time { return time.UnixMicro(v).UTC() }

func fromNTS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromTS(v.Int64)
	return &t
}

// nstr stores "" as NULL, for columns with partial uniqueness.
func nstr(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func jsonList(ss []string) string {
	if len(ss) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(ss)
	return string(b)
}

func parseList(s string) []string {
	var out []string
	if s == "" || s == "[]" {
		return nil
	}
	_ = json.Unmarshal([]byte(s), &out)
	return out
}

func jsonObject(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "{}"
	}
	return string(raw)
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }

type scanner interface{ Scan(dest ...any) error }

// prefixCols qualifies a column list with a table alias.
func prefixCols(prefix, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = prefix + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}
