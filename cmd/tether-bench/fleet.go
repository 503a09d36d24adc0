package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"gopkg.in/yaml.v3"

	agentenroll "github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/internal/tools/bench"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// fleetReport is what `fleet` prints; with -o json, as one JSON object last.
type fleetReport struct {
	Agents            int     `json:"agents"`
	Procs             int     `json:"procs"`
	Sources           int     `json:"source_addresses"`
	HeartbeatInterval string  `json:"heartbeat_interval"`
	EnrollSeconds     float64 `json:"enroll_seconds"`
	// ConnectCPUPerAgentMS is tetherd's CPU from the first agent's first
	// contact until every agent is connected, per connected agent: its
	// provisioning through the admin API (a simulator's stand-in for the
	// provider), its enrollment, its stream and first heartbeat, and the
	// heartbeats of agents already up meanwhile. An upper bound on one
	// node's boot cost to the control plane.
	ConnectCPUPerAgentMS float64 `json:"server_cpu_ms_per_agent_connecting,omitempty"`
	HoldSeconds          float64 `json:"hold_seconds"`
	Connected            int64   `json:"connected_at_end"`
	Errors               int64   `json:"errors"`
	Reconnects           int64   `json:"reconnects"`
	HeartbeatsPerSec     float64 `json:"heartbeats_ingested_per_second"`
	// Server figures from /proc/PID: RSS before any agent and at the end
	// of the hold, and CPU over the hold.
	RSSBaseMiB        float64          `json:"server_rss_base_mib"`
	RSSEndMiB         float64          `json:"server_rss_end_mib"`
	RSSPerAgentKiB    float64          `json:"server_rss_per_agent_kib"`
	RSSHoldGrowthMiB  float64          `json:"server_rss_growth_during_hold_mib"`
	GoInUsePerAgentKB float64          `json:"server_go_heap_stack_per_agent_kib,omitempty"`
	CPUPercentOfCore  float64          `json:"server_cpu_percent_of_a_core"`
	CPUPerHeartbeatUS float64          `json:"server_cpu_us_per_heartbeat"`
	CPUPerAgentUSPerS float64          `json:"server_cpu_us_per_agent_per_second"`
	FirstErrors       []string         `json:"first_errors,omitempty"`
	FailuresByCause   map[string]int64 `json:"failures_by_cause,omitempty"`
	ReusedIdentities  int64            `json:"reused_identities"`
	// Task create -> agent receives, over --push-tasks probes.
	PushTasks  int     `json:"push_tasks,omitempty"`
	PushErrors int     `json:"push_errors,omitempty"`
	PushP50MS  float64 `json:"push_p50_ms,omitempty"`
	PushP99MS  float64 `json:"push_p99_ms,omitempty"`
	// RSSSamplesMiB is tetherd's RSS every 10 s of the hold.
	RSSSamplesMiB []float64    `json:"server_rss_samples_mib,omitempty"`
	Storm         *stormReport `json:"storm,omitempty"`
	// ServerExited: the --server-pid process was gone at the end of the
	// hold, so the server figures above are zero, not measured.
	ServerExited bool `json:"server_exited_during_hold,omitempty"`
}

// shard is one part of the fleet: in this process or in a child.
type shard interface {
	// connected blocks until the shard has tried every agent and says how
	// many are connected.
	connected() (int, error)
	// push runs n task-push probes on the shard's agents.
	push(n int) (pushResult, error)
	// stop ends the shard and returns its counts.
	stop() (bench.FleetStats, error)
}

