package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/internal/tools/bench"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// push: task created -> agent receives it, with N connected agents.
func push(args []string) error {
	fs := flag.NewFlagSet("push", flag.ExitOnError)
	cfgPath := fs.String("config", "", "tetherctl config written by tetherd init")
	agents := fs.Int("agents", 1000, "connected simulated agents")
	tasks := fs.Int("tasks", 1000, "tasks to create, one at a time")
	_ = fs.Parse(args)
	tg, err := connectTarget(*cfgPath)
	if err != nil {
		return err
	}
	ctx := context.Background()
	sims, err := enrollAndConnect(ctx, tg, *agents, func(a *bench.SimAgent, m *v1.ControlMessage, arrived map[string]chan time.Time) {
		if t := m.GetTask(); t != nil {
			arrived[a.InstanceID] <- time.Now()
			_ = a.Finish(t.TaskId)
		}
	})
	if err != nil {
		return err
	}
	defer closeAll(sims.agents)
	r, err := bench.PushLatency(ctx, tg.admin, sims.agents, sims.arrived, *tasks)
	if err != nil {
		return err
	}
	if r.Errors > 0 {
		fmt.Fprintf(os.Stderr, "%d tasks failed; first: %v\n", r.Errors, r.FirstError)
	}
	fmt.Println("| connected agents | tasks | p50 create→received | p99 |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| %d | %d | %.1f ms | %.1f ms |\n", *agents, r.N, ms(r.P50), ms(r.P99))
	return nil
}

// heartbeats: N agents heartbeat at an interval (0 = as fast as they can);
// reports what tetherd ingested per second, its CPU and its RSS per agent.
func heartbeats(args []string) error {
	fs := flag.NewFlagSet("heartbeats", flag.ExitOnError)
	cfgPath := fs.String("config", "", "tetherctl config written by tetherd init")
	pid := fs.Int("server-pid", 0, "tetherd's pid (RSS and CPU)")
	metrics := fs.String("metrics", "", "tetherd's metrics URL (heartbeats it ingested)")
	agents := fs.Int("agents", 1000, "connected simulated agents")
	interval := fs.Duration("interval", time.Second, "heartbeat interval per agent (0: back to back)")
	duration := fs.Duration("duration", 20*time.Second, "measured phase")
	_ = fs.Parse(args)
	if *pid == 0 || *metrics == "" {
		return fmt.Errorf("--server-pid and --metrics are required")
	}
	tg, err := connectTarget(*cfgPath)
	if err != nil {
		return err
	}
	ctx := context.Background()
	// Identities first, so enrollment does not count towards connection memory.
	node, err := tg.seedNode(ctx)
	if err != nil {
		return err
	}
	list, err := bench.EnrollAgents(ctx, tg.admin, v1.NewEnrollmentServiceClient(mustDial(tg)), node, *agents)
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	rssBefore, err := bench.ProcessRSS(*pid)
	if err != nil {
		return err
	}
	liveBefore, err := goInUse(*metrics)
	if err != nil {
		return err
	}
	for _, a := range list {
		if err := a.Connect(ctx, tg.dial, nil); err != nil {
			return err
		}
	}
	defer closeAll(list)
	time.Sleep(3 * time.Second)
	rssAfter, err := bench.ProcessRSS(*pid)
	if err != nil {
		return err
	}
	liveAfter, err := goInUse(*metrics)
	if err != nil {
		return err
	}
	before, err := counter(*metrics, "tether_heartbeats_total")
	if err != nil {
		return err
	}
	cpu0, _ := bench.ProcessCPU(*pid)
	var sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, a := range list {
		wg.Add(1)
		go func(a *bench.SimAgent) {
			defer wg.Done()
			var tick <-chan time.Time
			if *interval > 0 {
				t := time.NewTicker(*interval)
				defer t.Stop()
				tick = t.C
			}
			for {
				if tick != nil {
					select {
					case <-stop:
						return
					case <-tick:
					}
				} else {
					select {
					case <-stop:
						return
					default:
					}
				}
				if a.Heartbeat(v1.AgentPhase_AGENT_PHASE_READY) != nil {
					return
				}
				sent.Add(1)
			}
		}(a)
	}
	start := time.Now()
	time.Sleep(*duration)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	time.Sleep(2 * time.Second) // let the server drain what was sent
	after, err := counter(*metrics, "tether_heartbeats_total")
	if err != nil {
		return err
	}
	cpu1, _ := bench.ProcessCPU(*pid)
	ingested := after - before
	fmt.Println("| agents | interval | sent/s | ingested/s | server CPU | heap+stack in use per agent | RSS per agent |")
	fmt.Println("|---|---|---|---|---|---|---|")
	fmt.Printf("| %d | %s | %.0f | %.0f | %.0f%% | %.1f KiB | %.1f KiB |\n", *agents, *interval, float64(sent.Load())/elapsed.Seconds(),
		ingested/elapsed.Seconds(), 100*(cpu1-cpu0).Seconds()/elapsed.Seconds(),
		(liveAfter-liveBefore)/1024/float64(*agents), float64(rssAfter-rssBefore)/1024/float64(*agents))
	return nil
}

type connected struct {
	agents  []*bench.SimAgent
	arrived map[string]chan time.Time
}

func enrollAndConnect(ctx context.Context, tg *target, n int, onMsg func(*bench.SimAgent, *v1.ControlMessage, map[string]chan time.Time)) (*connected, error) {
	node, err := tg.seedNode(ctx)
	if err != nil {
		return nil, err
	}
	list, err := bench.EnrollAgents(ctx, tg.admin, v1.NewEnrollmentServiceClient(mustDial(tg)), node, n)
	if err != nil {
		return nil, err
	}
	c := &connected{agents: list, arrived: map[string]chan time.Time{}}
	for _, a := range list {
		c.arrived[a.InstanceID] = make(chan time.Time, 16)
	}
	for _, a := range list {
		if err := a.Connect(ctx, tg.dial, func(a *bench.SimAgent, m *v1.ControlMessage) { onMsg(a, m, c.arrived) }); err != nil {
			return nil, err
		}
	}
	time.Sleep(2 * time.Second) // let every stream settle
	return c, nil
}

func mustDial(tg *target) *grpc.ClientConn {
	conn, err := tg.dial(nil)
	if err != nil {
		panic(err)
	}
	return conn
}

func closeAll(as []*bench.SimAgent) {
	for _, a := range as {
		a.Close()
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// counter reads one counter from a Prometheus text endpoint.
// metricsClient bounds a scrape: a tetherd that accepts and hangs must
// not stall the run.
var metricsClient = &http.Client{Timeout: 5 * time.Second}

func counter(url, name string) (float64, error) {
	resp, err := metricsClient.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+" ") {
			return strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(line, name)), 64)
		}
	}
	return 0, fmt.Errorf("%s not found at %s", name, url)
}

// goInUse is the Go runtime's in-use heap plus goroutine stacks: the
// memory connections really hold, without the GC's headroom that RSS has.
func goInUse(url string) (float64, error) {
	heap, err := counter(url, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return 0, err
	}
	stack, err := counter(url, "go_memstats_stack_inuse_bytes")
	return heap + stack, err
}
