package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/internal/tools/bench"
)

// peers runs step-ca and tetherd side by side (make bench-peers): one
// throwaway CA each, the same CSR-signing load alternated between them,
// one table.
func peers(args []string) error {
	fs := flag.NewFlagSet("peers", flag.ExitOnError)
	stepBin := fs.String("step-ca", ".cache/peers/bin/step-ca", "step-ca binary (make bench-peers installs v0.30.2)")
	tetherd := fs.String("tetherd", "bin/tetherd", "tetherd binary")
	dir := fs.String("dir", ".cache/peers/run", "work folder, emptied first: both CAs, tetherd's data, the servers' logs")
	clients := fs.String("clients", "1,16,64", "concurrency levels")
	n := fs.Int("n", 2000, "certificates per run")
	rounds := fs.Int("rounds", 2, "rounds (each runs every system at every level and mode)")
	modes := fs.String("connections", "kept-alive,new", "connection modes: kept-alive, new (a new TLS connection per request)")
	maxForeign := fs.Float64("max-foreign", 0.15, "CPU (cores) other processes may use during a run before it is repeated")
	quietWait := fs.Duration("quiet-wait", 20*time.Second, "longest wait for a quiet machine before each run")
	retries := fs.Int("retries", 2, "repeats of a disturbed run")
	anyway := fs.Bool("anyway", false, "run on a busy machine: no waiting, no repeats, disturbed runs marked with * (numbers then need a quiet re-run)")
	budget := fs.Duration("budget", 6*time.Minute, "past this, runs are no longer waited for or repeated")
	deadline := fs.Duration("deadline", 9*time.Minute, "runs not started by then are skipped, so the whole run stays bounded")
	caKey := fs.String("ca-key", "p256", "tetherd's CA key type (tetherd init --ca-key): p256 or ed25519")
	out := fs.String("o", "text", "text (a Markdown table) or json (every run, repeats included)")
	_ = fs.Parse(args)

	o := bench.PeerOptions{N: *n, Rounds: *rounds, MaxForeign: *maxForeign, QuietWait: *quietWait, Retries: *retries,
		Anyway: *anyway, Budget: *budget, Deadline: *deadline, Progress: os.Stderr, Exclude: []int{os.Getppid()}}
	for _, s := range strings.Split(*clients, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			return fmt.Errorf("--clients: %q is not a positive number", s)
		}
		o.Clients = append(o.Clients, c)
	}
	for _, m := range strings.Split(*modes, ",") {
		switch strings.TrimSpace(m) {
		case "kept-alive":
			o.NewConn = append(o.NewConn, false)
		case "new":
			o.NewConn = append(o.NewConn, true)
		default:
			return fmt.Errorf("--connections: %q is neither kept-alive nor new", m)
		}
	}
	if *out != "text" && *out != "json" {
		return fmt.Errorf("-o: %q is neither text nor json", *out)
	}
	for _, b := range []string{*stepBin, *tetherd} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%w (make bench-peers builds and installs both)", err)
		}
	}
	if *anyway {
		fmt.Fprintln(os.Stderr, "WARNING: --anyway: runs are not repeated when other processes take CPU; the numbers need a quiet re-run")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if err := os.RemoveAll(*dir); err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	// Read before the run: make bench-peers builds tetherd just before it,
	// and the tree may change while it runs.
	versions := versionLine(*stepBin)
	fmt.Fprintf(os.Stderr, "%s; load average %s before the run; work folder %s\n", versions, bench.LoadAverage(), abs)

	stepSys, stopStep, err := startStepCA(ctx, *stepBin, abs, maxOf(o.Clients))
	if err != nil {
		return err
	}
	defer stopStep()
	tetherSys, stopTether, err := startTetherd(ctx, *tetherd, abs, *caKey)
	if err != nil {
		return err
	}
	defer stopTether()

	systems := []bench.PeerSystem{stepSys, tetherSys}
	runs, err := bench.RunPeers(ctx, o, systems)
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	fmt.Fprintf(os.Stderr, "load average %s after the run\n", bench.LoadAverage())
	if *out == "json" {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(runs)
	}
	fmt.Printf("\n%s, %s (CA key %s), n=%d per run, %d cores, load average %s at the end\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"),
		versions, *caKey, *n, numCPU(), bench.LoadAverage())
	bench.WritePeerTable(os.Stdout, runs, []string{stepSys.Name, tetherSys.Name})
	disturbed, skipped := 0, 0
	for _, r := range runs {
		if r.Counted && r.Disturbed {
			disturbed++
		}
		if r.Error != "" && r.N == 0 {
			skipped++
		}
	}
	if skipped > 0 {
		fmt.Printf("\n%d runs were skipped past the --deadline (%s): the machine was too slow for all of them.\n", skipped, *deadline)
	}
	if disturbed > 0 {
		fmt.Printf("\n%d of the counted runs were disturbed by other processes: re-run on a quiet machine before quoting them.\n", disturbed)
	}
	return err
}

func maxOf(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\nprocessor") + 1
}

func versionLine(stepBin string) string {
	step := "?"
	if b, err := exec.Command("go", "version", "-m", stepBin).Output(); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/smallstep/certificates" {
				step = f[2]
			}
		}
	}
	// The commit tetherd was built from: make bench-peers builds it from
	// the working tree just before the run.
	commit := "?"
	if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(b))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			commit += " with uncommitted changes"
		}
	}
	return fmt.Sprintf("step-ca %s, tetherd at commit %s", step, commit)
}

