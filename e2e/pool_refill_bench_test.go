package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/tools/bench"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// BenchmarkPoolRefillVM measures a real refill: a pool of 2 qemu VMs at
// target, one member acquired, and the time until the pool has 2 ready
// members again. The replacement has to boot, so the target is one boot
// plus at most 1 s of control plane delay; the benchmark reports the
// replacement's own boot (its created_at to its pool_ready_at, both
// stamped by tetherd) and the difference ("overhead"). The acquired member
// is released untimed (recycled: its VM is destroyed). Run it with:
//
//	TETHER_E2E=1 go test -tags nobadger,nobbolt,nomysql -run '^$' -bench PoolRefillVM -benchtime 3x -timeout 30m ./e2e/
func BenchmarkPoolRefillVM(b *testing.B) {
	env := newVMEnv(b)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	const name, target = "refill", 2
	if _, err := env.cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: name, Template: env.template, Provider: "qemu", TargetSize: target}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = env.cp.Admin.DrainPool(dctx, &v1.PoolActionRequest{Name: name})
	})
	atTarget := func() *v1.Pool {
		b.Helper()
		deadline := time.Now().Add(2 * bootTimeout)
		for {
			p, err := env.cp.Admin.GetPool(ctx, &v1.GetPoolRequest{Name: name})
			if err == nil && p.Counts.GetReady() >= target {
				return p
			}
			if time.Now().After(deadline) {
				b.Fatalf("pool never back at %d ready: %v %v", target, p.GetCounts(), err)
			}
			// Polls a running tetherd over its API; 50 ms is the
			// resolution of the refill times below.
			time.Sleep(50 * time.Millisecond)
		}
	}
	ready := func(p *v1.Pool) []string {
		var ids []string
		for _, m := range p.Members {
			if m.PoolState == v1.PoolState_POOL_STATE_READY {
				ids = append(ids, m.InstanceId)
			}
		}
		return ids
	}
	before := ready(atTarget()) // warm-up, untimed
	var refill, boot, overhead []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		claim, err := env.cp.Admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: name, AcquiredBy: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		p := atTarget()
		took := time.Since(start)
		b.StopTimer()
		now := ready(p)
		var fresh string
		for _, id := range now {
			if !slices.Contains(before, id) {
				fresh = id
			}
		}
		if fresh == "" {
			b.Fatalf("refill %d: no new ready member (before %v, now %v)", i, before, now)
		}
		in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: fresh})
		if err != nil || in.PoolReadyAt == nil {
			b.Fatalf("replacement %s: %v (ready at %v)", fresh, err, in.GetPoolReadyAt())
		}
		bt := in.PoolReadyAt.AsTime().Sub(in.CreatedAt.AsTime())
		refill, boot, overhead = append(refill, took), append(boot, bt), append(overhead, took-bt)
		b.Logf("refill %d: %.2fs (replacement boot %.2fs, overhead %.2fs)", i, took.Seconds(), bt.Seconds(), (took - bt).Seconds())
		if _, err := env.cp.Admin.ReleasePoolMember(ctx, &v1.ReleasePoolMemberRequest{InstanceId: claim.Instance.Id}); err != nil {
			b.Fatal(err)
		}
		before = now
		b.StartTimer()
	}
	b.StopTimer()
	secs := func(d time.Duration) float64 { return d.Seconds() }
	b.ReportMetric(secs(bench.Percentile(refill, 0.5)), "refill-p50-s")
	b.ReportMetric(secs(bench.Percentile(refill, 1)), "refill-max-s")
	b.ReportMetric(secs(bench.Percentile(boot, 0.5)), "boot-p50-s")
	b.ReportMetric(secs(bench.Percentile(overhead, 0.5)), "overhead-p50-s")
	b.ReportMetric(secs(bench.Percentile(overhead, 1)), "overhead-max-s")
}