func fleet(args []string) error {
	fs := flag.NewFlagSet("fleet", flag.ExitOnError)
	cfgPath := fs.String("config", "", "tetherctl config written by tetherd init")
	pid := fs.Int("server-pid", 0, "tetherd's pid (RSS and CPU from /proc)")
	metrics := fs.String("metrics", "", "tetherd's metrics URL (heartbeats ingested)")
	agents := fs.Int("agents", 1000, "simulated agents in the whole fleet")
	rate := fs.Float64("enroll-rate", 200, "enrollments per second over the whole fleet (0: unbounded)")
	hold := fs.Duration("hold", 2*time.Minute, "how long to hold the fleet once connected (the measured phase)")
	settle := fs.Duration("settle", 10*time.Second, "wait after the last agent connects before measuring")
	interval := fs.Duration("heartbeat", 30*time.Second, "heartbeat interval per agent, jittered ±10% (0: only the first: an idle fleet)")
	sources := fs.Int("sources", 1, "loopback source addresses to spread agents over, from --source-base (0: the kernel's choice)")
	base := fs.String("source-base", "127.0.0.2", "first loopback source address")
	procs := fs.Int("procs", 1, "processes to split the fleet over (this one re-execs itself); each may hold ~19,000 descriptors")
	shardSpec := fs.String("shard", "", "internal: i/n, run shard i of n and talk to the parent on stdin/stdout")
	node := fs.String("node", "", "node to provision from (default: a fresh one)")
	out := fs.String("o", "table", "table or json")
	idDir := fs.String("identities", "", "keep enrolled identities in this directory (one file per shard; use the same --procs) and reuse them on the next run against the same data dir")
	pushTasks := fs.Int("push-tasks", 0, "after the hold, create this many tasks (split over the shards) and time each from CreateTask to the agent's stream")
	storm := fs.String("storm", "", "after the hold, restart tetherd with this signal (term or kill) and measure the reconnect storm")
	stormLog := fs.String("storm-log", "tetherd-restarted.log", "the restarted tetherd's output")
	stormTimeout := fs.Duration("storm-timeout", 3*time.Minute, "give up waiting for every agent to reconnect after this long")
	stormTail := fs.Duration("storm-tail", 30*time.Second, "keep watching this long after every agent is back (late reconnections, liveness marks)")
	series := fs.String("series", "", "write the storm's per-second series (JSON) here, for tether-bench plot")
	endpoints := fs.String("endpoints", "", "the agents' control planes, https://HOST:PORT,https://HOST:PORT as in tether.url (default: the config's endpoint); each agent starts on the first and moves on when one refuses or is down, as the agent's tether.url=URL,URL does")
	connecting := fs.Int("max-connecting", 64, "agents of one process opening a stream at once (0: no bound); simulated agents share cores that real ones do not")
	maxRun := fs.Duration("max-run", 15*time.Minute, "stop the whole run after this long, whatever phase it is in")
	_ = fs.Parse(args)
	if *storm != "" && *storm != "term" && *storm != "kill" {
		return fmt.Errorf("--storm %q: want term or kill", *storm)
	}

	srcs, err := sourceAddrs(*base, *sources)
	if err != nil {
		return err
	}
	tg, err := connectFleetTarget(*cfgPath, *endpoints)
	if err != nil {
		return err
	}
	ctx, cancelRun := context.WithTimeout(context.Background(), *maxRun)
	defer cancelRun()
	sp := shardParams{agents: *agents, rate: *rate, interval: *interval, srcs: srcs, node: *node, idDir: *idDir, connecting: *connecting}
	if *shardSpec != "" {
		return runChildShard(ctx, tg, *shardSpec, sp)
	}
	if *pid == 0 || *metrics == "" {
		return fmt.Errorf("--server-pid and --metrics are required")
	}
	if *procs < 1 {
		return fmt.Errorf("--procs %d: want at least 1", *procs)
	}
	if *node == "" {
		if *node, err = tg.seedNode(ctx); err != nil {
			return err
		}
		sp.node = *node
	}
	progress := os.Stderr
	rss0, err := bench.ProcessRSS(*pid)
	if err != nil {
		return err
	}
	live0, _ := goInUse(*metrics)

	cpuStart, cpuErr := bench.ProcessCPU(*pid)
	start := time.Now()
	var shards []shard
	if *procs == 1 {
		ls, err := startLocalShard(ctx, tg, 0, 1, sp)
		if err != nil {
			return err
		}
		shards = append(shards, ls)
	} else {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		for i := 0; i < *procs; i++ {
			c, err := startChildShard(self, i, *procs, fs, *node)
			if err != nil {
				return err
			}
			shards = append(shards, c)
		}
	}
	total := 0
	for _, s := range shards {
		n, err := s.connected()
		if err != nil {
			return err
		}
		total += n
	}
	enrollSecs := time.Since(start).Seconds()
	var connectCPU float64
	if cpuEnd, err := bench.ProcessCPU(*pid); err == nil && cpuErr == nil && total > 0 {
		connectCPU = float64((cpuEnd - cpuStart).Microseconds()) / 1000 / float64(total)
	}
	fmt.Fprintf(progress, "fleet: %d of %d agents connected in %.0f s (tetherd CPU %.2f ms per agent); settling %s\n", total, *agents, enrollSecs, connectCPU, *settle)
	time.Sleep(*settle)

	before, err := sampleServer(*pid, *metrics)
	if err != nil {
		return err
	}
	holdStart := time.Now()
	var rssSamples []float64
	for deadline := holdStart.Add(*hold); time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(min(10*time.Second, time.Until(deadline)))
		if r, err := bench.ProcessRSS(*pid); err == nil {
			rssSamples = append(rssSamples, float64(r)/(1<<20))
			fmt.Fprintf(progress, "fleet: %3.0f s into the hold: tetherd RSS %.0f MiB\n", time.Since(holdStart).Seconds(), float64(r)/(1<<20))
		}
	}
	holdSecs := time.Since(holdStart).Seconds()
	// A replica killed during the hold (the kill-one-replica run) ends its
	// own figures, not the fleet's: its agents' moves, the other replicas'
	// pushes and the shards' counts are still worth the report.
	after, err := sampleServer(*pid, *metrics)
	serverGone := errors.Is(err, errServerGone)
	switch {
	case serverGone:
		fmt.Fprintf(progress, "fleet: %v; its CPU, RSS and heartbeats over the hold are not reported\n", err)
	case err != nil:
		return err
	}

	var push pushResult
	if *pushTasks > 0 {
		fmt.Fprintf(progress, "fleet: pushing %d tasks\n", *pushTasks)
		for i, s := range shards {
			n := *pushTasks / len(shards)
			if i == len(shards)-1 {
				n = *pushTasks - n*(len(shards)-1)
			}
			part, err := s.push(n)
			if err != nil {
				return err
			}
			push.add(part)
		}
	}
	var sr *stormReport
	if *storm != "" && serverGone {
		return fmt.Errorf("--storm %s: tetherd (pid %d) exited during the hold, before the storm could restart it", *storm, *pid)
	}
	if *storm != "" {
		sig := syscall.SIGTERM
		if *storm == "kill" {
			sig = syscall.SIGKILL
		}
		if sr, err = runStorm(ctx, progress, stormParams{pid: *pid, sig: sig, log: *stormLog, metrics: *metrics, admin: tg.admin,
			want: total, timeout: *stormTimeout, tail: *stormTail}); err != nil {
			return err
		}
	}

	var st bench.FleetStats
	for _, s := range shards {
		part, err := s.stop()
		if err != nil {
			return err
		}
		st.Add(part)
	}
	r := fleetReport{Agents: *agents, Procs: *procs, Sources: len(srcs), HeartbeatInterval: interval.String(),
		EnrollSeconds: enrollSecs, ConnectCPUPerAgentMS: connectCPU, HoldSeconds: holdSecs, Connected: st.Connected, Errors: st.Errors, Reconnects: st.Reconnects,
		RSSBaseMiB: float64(rss0) / (1 << 20), FirstErrors: st.FirstErrs, FailuresByCause: st.Causes, ReusedIdentities: st.Reused,
		RSSSamplesMiB: rssSamples, ServerExited: serverGone}
	if !serverGone {
		r.HeartbeatsPerSec = (after.heartbeats - before.heartbeats) / holdSecs
		r.RSSEndMiB = float64(after.rss) / (1 << 20)
		r.RSSHoldGrowthMiB = float64(after.rss-before.rss) / (1 << 20)
		r.CPUPercentOfCore = 100 * (after.cpu - before.cpu).Seconds() / holdSecs
	}
	if len(push.Lat) > 0 || push.Errors > 0 {
		r.PushTasks, r.PushErrors = len(push.Lat)+push.Errors, push.Errors
		r.PushP50MS = float64(bench.Percentile(push.Lat, 0.5).Microseconds()) / 1000
		r.PushP99MS = float64(bench.Percentile(push.Lat, 0.99).Microseconds()) / 1000
		if push.FirstErr != "" {
			r.FirstErrors = append(r.FirstErrors, push.FirstErr)
		}
	}
	if sr != nil {
		sr.finish(st.Timeline)
		r.Storm = sr
		if *series != "" {
			if err := writeSeries(*series, sr); err != nil {
				return err
			}
		}
	}
	n := float64(st.Connected)
	if sr != nil {
		n = float64(total) // the hold's fleet: the storm's end says nothing of it
	}
	if n > 0 && !serverGone {
		r.RSSPerAgentKiB = float64(after.rss-rss0) / 1024 / n
		r.CPUPerAgentUSPerS = float64((after.cpu - before.cpu).Microseconds()) / holdSecs / n
		if live0 > 0 && after.goInUse > 0 {
			r.GoInUsePerAgentKB = (after.goInUse - live0) / 1024 / n
		}
	}
	if hb := after.heartbeats - before.heartbeats; hb > 0 && !serverGone {
		r.CPUPerHeartbeatUS = float64((after.cpu - before.cpu).Microseconds()) / hb
	}
	printFleet(os.Stdout, r, *out == "json")
	return nil
}

