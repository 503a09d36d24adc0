package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// healthy is a record set in which every invariant holds.
func healthy() (*Ledger, Observed) {
	l := &Ledger{}
	l.Task("t1")
	l.Claim(Claim{ClaimID: "c1", InstanceID: "i1", PoolID: "p", Asked: now})
	l.Release(Release{InstanceID: "i1", ClaimID: "c1"})
	l.Claim(Claim{ClaimID: "c2", InstanceID: "i2", PoolID: "p"})
	// i1's machine died after its claim: no violation.
	l.Die(Death{InstanceID: "i1", At: now.Add(time.Second)})
	l.Enroll(Enrollment{InstanceID: "i1", TokenHash: "h1"})
	l.Enroll(Enrollment{InstanceID: "i2", TokenHash: "h2"})
	l.Terminate("i1")
	l.Replay(false)
	rec := l.Stream()
	for _, id := range []string{"e1", "e2", "e3"} {
		rec(id)
	}
	o := Observed{Now: now, FakeProvider: "fake",
		Events: []Event{
			{ID: "e1", Kind: kindEnrolled, InstanceID: "i1"},
			{ID: "e2", Kind: kindEnrolled, InstanceID: "i2"},
			{ID: "e3", Kind: kindClaimed, InstanceID: "i1", CorrelationID: "c1"},
			{ID: "e4", Kind: kindReleased, InstanceID: "i1", CorrelationID: "c1"},
			{ID: "e5", Kind: kindClaimed, InstanceID: "i2", CorrelationID: "c2"},
		},
		Instances: []Instance{{ID: "i1", Provider: "fake", Status: "terminated", Terminated: true}, {ID: "i2", Provider: "fake", Status: "running"},
			// Provider sync errored it when its machine vanished: no machine is due.
			{ID: "i3", Provider: "fake", Status: "error"}},
		Tasks:    []Task{{ID: "t1", Status: "succeeded"}, {ID: "t2", Status: "running", LeaseExpires: now.Add(time.Minute)}},
		Machines: []string{"i2"},
	}
	return l, o
}

func TestCheckHealthy(t *testing.T) {
	l, o := healthy()
	for _, r := range Check(l, o) {
		if !r.OK() || r.Checked == 0 {
			t.Errorf("%s: checked %d, violations %v", r.Name, r.Checked, r.Violations)
		}
	}
}

// Each case breaks one invariant on purpose; the checker must name it and
// leave the others alone.
func TestCheckReportsBrokenInvariants(t *testing.T) {
	for _, tc := range []struct {
		name   string
		breakf func(*Ledger, *Observed)
		broken string
		says   string
	}{
		{"double claim", func(l *Ledger, o *Observed) {
			l.Claim(Claim{ClaimID: "c3", InstanceID: "i2", PoolID: "p"})
			o.Events = append(o.Events, Event{ID: "e6", Kind: kindClaimed, InstanceID: "i2", CorrelationID: "c3"})
		}, "each ready member claimed at most once", "while claim c2 was open"},
		{"missing acknowledged task", func(l *Ledger, o *Observed) {
			l.Task("t-lost")
		}, "every acknowledged write is present", "task t-lost"},
		{"missing acknowledged enrollment", func(l *Ledger, o *Observed) {
			l.Enroll(Enrollment{InstanceID: "i9", TokenHash: "h9"})
		}, "every acknowledged write is present", "enrollment of instance i9"},
		{"missing acknowledged terminate", func(l *Ledger, o *Observed) {
			l.Terminate("i2")
		}, "every acknowledged write is present", "terminate of instance i2"},
		{"acknowledged claim without its event", func(l *Ledger, o *Observed) {
			l.Claim(Claim{ClaimID: "c-lost", InstanceID: "i3", PoolID: "p"})
		}, "claims == pool.claimed events; releases match", "c-lost"},
		{"orphaned machine", func(l *Ledger, o *Observed) {
			o.Machines = append(o.Machines, "i1")
		}, "no orphaned machine (provider == store)", "machine of instance i1"},
		{"instance without machine", func(l *Ledger, o *Observed) {
			o.Machines = nil
		}, "no orphaned machine (provider == store)", "instance i2 is running"},
		{"stuck task", func(l *Ledger, o *Observed) {
			o.Tasks = append(o.Tasks, Task{ID: "t3", Status: "running", LeaseExpires: now.Add(-time.Minute)})
		}, "no stuck task", "task t3"},
		{"token accepted twice", func(l *Ledger, o *Observed) {
			l.Enroll(Enrollment{InstanceID: "i2", TokenHash: "h1"})
		}, "no token accepted twice", "one token enrolled"},
		{"replay accepted", func(l *Ledger, o *Observed) {
			l.Replay(true)
		}, "no token accepted twice", "replayed tokens were accepted"},
		{"live event lost", func(l *Ledger, o *Observed) {
			l.Stream()("e-gone")
		}, "event log has no gaps for a resuming watcher", "e-gone"},
		{"live events out of order", func(l *Ledger, o *Observed) {
			rec := l.Stream()
			rec("e5")
			rec("e4")
		}, "event log has no gaps for a resuming watcher", "delivered after a later event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A lost claim rightly breaks the acknowledged-write check too.
			also := map[string]string{"acknowledged claim without its event": "every acknowledged write is present"}[tc.name]
			l, o := healthy()
			tc.breakf(l, &o)
			found := false
			for _, r := range Check(l, o) {
				if r.Name != tc.broken {
					if !r.OK() && r.Name != also {
						t.Errorf("unrelated invariant %q broke: %v", r.Name, r.Violations)
					}
					continue
				}
				found = true
				if r.OK() || !strings.Contains(strings.Join(r.Violations, "\n"), tc.says) {
					t.Errorf("%s: violations %v, want one saying %q", r.Name, r.Violations, tc.says)
				}
			}
			if !found {
				t.Fatalf("no invariant named %q", tc.broken)
			}
		})
	}
}

