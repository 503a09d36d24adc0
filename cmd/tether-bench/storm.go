package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/tetherfleet/tether/internal/tools/bench"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// stormParams say how to restart tetherd and what "back" means.
type stormParams struct {
	pid     int
	sig     syscall.Signal
	log     string
	metrics string
	admin   v1.AdminServiceClient
	want    int // agents connected before the restart
	timeout time.Duration
	tail    time.Duration
}

// stormReport is what a reconnect storm measured.
type stormReport struct {
	Signal       string  `json:"signal"`
	Agents       int     `json:"agents_before"`
	KilledUnixMS int64   `json:"killed_unix_ms"`
	DownSeconds  float64 `json:"exit_seconds"` // signal until the old process was gone
	// BackSeconds is from the signal until tetherd counted every agent
	// connected again (0: not within the timeout).
	BackSeconds  float64      `json:"back_seconds"`
	BackAgents   int          `json:"connected_when_done"`
	NewPID       int          `json:"new_pid"`
	PeakCPU      float64      `json:"peak_cpu_percent_of_a_core"`
	PeakRSSMiB   float64      `json:"peak_rss_mib"`
	Reconnects   int          `json:"reconnects"`
	Failures     int          `json:"failed_attempts"`
	MeanRate     float64      `json:"mean_reconnects_per_second"`
	PeakRate     int          `json:"peak_reconnects_per_second"`
	PeakOverMean float64      `json:"peak_over_mean"`
	Silent       int          `json:"instances_marked_silent"`
	PresumedDead int          `json:"instances_presumed_dead"`
	Points       []stormPoint `json:"points"`
}

// stormPoint is one second after the signal.
type stormPoint struct {
	T          int     `json:"t"`
	Connected  int     `json:"connected"` // tetherd's gauge; -1 while it is down
	Reconnects int     `json:"reconnects"`
	Failures   int     `json:"failures"`
	CPU        float64 `json:"cpu_percent"`
	RSSMiB     float64 `json:"rss_mib"`
}

// runStorm restarts tetherd as it was started (the same argv, working
// directory and environment, read from /proc before the signal) and
// samples every second until tetherd counts every agent back, then for
// the tail.
func runStorm(ctx context.Context, progress io.Writer, p stormParams) (*stormReport, error) {
	argv, dir, env, err := processCommand(p.pid)
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("storm log: %w", err)
	}
	defer logf.Close()
	r := &stormReport{Signal: p.sig.String(), Agents: p.want}
	killed := time.Now()
	r.KilledUnixMS = killed.UnixMilli()
	fmt.Fprintf(progress, "storm: %s to tetherd (pid %d) holding %d agents\n", p.sig, p.pid, p.want)
	if err := syscall.Kill(p.pid, p.sig); err != nil {
		return nil, fmt.Errorf("signal tetherd: %w", err)
	}
	if err := waitGone(ctx, p.pid, 2*time.Minute); err != nil {
		return nil, err
	}
	r.DownSeconds = time.Since(killed).Seconds()
	if r.NewPID, err = restart(ctx, progress, argv, dir, env, logf); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "storm: old tetherd gone after %.1f s; restarted as pid %d\n", r.DownSeconds, r.NewPID)

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastCPU time.Duration
	var doneAt time.Time
	for t := 1; ; t++ {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("storm: run time is up: %w", ctx.Err())
		case <-tick.C:
		}
		pt := stormPoint{T: int(time.Since(killed).Seconds()), Connected: -1} // seconds since the signal, as the agents' timeline
		if c, err := counter(p.metrics, "tether_connected_agents"); err == nil {
			pt.Connected = int(c)
		}
		if cpu, err := bench.ProcessCPU(r.NewPID); err == nil {
			pt.CPU, lastCPU = 100*(cpu-lastCPU).Seconds(), cpu
		}
		if rss, err := bench.ProcessRSS(r.NewPID); err == nil {
			pt.RSSMiB = float64(rss) / (1 << 20)
		}
		r.PeakCPU, r.PeakRSSMiB = max(r.PeakCPU, pt.CPU), max(r.PeakRSSMiB, pt.RSSMiB)
		r.Points = append(r.Points, pt)
		if t%5 == 0 {
			fmt.Fprintf(progress, "storm: %3d s: %d of %d connected, tetherd %.0f%% of a core, RSS %.0f MiB\n", pt.T, pt.Connected, p.want, pt.CPU, pt.RSSMiB)
		}
		if r.BackSeconds == 0 && pt.Connected >= p.want {
			r.BackSeconds = time.Since(killed).Seconds()
			doneAt = time.Now()
			fmt.Fprintf(progress, "storm: every agent back after %.1f s\n", r.BackSeconds)
		}
		r.BackAgents = pt.Connected
		if !doneAt.IsZero() && time.Since(doneAt) >= p.tail {
			break
		}
		if doneAt.IsZero() && time.Since(killed) > p.timeout {
			fmt.Fprintf(progress, "storm: %d of %d back after %s; giving up\n", pt.Connected, p.want, p.timeout)
			break
		}
	}
	if r.Silent, err = countEvents(ctx, p.admin, "instance.silent", killed); err != nil {
		return nil, err
	}
	if r.PresumedDead, err = countEvents(ctx, p.admin, "instance.presumed_dead", killed); err != nil {
		return nil, err
	}
	return r, nil
}