func printFleet(w io.Writer, r fleetReport, asJSON bool) {
	if r.ServerExited {
		fmt.Fprintln(w, "tetherd exited during the hold: the server columns below are not measured")
	}
	fmt.Fprintln(w, "| agents | procs | heartbeat | connected | errors | heartbeats/s | RSS/agent | Go heap+stack/agent | RSS growth in hold | CPU | CPU/heartbeat | CPU/agent/s |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	fmt.Fprintf(w, "| %d | %d | %s | %d | %d | %.0f | %.1f KiB | %.1f KiB | %.1f MiB in %.0f s | %.1f%% of a core | %.0f µs | %.2f µs |\n",
		r.Agents, r.Procs, r.HeartbeatInterval, r.Connected, r.Errors, r.HeartbeatsPerSec, r.RSSPerAgentKiB, r.GoInUsePerAgentKB,
		r.RSSHoldGrowthMiB, r.HoldSeconds, r.CPUPercentOfCore, r.CPUPerHeartbeatUS, r.CPUPerAgentUSPerS)
	if r.PushTasks > 0 {
		fmt.Fprintf(w, "task push: %d tasks, %d errors, p50 %.1f ms, p99 %.1f ms\n", r.PushTasks, r.PushErrors, r.PushP50MS, r.PushP99MS)
	}
	if r.Storm != nil {
		printStorm(w, r.Storm)
	}
	causes := make([]string, 0, len(r.FailuresByCause))
	for c := range r.FailuresByCause {
		causes = append(causes, c)
	}
	sort.Slice(causes, func(i, j int) bool { return r.FailuresByCause[causes[i]] > r.FailuresByCause[causes[j]] })
	for _, c := range causes {
		fmt.Fprintf(w, "failures: %7d  %s\n", r.FailuresByCause[c], c)
	}
	for _, e := range r.FirstErrors {
		fmt.Fprintln(w, "error:", e)
	}
	if asJSON {
		b, _ := json.Marshal(r)
		fmt.Fprintln(w, string(b))
	}
}