func TestNoDeadClaimed(t *testing.T) {
	died := time.Date(2026, 12, 4, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		asked time.Time
		bad   bool
	}{
		{"before the death", died.Add(-time.Second), false},
		{"a millisecond after", died.Add(time.Millisecond), true},
		{"long after", died.Add(time.Minute), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Ledger{}
			l.Die(Death{InstanceID: "i1", At: died})
			l.Claim(Claim{ClaimID: "c1", InstanceID: "i1", PoolID: "p", Asked: tc.asked})
			l.Claim(Claim{ClaimID: "c2", InstanceID: "i2", PoolID: "p", Asked: tc.asked})
			r := noDeadClaimed(l)
			if r.Checked != 1 || r.OK() == tc.bad {
				t.Fatalf("checked %d, violations %v; want bad=%v", r.Checked, r.Violations, tc.bad)
			}
		})
	}
}

func TestMixedBuilds(t *testing.T) {
	for _, tc := range []struct {
		name string
		errs map[codes.Code]int
		log  string
		bad  bool
	}{
		{"only the refusals the load provokes", map[codes.Code]int{codes.ResourceExhausted: 40, codes.FailedPrecondition: 3, codes.Canceled: 9},
			"time=t level=WARN msg=\"slow\"\n", false},
		{"a call past its deadline: noted, not counted", map[codes.Code]int{codes.DeadlineExceeded: 1, codes.ResourceExhausted: 4}, "", false},
		{"an internal error", map[codes.Code]int{codes.Internal: 1}, "", true},
		{"unavailable while nothing was killed", map[codes.Code]int{codes.Unavailable: 2}, "", true},
		{"an error in a replica's log", nil, "time=t level=ERROR msg=\"column does not exist\"\n", true},
		{"the previous build's canceled ready write", nil, "time=t level=ERROR msg=\"mark instance running failed; retrying at the next ready heartbeat\" instance=i err=\"append 3 events (instance.transition, ...): context canceled\"\n", false},
		{"a ready write that failed for a reason", nil, "time=t level=ERROR msg=\"mark instance running failed; retrying at the next ready heartbeat\" instance=i err=\"database is locked\"\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "tetherd-0.log")
			if err := os.WriteFile(log, []byte(tc.log), 0o600); err != nil {
				t.Fatal(err)
			}
			r := MixedBuilds(tc.errs, log)
			if r.OK() == tc.bad {
				t.Fatalf("violations %v; want bad=%v", r.Violations, tc.bad)
			}
			if slow := tc.errs[codes.DeadlineExceeded]; slow > 0 && !strings.Contains(r.String(), "passed their deadline") {
				t.Fatalf("%d slow calls, but the result does not say so:\n%s", slow, r)
			}
		})
	}
	if r := MixedBuilds(nil, filepath.Join(t.TempDir(), "missing.log")); r.OK() {
		t.Fatal("a log that cannot be read passed")
	}
}

// The backup invariant fails when there is nothing to restore; the
// restore itself is exercised by make chaos (--backup).
func TestCheckBackupWithoutABackup(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    *backupRun
	}{
		{"the run ended before the backup", &backupRun{}},
		{"the backup failed", &backupRun{start: now, end: now, err: os.ErrPermission}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &harness{backup: tc.b, ledger: &Ledger{}, cfg: Config{WorkDir: t.TempDir()}}
			if r := h.checkBackup(t.Context(), &daemon{bin: "/nonexistent/tetherd"}); r.OK() {
				t.Fatal("passed with no backup to restore")
			}
		})
	}
}