// freeAddr picks a loopback port nobody holds now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startProc starts a server in its own process group, its output in a
// log file, and returns how to stop it.
func startProc(bin string, log string, args ...string) (*exec.Cmd, func(), error) {
	f, err := os.Create(log)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(exited) }()
	return cmd, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}, nil
}

func startStepCA(ctx context.Context, bin, dir string, maxConns int) (bench.PeerSystem, func(), error) {
	addr, err := freeAddr()
	if err != nil {
		return bench.PeerSystem{}, nil, err
	}
	ca, err := bench.InitStepCA(filepath.Join(dir, "step-ca"), addr)
	if err != nil {
		return bench.PeerSystem{}, nil, err
	}
	cmd, stop, err := startProc(bin, filepath.Join(dir, "step-ca.log"), ca.Config)
	if err != nil {
		return bench.PeerSystem{}, nil, err
	}
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	probe := ca.NewStepClient(1, false)
	defer probe.Close()
	if err := probe.Health(hctx); err != nil {
		stop()
		return bench.PeerSystem{}, nil, fmt.Errorf("%w (see %s)", err, filepath.Join(dir, "step-ca.log"))
	}
	fmt.Fprintf(os.Stderr, "step-ca pid %d on %s\n", cmd.Process.Pid, addr)
	seq := 0
	sys := bench.PeerSystem{Name: "step-ca", PID: cmd.Process.Pid,
		Prepare: func(ctx context.Context, n int) (func(context.Context, int, bool) (bench.Result, error), error) {
			seq++
			rs, err := ca.PrepareStep(fmt.Sprintf("run%d", seq), n)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, c int, newConn bool) (bench.Result, error) {
				cl := ca.NewStepClient(c, newConn)
				defer cl.Close()
				return bench.StepLoad(ctx, cl, rs, c, newConn)
			}, nil
		}}
	// An untimed warm-up, as the reference method does.
	if err := warmUp(ctx, sys); err != nil {
		stop()
		return bench.PeerSystem{}, nil, fmt.Errorf("step-ca warm-up: %w", err)
	}
	return sys, stop, nil
}

func startTetherd(ctx context.Context, bin, dir, caKey string) (bench.PeerSystem, func(), error) {
	addr, err := freeAddr()
	if err != nil {
		return bench.PeerSystem{}, nil, err
	}
	data := filepath.Join(dir, "tetherd")
	if b, err := exec.CommandContext(ctx, bin, "init", "--data-dir", data, "--endpoint", addr, "--ca-key", caKey).CombinedOutput(); err != nil {
		return bench.PeerSystem{}, nil, fmt.Errorf("tetherd init: %w: %s", err, b)
	}
	// Every simulated node enrolls from 127.0.0.1, so the per-source limit
	// on unauthenticated requests is off.
	cmd, stop, err := startProc(bin, filepath.Join(dir, "tetherd.log"), "serve", "--data-dir", data, "--listen", addr,
		"--log-level", "warn", "--unauthenticated-rate=-1", "--max-unauthenticated-per-source=-1", "--qemu-mode", "disabled")
	if err != nil {
		return bench.PeerSystem{}, nil, err
	}
	cfg := filepath.Join(data, "admin", "tetherconfig.yaml")
	tg, err := connectTarget(cfg)
	if err != nil {
		stop()
		return bench.PeerSystem{}, nil, err
	}
	var node string
	deadline := time.Now().Add(30 * time.Second)
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		node, err = tg.seedNode(sctx)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return bench.PeerSystem{}, nil, fmt.Errorf("tetherd never answered: %w (see %s)", err, filepath.Join(dir, "tetherd.log"))
		}
		// A poll on an external process that is starting up.
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "tetherd pid %d on %s\n", cmd.Process.Pid, addr)
	dial := func() (*grpc.ClientConn, error) { return tg.dial(nil) }
	// The same instances enroll in every run, each time with a fresh
	// token and key: step-ca's runs do not grow anything tetherd's
	// background loops read either.
	var fleet []bench.Enrollment
	sys := bench.PeerSystem{Name: "tetherd", PID: cmd.Process.Pid,
		Prepare: func(ctx context.Context, n int) (func(context.Context, int, bool) (bench.Result, error), error) {
			var es []bench.Enrollment
			var err error
			if len(fleet) >= n {
				es, err = bench.RetokenEnrollments(ctx, tg.admin, fleet[:n])
			} else {
				es, err = bench.PrepareEnrollments(ctx, tg.admin, node, n)
				if err == nil && len(es) > len(fleet) {
					fleet = es
				}
			}
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, c int, newConn bool) (bench.Result, error) {
				return bench.EnrollLoad(ctx, dial, es, c, newConn)
			}, nil
		}}
	if err := warmUp(ctx, sys); err != nil {
		stop()
		return bench.PeerSystem{}, nil, fmt.Errorf("tetherd warm-up: %w", err)
	}
	return sys, stop, nil
}

func warmUp(ctx context.Context, sys bench.PeerSystem) error {
	run, err := sys.Prepare(ctx, 200)
	if err != nil {
		return err
	}
	r, err := run(ctx, 8, false)
	if err == nil && r.Errors > 0 {
		err = fmt.Errorf("%d of %d failed; first: %w", r.Errors, r.N, r.FirstError)
	}
	return err
}