func sourceAddrs(base string, n int) ([]net.IP, error) {
	if n <= 0 {
		return nil, nil
	}
	ip := net.ParseIP(base).To4()
	if ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("--source-base %q: want a loopback IPv4 address", base)
	}
	out := make([]net.IP, n)
	v := uint32(ip[0])<<24 | uint32(ip[1])<<16 | uint32(ip[2])<<8 | uint32(ip[3])
	for i := range out {
		x := v + uint32(i)
		out[i] = net.IPv4(byte(x>>24), byte(x>>16), byte(x>>8), byte(x))
		if !out[i].IsLoopback() {
			return nil, fmt.Errorf("--sources %d from %s leaves the loopback network", n, base)
		}
	}
	return out, nil
}

// fleetTarget is target plus a dialer that binds a source address.
type fleetTarget struct {
	*target
	dialFrom func(src net.IP, cert *tls.Certificate) (*grpc.ClientConn, error)
}

func connectFleetTarget(cfgPath, endpoints string) (*fleetTarget, error) {
	tg, err := connectTarget(cfgPath)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, err
	}
	var cfg config
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, err
	}
	caPath := cfg.CA
	if !filepath.IsAbs(caPath) {
		caPath = filepath.Join(filepath.Dir(cfgPath), caPath)
	}
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(cfg.Endpoint)
	eps, err := fleetEndpoints(endpoints)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM certificate", caPath)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", caPath, err)
	}
	target, host := agentTarget(cfg.Endpoint, host, eps)
	dialFrom, err := agentDialer(ca, host, target, eps)
	if err != nil {
		return nil, err
	}
	return &fleetTarget{target: tg, dialFrom: dialFrom}, nil
}

