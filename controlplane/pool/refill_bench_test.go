package pool_test

import (
	"context"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/internal/tools/bench"
)

// BenchmarkRefill measures refill latency: from a successful acquire on a
// pool at its target until the pool is back at target (ready members ==
// target again). The control plane runs as tetherd runs it, in process:
// the reaper ticks every pool.DefaultReaperEvery on the wall clock, the
// nudge runner replenishes on demand, and the worker provisions on the
// fake provider. A stand-in agent reports every booted member ready as
// soon as it sees it (it looks every 2 ms), so a boot costs nothing here
// and what is left is the control plane's own delay. Run it with
// -benchtime 3x: when refill waits for the reaper, each iteration takes
// up to a reaper period.
func BenchmarkRefill(b *testing.B) {
	const target = 2
	f := instancestest.New(b, instancestest.SQLite(b), instancestest.Options{Owner: "refill-bench", ProvisionAttempts: 1, Timeout: 30 * time.Minute})
	svc := f.Services.Pools
	ctx, cancel := context.WithCancel(f.Ctx)
	defer cancel()
	done := make(chan struct{}, 4)
	run := func(fn func(context.Context)) {
		go func() { defer func() { done <- struct{}{} }(); fn(ctx) }()
	}
	run(f.Worker.Run)
	run(svc.RunNudges)
	run(func(ctx context.Context) { reap(ctx, b, svc) })

	v, err := svc.Create(f.Ctx, pool.CreateParams{Name: "refill", Template: f.Template.Name, Provider: "fake", TargetSize: target})
	if err != nil {
		b.Fatal(err)
	}
	p := v.Pool
	run(func(ctx context.Context) { agent(ctx, b, f.Store, f.Instances.AgentReady, svc.ReadyHook, p.ID) })
	atTarget := func() {
		b.Helper()
		for {
			c, err := f.Store.CountPoolMembers(f.Ctx, p.ID)
			if err != nil {
				b.Fatal(err)
			}
			if c.Ready >= target {
				return
			}
			select {
			case <-ctx.Done():
				b.Fatal(ctx.Err())
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	// Warm the pool up: create nudges it in the version with nudges; the
	// reaper's first tick does otherwise.
	atTarget()
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c, err := svc.Acquire(f.Ctx, pool.AcquireParams{PoolID: p.ID, AcquiredBy: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		atTarget()
		lat = append(lat, time.Since(start))
		b.StopTimer()
		// The claimed member is the caller's to keep; give it back untimed
		// so max_size never binds.
		if _, err := svc.Release(f.Ctx, c.Instance.ID, "bench"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	cancel()
	for range 4 {
		<-done
	}
	b.ReportMetric(float64(bench.Percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(bench.Percentile(lat, 1).Microseconds())/1000, "max-ms")
}

// reap runs the reaper on the wall clock, as the daemon's loop does.
func reap(ctx context.Context, b *testing.B, svc *pool.Service) {
	t := time.NewTicker(pool.DefaultReaperEvery)
	defer t.Stop()
	for {
		if _, err := svc.Tick(ctx); err != nil && ctx.Err() == nil {
			b.Error(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// agent reports every warming member of the pool ready once its machine
// booted (its instance left pending).
func agent(ctx context.Context, b *testing.B, st store.Store, ready func(context.Context, store.InstanceID, ...instances.ReadyHook) error, hook instances.ReadyHook, poolID store.PoolID) {
	for {
		ins, err := st.ListInstances(ctx, store.InstanceFilter{PoolID: poolID, PoolStates: []lifecycle.PoolState{lifecycle.PoolWarming},
			Statuses: []lifecycle.State{lifecycle.Provisioning, lifecycle.Starting}}, store.Page{Limit: store.MaxPageSize})
		if err != nil && ctx.Err() == nil {
			b.Error(err)
		}
		for _, in := range ins {
			if in.CloudInstanceID == "" {
				continue // the provider has not answered yet
			}
			if err := ready(ctx, in.ID, hook); err != nil && ctx.Err() == nil {
				b.Error(err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}
