package storetest

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// benchFleet is the number of instances the heartbeat benchmark writes
// to, about the 19,000 agents of the fleet test that asked for it: the
// table's size, not just the batch's, shapes the cost of a row update.
const benchFleet = 20000

// BenchRecordHeartbeats measures RecordHeartbeats as the agent hub calls
// it: one transaction per flush, in batches of 1, 100 and 1,000
// heartbeats. One op is one heartbeat, so ns/op is the wall time per
// heartbeat; cpu-ns/heartbeat is this process's CPU (user + system) per
// heartbeat: all of the server's for SQLite, only the client side for
// PostgreSQL, whose work runs in its own processes. serverCPU, if not nil,
// reads an out-of-process server's CPU time so far, reported as
// server-cpu-ns/heartbeat.
func BenchRecordHeartbeats(b *testing.B, s store.Store, serverCPU func() (time.Duration, error)) {
	// No deadline: ctx's 30 s would end a -count 3 run midway.
	c := context.Background()
	n := seedNode(b, s, "bench")
	ids := make([]store.InstanceID, 0, benchFleet)
	for len(ids) < benchFleet {
		var created []store.InstanceID // per attempt: Tx may run fn again
		must(b, s.Tx(c, func(q store.Queries) error {
			created = created[:0]
			for range 1000 {
				in := newInstance(n.ID, lifecycle.Running)
				if err := q.CreateInstance(c, in); err != nil {
					return err
				}
				created = append(created, in.ID)
			}
			return nil
		}))
		ids = append(ids, created...)
	}
	// Every batch is a little later than the last, so each heartbeat is
	// really written (none is skipped as older than the stored one).
	at := t0
	for _, size := range []int{1, 100, 1000} {
		b.Run("batch="+strconv.Itoa(size), func(b *testing.B) {
			batch := make([]store.Heartbeat, 0, size)
			next := 0
			cpu0 := cpuTime(b)
			srv0 := readServerCPU(b, serverCPU)
			b.ResetTimer()
			for done := 0; done < b.N; done += len(batch) {
				at = at.Add(time.Millisecond)
				batch = batch[:0]
				for j := 0; j < size && done+j < b.N; j++ {
					batch = append(batch, store.Heartbeat{
						InstanceID: ids[next], At: at, Phase: "ready", AgentVersion: "v1.0.0",
						RunningModules: []string{"sha256:aa", "sha256:bb"}, Addresses: []string{"10.0.2.15"}, BootID: "boot-" + strconv.Itoa(next),
					})
					next = (next + 1) % len(ids)
				}
				if err := s.Tx(c, func(q store.Queries) error { return q.RecordHeartbeats(c, batch) }); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/heartbeat")
			if serverCPU != nil {
				b.ReportMetric(float64(readServerCPU(b, serverCPU)-srv0)/float64(b.N), "server-cpu-ns/heartbeat")
			}
		})
	}
}

// cpuTime is this process's CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func readServerCPU(b *testing.B, serverCPU func() (time.Duration, error)) time.Duration {
	if serverCPU == nil {
		return 0
	}
	d, err := serverCPU()
	if err != nil {
		b.Fatalf("server CPU time: %v", err)
	}
	return d
}

// BenchStreamTaskCheck measures what each new agent stream asks of the
// store on connect, AgentWork, beside the ListTasks call it replaced (an
// IN list and a sort), from 8 goroutines at once as in a reconnect storm.
// The instances have finished tasks and one in ten a pending one.
func BenchStreamTaskCheck(b *testing.B, s store.Store) {
	c := context.Background()
	const instances = 2000
	ids := make([]store.InstanceID, instances)
	must(b, s.Tx(c, func(q store.Queries) error {
		for i := range ids {
			ids[i] = store.InstanceID("bench-" + strconv.Itoa(i))
			for j := range 4 {
				t := newTask(ids[i], store.TaskTargetAgent, t0.Add(time.Duration(j)*time.Second))
				t.Status = store.TaskSucceeded
				if err := q.CreateTask(c, t); err != nil {
					return err
				}
			}
			if i%10 == 0 {
				if err := q.CreateTask(c, newTask(ids[i], store.TaskTargetAgent, t0)); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	for _, tc := range []struct {
		name  string
		check func(id store.InstanceID) error
	}{
		{"AgentWork", func(id store.InstanceID) error { _, _, err := s.AgentWork(c, id); return err }},
		{"ListTasks", func(id store.InstanceID) error {
			_, err := s.ListTasks(c, store.TaskFilter{InstanceID: id, Target: store.TaskTargetAgent,
				Statuses: []store.TaskStatus{store.TaskPending, store.TaskLeased, store.TaskRunning}}, store.Page{Limit: store.MaxPageSize})
			return err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var next atomic.Int64
			cpu0 := cpuTime(b)
			b.SetParallelism(4) // 8 goroutines on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := tc.check(ids[next.Add(1)%instances]); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