// finish adds the agents' own per-second reconnections (the shards'
// timelines, by wall-clock second) to the points and sums them up.
func (r *stormReport) finish(tl []bench.Second) {
	killedSec := r.KilledUnixMS / 1000
	by := map[int]bench.Second{}
	for _, s := range tl {
		if s.Unix >= killedSec {
			by[int(s.Unix-killedSec)] = s
		}
	}
	var last int
	for i := range r.Points {
		s := by[r.Points[i].T]
		r.Points[i].Reconnects, r.Points[i].Failures = s.Reconnects, s.Failures
	}
	for t, s := range by {
		r.Reconnects += s.Reconnects
		r.Failures += s.Failures
		r.PeakRate = max(r.PeakRate, s.Reconnects)
		if s.Reconnects > 0 {
			last = max(last, t)
		}
	}
	// The mean is over the seconds from the signal to the last
	// reconnection: the storm's own length.
	if last > 0 {
		r.MeanRate = float64(r.Reconnects) / float64(last+1)
		r.PeakOverMean = float64(r.PeakRate) / r.MeanRate
	}
}

func printStorm(w io.Writer, r *stormReport) {
	back := "not within the timeout"
	if r.BackSeconds > 0 {
		back = fmt.Sprintf("%.1f s", r.BackSeconds)
	}
	fmt.Fprintf(w, "storm (%s): %d agents; old tetherd gone in %.1f s; all back: %s (%d connected at the end); "+
		"%d reconnections, %d failed attempts; mean %.0f/s, peak %d/s (%.2f× the mean); peak tetherd CPU %.0f%% of a core, RSS %.0f MiB; "+
		"%d marked silent, %d presumed dead since the signal\n",
		r.Signal, r.Agents, r.DownSeconds, back, r.BackAgents, r.Reconnects, r.Failures, r.MeanRate, r.PeakRate, r.PeakOverMean,
		r.PeakCPU, r.PeakRSSMiB, r.Silent, r.PresumedDead)
}

func writeSeries(path string, r *stormReport) error {
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("series: %w", err)
	}
	return nil
}

// processCommand reads how pid was started.
func processCommand(pid int) (argv []string, dir string, env []string, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, "", nil, fmt.Errorf("read tetherd's command line: %w", err)
	}
	argv = strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	if len(argv) == 0 || argv[0] == "" {
		return nil, "", nil, fmt.Errorf("tetherd (pid %d) has an empty command line", pid)
	}
	if dir, err = os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err != nil {
		return nil, "", nil, fmt.Errorf("read tetherd's working directory: %w", err)
	}
	envRaw, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil, "", nil, fmt.Errorf("read tetherd's environment: %w", err)
	}
	if e := strings.TrimRight(string(envRaw), "\x00"); e != "" {
		env = strings.Split(e, "\x00")
	}
	return argv, dir, env, nil
}

// waitGone waits for a process that is not our child to exit (so there is
// no wait(2) to block on: a deadline poll of /proc is the only way).
func waitGone(ctx context.Context, pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err == nil {
			// A zombie has let go of its port and descriptors, but only
			// once its last thread is gone: a killed Go process's main
			// thread turns zombie while the others still hold its files.
			tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			if s := string(st); strings.Contains(s[strings.LastIndexByte(s, ')')+1:], " Z ") && len(tasks) <= 1 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tetherd (pid %d) still running %s after the signal", pid, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// countEvents counts events of kind created at or after since (the
// list is newest first, so it stops at the first older one).
func countEvents(ctx context.Context, admin v1.AdminServiceClient, kind string, since time.Time) (int, error) {
	n, token := 0, ""
	for {
		resp, err := admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: kind, PageSize: 500, PageToken: token})
		if err != nil {
			return n, fmt.Errorf("list %s events: %w", kind, err)
		}
		for _, e := range resp.Events {
			if e.CreatedAt.AsTime().Before(since) {
				return n, nil
			}
			n++
		}
		if token = resp.NextPageToken; token == "" {
			return n, nil
		}
	}
}

// restart starts tetherd again as it was started. One that exits within
// two seconds (its port not yet free, say) is started again, up to ten
// times.
func restart(ctx context.Context, progress io.Writer, argv []string, dir string, env []string, logf *os.File) (int, error) {
	for attempt := 1; ; attempt++ {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // it outlives this tool, as the first did
		if err := cmd.Start(); err != nil {
			return 0, fmt.Errorf("restart tetherd: %w", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }() // and reaps it if it exits before we do
		select {
		case err := <-exited:
			if attempt >= 10 {
				return 0, fmt.Errorf("restarted tetherd exited at once %d times (last: %v); see its log %s", attempt, err, logf.Name())
			}
			fmt.Fprintf(progress, "storm: restarted tetherd exited at once (%v); starting it again\n", err)
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		case <-time.After(2 * time.Second):
			return cmd.Process.Pid, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}
