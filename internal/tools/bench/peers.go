package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// PeerSystem is one side of a side-by-side run: a server in its own
// process and a way to load it.
type PeerSystem struct {
	Name string
	PID  int
	// Prepare makes n requests outside the timed phase and returns the
	// timed run over them.
	Prepare func(ctx context.Context, n int) (func(ctx context.Context, clients int, newConn bool) (Result, error), error)
}

// PeerOptions shape a side-by-side run.
type PeerOptions struct {
	Clients []int
	N       int
	Rounds  int
	// NewConn lists the connection modes: false kept-alive, true a new
	// connection per request.
	NewConn []bool
	// MaxForeign is the CPU (cores) other processes may use during a run;
	// a run past it is repeated up to Retries times.
	MaxForeign float64
	// QuietWait bounds the wait for a quiet machine before each run.
	QuietWait time.Duration
	Retries   int
	// Anyway runs without waiting and without repeats, marking the
	// disturbed runs (a shared machine).
	Anyway bool
	// Budget bounds the whole run: past it, runs are neither waited for
	// nor repeated (they are marked instead).
	Budget time.Duration
	// Deadline is a hard bound: runs not started by then are skipped and
	// said to be (a loaded machine makes every run slower).
	Deadline time.Duration
	// Exclude are processes whose CPU is not foreign (the load generator's
	// parents).
	Exclude  []int
	Progress io.Writer

	proc       string        // /proc; tests point it elsewhere
	quietEvery time.Duration // interval of the quiet readings (1 s)
}

// PeerRun is one timed run of one system.
type PeerRun struct {
	System  string  `json:"system"`
	Round   int     `json:"round"`
	Clients int     `json:"clients"`
	NewConn bool    `json:"new_connection_each"`
	Attempt int     `json:"attempt"`
	N       int     `json:"n"`
	Errors  int     `json:"errors"`
	Rate    float64 `json:"per_s"`
	P50ms   float64 `json:"p50_ms"`
	P99ms   float64 `json:"p99_ms"`
	// ServerCPUms and ClientCPUms are CPU milliseconds per successful
	// request: the server's from /proc, the load generator's from
	// getrusage.
	ServerCPUms float64 `json:"server_cpu_ms_per_req"`
	ClientCPUms float64 `json:"client_cpu_ms_per_req"`
	// Foreign is the cores other userland processes used during the run.
	Foreign float64 `json:"foreign_cores"`
	Load    string  `json:"load_average"`
	// Disturbed: Foreign was over the limit and the run was kept anyway.
	Disturbed bool   `json:"disturbed"`
	Counted   bool   `json:"counted"`
	Error     string `json:"error,omitempty"`
}

