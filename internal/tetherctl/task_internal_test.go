package tetherctl

import (
	"bytes"
	"strings"
	"testing"
	"text/tabwriter"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A task's Attempts are the leases that ran out, not its runs; the detail
// says so rather than "attempts: 0/3" for a task done on its first run.
func TestTaskDetailNamesLostLeases(t *testing.T) {
	for _, tc := range []struct {
		attempts, max int32
		want          string
	}{
		{0, 3, "lost leases:  0 (the task fails at 3)"},
		{2, 3, "lost leases:  2 (the task fails at 3)"},
	} {
		var b bytes.Buffer
		w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		(&App{}).taskDetail(w, &v1.Task{Id: "t", Status: v1.TaskStatus_TASK_STATUS_SUCCEEDED, Attempts: tc.attempts, MaxAttempts: tc.max})
		w.Flush()
		if !strings.Contains(b.String(), tc.want) || strings.Contains(b.String(), "attempts:") {
			t.Errorf("detail of a task with %d lost leases:\n%s\nwant a line %q", tc.attempts, b.String(), tc.want)
		}
	}
}