// agentTarget is where the agents connect first: the one --endpoints URL
// when there is one (with several, each agent's failover dialer picks),
// else the admin config's endpoint. With one URL, the agents once went to
// the config's endpoint and the flag was silently ignored.
func agentTarget(cfgEndpoint, cfgHost string, eps []agentenroll.Endpoint) (target, host string) {
	if len(eps) == 1 {
		return eps[0].Target, eps[0].Host
	}
	return cfgEndpoint, cfgHost
}

// agentDialer opens a simulated agent's connection to target from its
// source address. With several endpoints, each agent (known by its
// certificate) walks them as the real agent does, through its own
// enroll.Failover: the failover's dialer and its credentials, whose
// failed handshake (a replica at its connection cap accepts and closes at
// once) moves the agent on. With the dialer alone, an agent refused that
// way retried the same full replica for ever.
func agentDialer(ca *x509.Certificate, host, target string, eps []agentenroll.Endpoint) (func(src net.IP, cert *tls.Certificate) (*grpc.ClientConn, error), error) {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	var pin *agentenroll.Pin
	if len(eps) > 1 {
		var err error
		if pin, err = agentenroll.NewPin(pki.Fingerprint(ca.Raw), host, time.Now); err != nil {
			return nil, err
		}
		if err := pin.SetKnownCA(ca); err != nil {
			return nil, err
		}
	}
	failovers := &agentFailovers{}
	return func(src net.IP, c *tls.Certificate) (*grpc.ClientConn, error) {
		t := &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS13}
		if c != nil {
			t.Certificates = []tls.Certificate{*c}
		}
		d := &net.Dialer{Timeout: 10 * time.Second}
		if src != nil {
			d.LocalAddr = &net.TCPAddr{IP: src}
		}
		dial := func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
		creds := credentials.NewTLS(t)
		if c != nil && pin != nil {
			f := failovers.of(c, eps, d)
			pt := pin.TLSConfig(nil)
			pt.Certificates = []tls.Certificate{*c}
			dial, creds = f.DialContext, f.Credentials(pt, pin)
		}
		return grpc.NewClient(target, grpc.WithTransportCredentials(creds),
			grpc.WithContextDialer(dial),
			// As tetherd does for its side: a simulated agent is an idle
			// connection most of the time, and gRPC's 32 KiB read buffer and
			// per-connection write buffer were most of the simulator's
			// 122 KiB per agent, which would cap a 100,000-agent run on
			// this machine's memory before anything it measures.
			grpc.WithReadBufferSize(0), grpc.WithSharedWriteBuffer(true))
	}, nil
}

// fleetEndpoints parses --endpoints, which takes the agent's own
// tether.url syntax (https://HOST:PORT,https://HOST:PORT).
func fleetEndpoints(raw string) ([]agentenroll.Endpoint, error) {
	if raw == "" {
		return nil, nil
	}
	eps, err := agentenroll.SplitURLs(raw)
	if err != nil {
		return nil, fmt.Errorf("--endpoints: %w", err)
	}
	return eps, nil
}

// agentFailovers keeps each simulated agent's failover dialer, keyed by
// its certificate (one per agent, for the fleet's life), so that an agent
// that moved to another replica stays there, as the real agent does.
type agentFailovers struct{ m sync.Map }

