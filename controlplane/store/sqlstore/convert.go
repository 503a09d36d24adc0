package sqlstore

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
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

// Instance and pool member states are stored by their names. These four
// functions are the only place a state crosses the database boundary; a name
// the lifecycle does not know is refused on the way in and on the way out,
// so a bad row fails loudly instead of flowing upward as a state nobody
// handles.

func storedState(s lifecycle.State) (string, error) {
	if !s.Valid() {
		return "", fmt.Errorf("store instance state: %w %q", lifecycle.ErrUnknownState, s)
	}
	return string(s), nil
}

func parseStoredState(name string) (lifecycle.State, error) {
	s, err := lifecycle.ParseState(name)
	if err != nil {
		return "", fmt.Errorf("read instance state: %w", err)
	}
	return s, nil
}

func storedPoolState(s lifecycle.PoolState) (string, error) {
	if _, err := lifecycle.ParsePoolState(string(s)); err != nil {
		return "", fmt.Errorf("store pool member state: %w", err)
	}
	return string(s), nil
}

func parseStoredPoolState(name string) (lifecycle.PoolState, error) {
	s, err := lifecycle.ParsePoolState(name)
	if err != nil {
		return lifecycle.NoPool, fmt.Errorf("read pool member state: %w", err)
	}
	return s, nil
}

// storedStates converts a filter's states to query arguments.
func storedStates[S ~string](states []S, stored func(S) (string, error)) ([]any, error) {
	out := make([]any, len(states))
	for i, s := range states {
		name, err := stored(s)
		if err != nil {
			return nil, err
		}
		out[i] = name
	}
	return out, nil
}

func jsonList(ss []string) string {
	if len(ss) == 0 {
		return "[]"
	}
	b, err := json.Marshal(ss)
	if err != nil {
		// Marshalling a []string cannot fail; if it ever does, the
		// stored value must not silently become something else.
		panic(fmt.Sprintf("encode a string list: %v", err))
	}
	return string(b)
}

// parseList reads a JSON string list column. A value that does not parse
// is an error naming the column, never an empty list: an instance whose
// addresses silently read as none looks like one that reported none.
func parseList(column, s string) ([]string, error) {
	var out []string
	if s == "" || s == "[]" {
		return nil, nil
	}
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("column %s holds %q, not a JSON string list: %w", column, clip(s, 64), err)
	}
	return out, nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
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

// Task statuses and targets are closed sets, stored by their names and
// checked both ways as the states are.

func storedTaskStatus(s store.TaskStatus) (string, error) {
	if _, err := store.ParseTaskStatus(string(s)); err != nil {
		return "", fmt.Errorf("store task status: %w", err)
	}
	return string(s), nil
}

func parseStoredTaskStatus(name string) (store.TaskStatus, error) {
	s, err := store.ParseTaskStatus(name)
	if err != nil {
		return "", fmt.Errorf("read task status: %w", err)
	}
	return s, nil
}

func storedTaskTarget(t store.TaskTarget) (string, error) {
	if _, err := store.ParseTaskTarget(string(t)); err != nil {
		return "", fmt.Errorf("store task target: %w", err)
	}
	return string(t), nil
}

func parseStoredTaskTarget(name string) (store.TaskTarget, error) {
	t, err := store.ParseTaskTarget(name)
	if err != nil {
		return "", fmt.Errorf("read task target: %w", err)
	}
	return t, nil
}
