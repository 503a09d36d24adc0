package bench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestUserTicks(t *testing.T) {
	for _, tc := range []struct {
		name string
		stat string
		want int64
		ok   bool
	}{
		// utime 10, stime 5, cutime 3, cstime 2; flags 4194560 (no PF_KTHREAD).
		{"process", "42 (go build) S 1 42 42 0 -1 4194560 100 0 0 0 10 5 3 2 20 0 1 0 100 0 0", 20, true},
		{"name with spaces and parens", "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 1 0 0 20 0 1 0 100 0 0", 2, true},
		{"kernel thread", "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 7 7 0 0 20 0 1 0 1 0 0", 0, false},
		{"short line", "42 (x) S 1 2", 0, false},
		{"no name", "garbage", 0, false},
		{"bad number", "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 ten 5 3 2 20 0 1 0 100 0 0", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := userTicks(tc.stat)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("userTicks = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func writeStat(t *testing.T, proc string, pid int, ticks int) {
	t.Helper()
	dir := filepath.Join(proc, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	line := "1 (p) S 1 1 1 0 -1 4194560 0 0 0 0 " + strconv.Itoa(ticks) + " 0 0 0 20 0 1 0 1 0 0"
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestForeignCores: other processes' CPU between two readings, leaving out
// the excluded ones, counting a newcomer whole and a finished one not at all.
func TestForeignCores(t *testing.T) {
	proc := t.TempDir()
	writeStat(t, proc, 10, 100) // another process
	writeStat(t, proc, 11, 500) // the server: excluded
	writeStat(t, proc, 12, 50)  // exits before the second reading
	f := &Foreign{Exclude: map[int]bool{11: true}, proc: proc}
	a := f.Snapshot()
	writeStat(t, proc, 10, 150)  // +50 ticks
	writeStat(t, proc, 11, 5000) // excluded, whatever it used
	writeStat(t, proc, 13, 30)   // started in between: 30 ticks
	if err := os.RemoveAll(filepath.Join(proc, "12")); err != nil {
		t.Fatal(err)
	}
	b := f.Snapshot()
	a.at, b.at = time.Unix(0, 0), time.Unix(2, 0) // two seconds apart
	if got, want := a.Cores(b), 0.4; got < want-1e-9 || got > want+1e-9 {
		t.Fatalf("Cores = %v, want %v (80 ticks of 1/100 s over 2 s)", got, want)
	}
	if got := b.Cores(a); got < 0 {
		t.Fatalf("Cores backwards = %v, want no negative", got)
	}
}

func TestRatio(t *testing.T) {
	run := func(rates ...float64) []PeerRun {
		var rs []PeerRun
		for _, r := range rates {
			rs = append(rs, PeerRun{Rate: r})
		}
		return rs
	}
	for _, tc := range []struct {
		name string
		a, b []PeerRun
		want string
	}{
		{"range", run(100, 200), run(250, 300), "1.50–2.50×"},
		{"equal", run(100, 100), run(200, 200), "2.00×"},
		{"nothing to pair", run(), run(100), "-"},
		{"zero rate skipped", run(0, 100), run(50, 150), "1.50×"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ratio(tc.a, tc.b); got != tc.want {
				t.Fatalf("ratio = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRunPeersRepeatsDisturbedRuns drives the runner with fake systems: a
// run over the foreign-CPU limit is repeated, and with Anyway it is kept
// and marked instead; the table carries both systems and the ratio.
func TestRunPeersRepeatsDisturbedRuns(t *testing.T) {
	// A fake /proc with one other process, which takes CPU during every
	// run: each run is disturbed whatever else this machine runs.
	proc := t.TempDir()
	ticks := 0
	writeStat(t, proc, 10, ticks)
	fake := func(name string, rate float64) PeerSystem {
		return PeerSystem{Name: name, PID: os.Getpid(), Prepare: func(context.Context, int) (func(context.Context, int, bool) (Result, error), error) {
			return func(context.Context, int, bool) (Result, error) {
				ticks += 1000
				writeStat(t, proc, 10, ticks)
				return Result{N: 10, Elapsed: time.Duration(float64(10) / rate * float64(time.Second))}, nil
			}, nil
		}}
	}
	systems := []PeerSystem{fake("a", 100), fake("b", 250)}
	for _, tc := range []struct {
		name           string
		anyway         bool
		wantRuns       int
		wantDisturbed  bool
		wantRetryLines bool
	}{
		{"repeats then keeps", false, 2 * 2 * 2, true, true},
		{"anyway keeps at once", true, 2 * 2, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var progress bytes.Buffer
			runs, err := RunPeers(context.Background(), PeerOptions{Clients: []int{1, 4}, N: 10, Rounds: 1, NewConn: []bool{false},
				MaxForeign: 0.15, QuietWait: time.Second, Retries: 1, Anyway: tc.anyway, Progress: &progress,
				proc: proc, quietEvery: time.Millisecond}, systems)
			if err != nil {
				t.Fatal(err)
			}
			if len(runs) != tc.wantRuns {
				t.Fatalf("%d runs, want %d:\n%s", len(runs), tc.wantRuns, progress.String())
			}
			counted := 0
			for _, r := range runs {
				if r.Counted {
					counted++
					if r.Disturbed != tc.wantDisturbed {
						t.Fatalf("counted run disturbed = %v, want %v", r.Disturbed, tc.wantDisturbed)
					}
				}
			}
			if counted != 4 {
				t.Fatalf("%d counted runs, want 4", counted)
			}
			if got := strings.Contains(progress.String(), "repeating the run"); got != tc.wantRetryLines {
				t.Fatalf("progress mentions a repeat: %v, want %v:\n%s", got, tc.wantRetryLines, progress.String())
			}
			var table bytes.Buffer
			WritePeerTable(&table, runs, []string{"a", "b"})
			for _, want := range []string{"| kept-alive | 1 |", "| kept-alive | 4 |", "2.50×", "100*", "250*"} {
				if !strings.Contains(table.String(), want) {
					t.Fatalf("table lacks %q:\n%s", want, table.String())
				}
			}
		})
	}
}

func TestRunPeersReportsFailures(t *testing.T) {
	sys := PeerSystem{Name: "broken", PID: os.Getpid(), Prepare: func(context.Context, int) (func(context.Context, int, bool) (Result, error), error) {
		return nil, errors.New("no tokens")
	}}
	runs, err := RunPeers(context.Background(), PeerOptions{Clients: []int{1}, N: 1, Rounds: 1, NewConn: []bool{false}}, []PeerSystem{sys})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].Error != "no tokens" || !runs[0].Counted {
		t.Fatalf("runs = %+v, want one counted run with the error", runs)
	}
	if _, err := RunPeers(context.Background(), PeerOptions{}, nil); err == nil {
		t.Fatal("RunPeers with nothing to run: no error")
	}
}

// TestRunPeersDeadlineSkips: past the deadline nothing more is started.
func TestRunPeersDeadlineSkips(t *testing.T) {
	started := 0
	sys := PeerSystem{Name: "s", PID: os.Getpid(), Prepare: func(context.Context, int) (func(context.Context, int, bool) (Result, error), error) {
		started++
		return func(context.Context, int, bool) (Result, error) { return Result{N: 1, Elapsed: time.Millisecond}, nil }, nil
	}}
	var progress bytes.Buffer
	runs, err := RunPeers(context.Background(), PeerOptions{Clients: []int{1, 2}, N: 1, Rounds: 1, NewConn: []bool{false},
		Deadline: time.Nanosecond, Progress: &progress}, []PeerSystem{sys})
	if err != nil {
		t.Fatal(err)
	}
	if started != 0 || len(runs) != 2 || runs[0].Counted || !strings.Contains(progress.String(), "SKIPPED") {
		t.Fatalf("started %d, runs %+v, progress:\n%s", started, runs, progress.String())
	}
}