// RunPeers alternates the systems in one window: for each round, each
// connection mode and each concurrency level, every system runs once (the
// order flips each round so that drift favours neither). Before each run
// it waits for the machine to be quiet; a run others disturbed is
// repeated, or kept and marked with Anyway or past the budget.
func RunPeers(ctx context.Context, o PeerOptions, systems []PeerSystem) ([]PeerRun, error) {
	if len(systems) == 0 || len(o.Clients) == 0 || o.N <= 0 || o.Rounds <= 0 || len(o.NewConn) == 0 {
		return nil, fmt.Errorf("peers: nothing to run (systems %d, clients %v, n %d, rounds %d)", len(systems), o.Clients, o.N, o.Rounds)
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	ex := map[int]bool{os.Getpid(): true}
	for _, p := range o.Exclude {
		ex[p] = true
	}
	for _, s := range systems {
		ex[s.PID] = true
	}
	fg := &Foreign{Exclude: ex, proc: o.proc}
	if o.quietEvery <= 0 {
		o.quietEvery = time.Second
	}
	start := time.Now()
	total := o.Rounds * len(o.NewConn) * len(o.Clients) * len(systems)
	var runs []PeerRun
	done := 0
	for round := 1; round <= o.Rounds; round++ {
		order := slices.Clone(systems)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, newConn := range o.NewConn {
			for _, c := range o.Clients {
				for _, sys := range order {
					done++
					if o.Deadline > 0 && time.Since(start) > o.Deadline {
						fmt.Fprintf(progress, "[%d/%d %s] SKIPPED %s c=%d: past the %s deadline\n", done, total, time.Since(start).Round(time.Second), sys.Name, c, o.Deadline)
						runs = append(runs, PeerRun{System: sys.Name, Round: round, Clients: c, NewConn: newConn, Error: "skipped: past the deadline"})
						continue
					}
					for attempt := 1; ; attempt++ {
						if err := ctx.Err(); err != nil {
							return runs, err
						}
						late := o.Budget > 0 && time.Since(start) > o.Budget
						r := runOnce(ctx, fg, o, sys, round, c, newConn, !o.Anyway && !late, progress)
						r.Attempt = attempt
						over := o.MaxForeign > 0 && r.Foreign >= o.MaxForeign
						retry := over && !o.Anyway && !late && attempt <= o.Retries && r.Error == ""
						r.Disturbed = over && !retry
						r.Counted = !retry
						runs = append(runs, r)
						fmt.Fprintf(progress, "[%d/%d %s] %s\n", done, total, time.Since(start).Round(time.Second), r.line())
						if !retry {
							if r.Disturbed {
								why := "out of retries"
								if o.Anyway {
									why = "--anyway"
								} else if late {
									why = "past the time budget"
								}
								fmt.Fprintf(progress, "    kept DISTURBED (%s): other processes used %.2f cores (limit %.2f)\n", why, r.Foreign, o.MaxForeign)
							}
							break
						}
						fmt.Fprintf(progress, "    other processes used %.2f cores (limit %.2f): repeating the run\n", r.Foreign, o.MaxForeign)
					}
				}
			}
		}
	}
	return runs, nil
}

func runOnce(ctx context.Context, fg *Foreign, o PeerOptions, sys PeerSystem, round, c int, newConn, wait bool, progress io.Writer) PeerRun {
	r := PeerRun{System: sys.Name, Round: round, Clients: c, NewConn: newConn, N: o.N}
	run, err := sys.Prepare(ctx, o.N)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	runtime.GC()
	if wait && o.MaxForeign > 0 {
		waitQuiet(ctx, fg, o.MaxForeign, o.QuietWait, o.quietEvery, progress)
	}
	cpu0, err := ProcessCPU(sys.PID)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	f0 := fg.Snapshot()
	res, err := run(ctx, c, newConn)
	f1 := fg.Snapshot()
	cpu1, cerr := ProcessCPU(sys.PID)
	r.Foreign = f0.Cores(f1)
	r.Load = LoadAverage()
	if err == nil {
		err = cerr
	}
	if err != nil {
		r.Error = err.Error()
		return r
	}
	ok := res.N - res.Errors
	r.Errors, r.Rate = res.Errors, res.Rate()
	r.P50ms, r.P99ms = ms(res.P50), ms(res.P99)
	if ok > 0 {
		r.ServerCPUms = ms(cpu1-cpu0) / float64(ok)
		r.ClientCPUms = ms(res.ClientCPU) / float64(ok)
	}
	if res.FirstError != nil {
		r.Error = res.FirstError.Error()
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// waitQuiet waits, in readings every interval, until other processes use
// less than limit cores, for at most wait.
func waitQuiet(ctx context.Context, fg *Foreign, limit float64, wait, every time.Duration, progress io.Writer) {
	deadline := time.Now().Add(wait)
	said := false
	for {
		a := fg.Snapshot()
		select {
		case <-ctx.Done():
			return
		// Reading a rate needs an interval; nothing signals "quiet".
		case <-time.After(every):
		}
		f := a.Cores(fg.Snapshot())
		if f < limit {
			if said {
				fmt.Fprintf(progress, "    quiet again (other processes: %.2f cores)\n", f)
			}
			return
		}
		if !said {
			fmt.Fprintf(progress, "    waiting up to %s for a quiet machine: other processes use %.2f cores (load %s)\n", wait, f, LoadAverage())
			said = true
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(progress, "    gave up waiting (other processes: %.2f cores)\n", f)
			return
		}
	}
}

func (r PeerRun) line() string {
	mode := "kept-alive"
	if r.NewConn {
		mode = "new conn"
	}
	s := fmt.Sprintf("round %d %-7s %-10s c=%-3d %7.0f/s p50 %6.1f ms p99 %6.1f ms server %.2f ms/req load-gen %.2f ms/req other procs %.2f cores load %s",
		r.Round, r.System, mode, r.Clients, r.Rate, r.P50ms, r.P99ms, r.ServerCPUms, r.ClientCPUms, r.Foreign, r.Load)
	if r.Errors > 0 || r.Error != "" {
		s += fmt.Sprintf(" ERRORS %d: %s", r.Errors, r.Error)
	}
	return s
}

// WritePeerTable prints the counted runs as one Markdown table: a row per
// connection mode and concurrency level, each system's rounds side by
// side, the ratio of the others to the first system, and the CPU each
// side spent per request.
func WritePeerTable(w io.Writer, runs []PeerRun, systems []string) {
	type key struct {
		newConn bool
		c       int
	}
	var keys []key
	byKey := map[key]map[string][]PeerRun{}
	for _, r := range runs {
		if !r.Counted {
			continue
		}
		k := key{r.NewConn, r.Clients}
		if byKey[k] == nil {
			byKey[k] = map[string][]PeerRun{}
			keys = append(keys, k)
		}
		byKey[k][r.System] = append(byKey[k][r.System], r)
	}
	col := func(rs []PeerRun, f func(PeerRun) string) string {
		parts := make([]string, len(rs))
		for i, r := range rs {
			parts[i] = f(r)
			if r.Disturbed {
				parts[i] += "*"
			}
			if r.Error != "" {
				parts[i] += "!"
			}
		}
		return strings.Join(parts, ", ")
	}
	head := "| connections | clients |"
	sep := "|---|---|"
	for i, s := range systems {
		head += " " + s + " /s |"
		sep += "---|"
		if i > 0 {
			head += fmt.Sprintf(" %s ÷ %s |", s, systems[0])
			sep += "---|"
		}
	}
	head += " p50 / p99 ms (" + strings.Join(systems, "; ") + ") | server CPU ms/req | load-gen CPU ms/req | other procs, cores |"
	sep += "---|---|---|---|"
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, sep)
	for _, k := range keys {
		mode := "kept-alive"
		if k.newConn {
			mode = "new each"
		}
		row := fmt.Sprintf("| %s | %d |", mode, k.c)
		var lat, srv, cli, fg []string
		for i, s := range systems {
			rs := byKey[k][s]
			row += " " + col(rs, func(r PeerRun) string { return fmt.Sprintf("%.0f", r.Rate) }) + " |"
			if i > 0 {
				row += " " + ratio(byKey[k][systems[0]], rs) + " |"
			}
			lat = append(lat, col(rs, func(r PeerRun) string { return fmt.Sprintf("%.1f/%.0f", r.P50ms, r.P99ms) }))
			srv = append(srv, col(rs, func(r PeerRun) string { return fmt.Sprintf("%.2f", r.ServerCPUms) }))
			cli = append(cli, col(rs, func(r PeerRun) string { return fmt.Sprintf("%.2f", r.ClientCPUms) }))
			fg = append(fg, col(rs, func(r PeerRun) string { return fmt.Sprintf("%.2f", r.Foreign) }))
		}
		row += fmt.Sprintf(" %s | %s | %s | %s |", strings.Join(lat, "; "), strings.Join(srv, "; "), strings.Join(cli, "; "), strings.Join(fg, "; "))
		fmt.Fprintln(w, row)
	}
	fmt.Fprintln(w, "\nValues are per round, in round order; * marks a run other processes disturbed (kept with --anyway or past the budget), ! a run with errors.")
}

// ratio is the range of b's rate over a's, pairing rounds.
func ratio(a, b []PeerRun) string {
	var lo, hi float64
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i].Rate <= 0 {
			continue
		}
		x := b[i].Rate / a[i].Rate
		if n == 0 || x < lo {
			lo = x
		}
		if n == 0 || x > hi {
			hi = x
		}
		n++
	}
	switch {
	case n == 0:
		return "-"
	case fmt.Sprintf("%.2f", lo) == fmt.Sprintf("%.2f", hi):
		return fmt.Sprintf("%.2f×", lo)
	default:
		return fmt.Sprintf("%.2f–%.2f×", lo, hi)
	}
}