func (a *agentFailovers) of(cert *tls.Certificate, eps []agentenroll.Endpoint, d *net.Dialer) *agentenroll.Failover {
	if f, ok := a.m.Load(cert); ok {
		return f.(*agentenroll.Failover)
	}
	f, _ := a.m.LoadOrStore(cert, &agentenroll.Failover{Endpoints: eps, Dial: d.DialContext})
	return f.(*agentenroll.Failover)
}

// shardParams are the fleet flags a shard needs.
type shardParams struct {
	agents   int
	rate     float64
	interval time.Duration
	srcs     []net.IP
	node     string
	idDir    string
	// connecting bounds each process's agents opening a stream at once.
	connecting int
}

// localShard runs agents in this process.
type localShard struct {
	done chan struct{}
	f    *bench.Fleet
	ids  *bench.IdentityFile
	ctx  context.Context
}

func startLocalShard(ctx context.Context, tg *fleetTarget, i, n int, p shardParams) (*localShard, error) {
	per, offset := p.agents/n, i*(p.agents/n)
	if i == n-1 {
		per = p.agents - offset
	}
	s := &localShard{done: make(chan struct{}), ctx: ctx}
	o := bench.FleetOptions{Agents: per, Offset: offset, EnrollRate: p.rate / float64(n), Heartbeat: p.interval,
		Sources: p.srcs, Dial: tg.dialFrom, Admin: tg.admin, Enroll: v1.NewEnrollmentServiceClient(mustDial(tg.target)), Node: p.node,
		MaxConnecting: p.connecting}
	var enrollConns []*grpc.ClientConn
	if len(p.srcs) > 0 {
		// Enrollment is rate-limited per source: enroll from the agent's.
		bySrc := map[string]v1.EnrollmentServiceClient{}
		for _, src := range p.srcs {
			conn, err := tg.dialFrom(src, nil)
			if err != nil {
				return nil, err
			}
			enrollConns = append(enrollConns, conn)
			bySrc[src.String()] = v1.NewEnrollmentServiceClient(conn)
		}
		o.EnrollFrom = func(src net.IP) v1.EnrollmentServiceClient { return bySrc[src.String()] }
	}
	if p.idDir != "" {
		if err := os.MkdirAll(p.idDir, 0o700); err != nil {
			return nil, err
		}
		ids, known, err := bench.OpenIdentities(filepath.Join(p.idDir, fmt.Sprintf("shard-%d-of-%d.jsonl", i, n)))
		if err != nil {
			return nil, err
		}
		s.ids, o.Known, o.Save = ids, known, ids.Save
	}
	go func() {
		defer close(s.done)
		s.f = bench.StartFleet(ctx, o)
		// Every agent is enrolled: give tetherd back the descriptors
		// (at 19,000 agents its connection cap is that close).
		for _, c := range enrollConns {
			_ = c.Close()
		}
	}()
	return s, nil
}

func (s *localShard) connected() (int, error) {
	<-s.done
	// The last streams open just after their enrollment returns.
	for deadline := time.Now().Add(30 * time.Second); int64(s.f.Connected()) < s.f.Stats().Enrolled+s.f.Stats().Reused && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond) // a deadline poll on the streams' own goroutines
	}
	return s.f.Connected(), nil
}

func (s *localShard) push(n int) (pushResult, error) {
	<-s.done
	lat, errs, first := s.f.PushProbe(s.ctx, n)
	r := pushResult{Lat: lat, Errors: errs}
	if first != nil {
		r.FirstErr = first.Error()
	}
	return r, nil
}

func (s *localShard) stop() (bench.FleetStats, error) {
	<-s.done
	st := s.f.Stats() // before Stop, which closes every stream
	s.f.Stop()
	if s.ids != nil {
		if err := s.ids.Close(); err != nil {
			return st, err
		}
	}
	return st, nil
}

// pushResult is a shard's task-push probe.
type pushResult struct {
	Lat      []time.Duration `json:"latencies"`
	Errors   int             `json:"errors"`
	FirstErr string          `json:"first_error,omitempty"`
}

func (p *pushResult) add(o pushResult) {
	p.Lat = append(p.Lat, o.Lat...)
	p.Errors += o.Errors
	if p.FirstErr == "" {
		p.FirstErr = o.FirstErr
	}
}

