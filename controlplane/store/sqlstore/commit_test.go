package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"
)

// A commit that finds its transaction already rolled back because the
// caller's context ended says so with the context's error, which the API
// maps to Canceled or DeadlineExceeded. Before, it was "transaction has
// already been committed or rolled back", an internal error logged at
// ERROR (make rolling caught it: its load drops calls after a few ms).
func TestCommitErrNamesTheCallerWhoGaveUp(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	late, cancelLate := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancelLate()
	other := errors.New("disk full")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want []error // wrapped
		not  error
	}{
		{"canceled caller", canceled, sql.ErrTxDone, []error{context.Canceled}, nil},
		{"caller past its deadline", late, sql.ErrTxDone, []error{context.DeadlineExceeded}, nil},
		{"live caller, tx done", context.Background(), sql.ErrTxDone, []error{sql.ErrTxDone}, context.Canceled},
		{"canceled caller, another failure", canceled, other, []error{other}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := commitErr(tc.ctx, tc.err)
			for _, w := range tc.want {
				if !errors.Is(got, w) {
					t.Fatalf("commitErr = %v; want it to wrap %v", got, w)
				}
			}
			if tc.not != nil && errors.Is(got, tc.not) {
				t.Fatalf("commitErr = %v; must not claim %v", got, tc.not)
			}
		})
	}
}