// runChildShard is a child process: it runs its shard, prints
// "connected N" when every agent was tried, then answers the parent's
// commands on stdin ("push N": one line of JSON) until stdin closes, and
// last prints its counts as JSON.
func runChildShard(ctx context.Context, tg *fleetTarget, spec string, p shardParams) error {
	i, n, err := parseShard(spec)
	if err != nil {
		return err
	}
	if p.node == "" {
		return fmt.Errorf("--shard needs --node")
	}
	s, err := startLocalShard(ctx, tg, i, n, p)
	if err != nil {
		return err
	}
	c, _ := s.connected()
	fmt.Printf("connected %d\n", c)
	enc := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() { // the parent closes stdin to stop us
		var k int
		if _, err := fmt.Sscanf(in.Text(), "push %d", &k); err != nil {
			return fmt.Errorf("shard %s: command %q: %w", spec, in.Text(), err)
		}
		r, _ := s.push(k)
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	st, err := s.stop()
	if err != nil {
		return err
	}
	return enc.Encode(st)
}

func parseShard(spec string) (int, int, error) {
	a, b, ok := strings.Cut(spec, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return 0, 0, fmt.Errorf("--shard %q: want i/n with 0 <= i < n", spec)
	}
	return i, n, nil
}

// childShard is a shard in a child process.
type childShard struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startChildShard(self string, i, n int, fs *flag.FlagSet, node string) (*childShard, error) {
	var args []string
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "procs", "shard", "node", "o", "server-pid", "metrics", "hold", "settle", "push-tasks", "storm", "storm-log",
			"storm-timeout", "storm-tail", "series":
		default:
			args = append(args, "--"+f.Name+"="+f.Value.String())
		}
	})
	args = append([]string{"fleet"}, append(args, "--shard="+strconv.Itoa(i)+"/"+strconv.Itoa(n), "--node="+node)...)
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start shard %d: %w", i, err)
	}
	return &childShard{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}, nil
}

func (c *childShard) connected() (int, error) {
	line, err := c.out.ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("shard %v: %w", c.cmd.Args, err)
	}
	var n int
	if _, err := fmt.Sscanf(line, "connected %d", &n); err != nil {
		return 0, fmt.Errorf("shard said %q: %w", line, err)
	}
	return n, nil
}

func (c *childShard) push(n int) (pushResult, error) {
	var r pushResult
	if _, err := fmt.Fprintf(c.stdin, "push %d\n", n); err != nil {
		return r, fmt.Errorf("shard %v: %w", c.cmd.Args, err)
	}
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		return r, fmt.Errorf("shard %v: %w", c.cmd.Args, err)
	}
	return r, json.Unmarshal(line, &r)
}

func (c *childShard) stop() (bench.FleetStats, error) {
	_ = c.stdin.Close()
	var st bench.FleetStats
	if err := json.NewDecoder(c.out).Decode(&st); err != nil {
		return st, fmt.Errorf("shard result: %w", err)
	}
	return st, c.cmd.Wait()
}

// errServerGone marks a --server-pid process that no longer exists.
var errServerGone = errors.New("tetherd is gone")

// serverSample is tetherd's counters at one moment of the run.
type serverSample struct {
	cpu        time.Duration
	rss        int64
	heartbeats float64
	goInUse    float64 // 0 when the metrics do not say
}

// sampleServer reads pid's CPU and RSS from /proc and its heartbeat count
// from its metrics. A process that has exited is errServerGone, so that a
// hold can outlive a replica killed under it.
func sampleServer(pid int, metrics string) (serverSample, error) {
	var s serverSample
	var err error
	if s.cpu, err = bench.ProcessCPU(pid); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return s, fmt.Errorf("%w (pid %d exited)", errServerGone, pid)
		}
		return s, err
	}
	if s.rss, err = bench.ProcessRSS(pid); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return s, fmt.Errorf("%w (pid %d exited)", errServerGone, pid)
		}
		return s, err
	}
	if s.heartbeats, err = counter(metrics, "tether_heartbeats_total"); err != nil {
		return s, fmt.Errorf("tetherd's metrics: %w", err)
	}
	s.goInUse, _ = goInUse(metrics)
	return s, nil
}
