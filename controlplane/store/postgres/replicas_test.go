package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tetherfleet/tether/controlplane/loops"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/postgres"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func workerTask(i int) *store.Task {
	at := t0.Add(time.Duration(i) * time.Millisecond)
	return &store.Task{Target: store.TaskTargetWorker, InstanceID: "i1", Kind: "provision", Payload: []byte(`{}`),
		Status: store.TaskPending, MaxAttempts: 3, CreatedAt: at, UpdatedAt: at}
}

// Two replicas on one database: 64 claimers spread over both never lease
// one task twice, and every task is leased.
func TestReplicasTaskClaimRace(t *testing.T) {
	dsn := pg.DSN(t)
	replicas := []*postgres.Store{open(t, dsn, postgres.Options{}), open(t, dsn, postgres.Options{})}
	ctx := ctxT(t, 60*time.Second)
	const tasks, claimers = 500, 64
	for i := 0; i < tasks; i++ {
		if err := replicas[i%2].CreateTask(ctx, workerTask(i)); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[store.TaskID]string{}
	perReplica := [2]int{}
	var wg sync.WaitGroup
	for w := 0; w < claimers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			s, owner := replicas[w%2], fmt.Sprintf("replica-%d/worker-%d", w%2, w)
			for {
				var got *store.Task
				err := s.Tx(ctx, func(q store.Queries) error {
					var err error
					got, err = q.ClaimTask(ctx, store.TaskClaim{Target: store.TaskTargetWorker, Owner: owner, Now: t0, LeaseUntil: t0.Add(time.Minute)})
					return err
				})
				if errors.Is(err, store.ErrNotFound) {
					return
				}
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				mu.Lock()
				if prev, dup := seen[got.ID]; dup {
					t.Errorf("task %s leased twice: to %s and %s", got.ID, prev, owner)
				}
				seen[got.ID] = owner
				perReplica[w%2]++
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if len(seen) != tasks {
		t.Fatalf("%d tasks leased, want %d", len(seen), tasks)
	}
	if perReplica[0] == 0 || perReplica[1] == 0 {
		t.Fatalf("claims per replica %v: both replicas must take part", perReplica)
	}
	leased, err := replicas[0].ListTasks(ctx, store.TaskFilter{Statuses: []store.TaskStatus{store.TaskLeased}}, store.Page{Limit: store.MaxPageSize})
	if err != nil {
		t.Fatal(err)
	}
	if len(leased) != tasks {
		t.Fatalf("%d tasks leased in the database, want %d", len(leased), tasks)
	}
}

func recv(t *testing.T, ch <-chan string, want string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("notification %q not delivered within %s", want, within)
		}
	}
}

// A notification committed through one replica reaches subscribers of
// both; a rolled-back one reaches nobody.
func TestReplicasNotifications(t *testing.T) {
	dsn := pg.DSN(t)
	a, b := open(t, dsn, postgres.Options{}), open(t, dsn, postgres.Options{})
	ctx := ctxT(t, 30*time.Second)

	onA, stopA := a.Subscribe(store.ChannelTasks)
	defer stopA()
	onB, stopB := b.Subscribe(store.ChannelTasks)
	defer stopB()
	_ = a.Tx(ctx, func(q store.Queries) error {
		if err := q.Notify(ctx, store.ChannelTasks, "rolled-back"); err != nil {
			return err
		}
		return errors.New("abort")
	})
	if err := a.Tx(ctx, func(q store.Queries) error { return q.Notify(ctx, store.ChannelTasks, "i-1") }); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan string{"A": onA, "B": onB} {
		select {
		case got := <-ch:
			if got != "i-1" {
				t.Fatalf("replica %s got %q first, want i-1 (a rolled-back notification leaked?)", name, got)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("replica %s: no notification", name)
		}
	}

	// A channel nobody listened on before: Subscribe LISTENs before it
	// returns, so the next commit is seen.
	custom, stopC := b.Subscribe("tether_custom")
	defer stopC()
	if err := a.Notify(ctx, "tether_custom", "hello"); err != nil {
		t.Fatal(err)
	}
	recv(t, custom, "hello", 5*time.Second)

	// Events written on B are seen by a watcher subscribed on A.
	evs, stopE := a.Subscribe(store.ChannelEvents)
	defer stopE()
	e := &store.Event{Kind: "k", Severity: 1, CreatedAt: t0}
	if err := b.AppendEvent(ctx, e); err != nil {
		t.Fatal(err)
	}
	recv(t, evs, strconv.FormatInt(e.ID, 10), 5*time.Second)
}

// Event ids become visible in order even when the transactions that drew
// them commit in another order, so a watcher following ids across
// replicas never steps over an event.
func TestReplicasEventWatchMissesNothing(t *testing.T) {
	dsn := pg.DSN(t)
	a, b := open(t, dsn, postgres.Options{}), open(t, dsn, postgres.Options{})
	ctx := ctxT(t, 60*time.Second)
	const writers, perWriter = 16, 25
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			s := []*postgres.Store{a, b}[w%2]
			for i := 0; i < perWriter; i++ {
				err := s.Tx(ctx, func(q store.Queries) error {
					if err := q.AppendEvent(ctx, &store.Event{Kind: "k", Severity: 1, InstanceID: store.InstanceID(strconv.Itoa(w)), CreatedAt: t0}); err != nil {
						return err
					}
					// Keep the transactions open for different times, so that
					// they end in another order than they began. The events are
					// written at commit (sqlstore.flushEvents), under the lock
					// that makes ids visible in order.
					time.Sleep(time.Duration(i%3) * time.Millisecond)
					return q.CreateToken(ctx, &store.Token{Hash: fmt.Sprintf("%d-%d", w, i), InstanceID: "x", ExpiresAt: t0, CreatedAt: t0})
				})
				if err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}(w)
	}
	go func() { wg.Wait(); close(done) }()

	// The watcher: follow ids as events.Watch does, as fast as it can.
	seen := map[int64]bool{}
	var after int64
	follow := func() {
		evs, err := a.ListEventsSince(ctx, store.EventFilter{}, after, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			seen[e.ID] = true
			after = e.ID
		}
	}
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		follow()
	}
	follow()
	all, err := b.ListEventsSince(ctx, store.EventFilter{}, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != writers*perWriter {
		t.Fatalf("%d events written, want %d", len(all), writers*perWriter)
	}
	for _, e := range all {
		if !seen[e.ID] {
			t.Fatalf("the watcher stepped over event %d (it committed after a higher id was read)", e.ID)
		}
	}
}

// tickLog records which replica ticked a loop, and when.
type tickLog struct {
	mu    sync.Mutex
	ticks []tick
}

type tick struct {
	replica string
	at      time.Time
}

func (l *tickLog) add(r string) {
	l.mu.Lock()
	l.ticks = append(l.ticks, tick{r, time.Now()})
	l.mu.Unlock()
}

func (l *tickLog) since(at time.Time) []tick {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []tick
	for _, tk := range l.ticks {
		if !tk.at.Before(at) {
			out = append(out, tk)
		}
	}
	return out
}

func (l *tickLog) first(replica string, after time.Time) (time.Time, bool) {
	for _, tk := range l.since(after) {
		if tk.replica == replica {
			return tk.at, true
		}
	}
	return time.Time{}, false
}

func (l *tickLog) last(replica string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	var at time.Time
	for _, tk := range l.ticks {
		if tk.replica == replica {
			at = tk.at
		}
	}
	return at
}

// One replica runs each loop; when the leader dies or loses its lock
// connection, the other takes over within two loop intervals, and the old
// leader stops ticking.
func TestReplicasElectorTakeover(t *testing.T) {
	const every = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		kill func(t *testing.T, leader *postgres.Store, admin *pgx.Conn)
		// rejoins: the old leader is still alive and campaigns again.
		rejoins bool
	}{
		{"leader store closed", func(t *testing.T, leader *postgres.Store, _ *pgx.Conn) { leader.Close() }, false},
		{"leader lock session terminated", func(t *testing.T, _ *postgres.Store, admin *pgx.Conn) {
			var n int
			if err := admin.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
				WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()`).Scan(&n); err != nil || n != 1 {
				t.Fatalf("terminated %d lock sessions (%v), want 1", n, err)
			}
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := pg.DSN(t)
			ctx := ctxT(t, 60*time.Second)
			admin, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(context.Background())
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			stores := map[string]*postgres.Store{"A": open(t, dsn, fastOpts), "B": open(t, dsn, fastOpts)}
			var ticks tickLog
			aLeads := make(chan struct{})
			var aOnce sync.Once
			run := func(name string) {
				rctx, cancel := context.WithCancel(ctx)
				done := make(chan struct{})
				go func() {
					defer close(done)
					loops.Run(rctx, stores[name].Elector(), log, loops.Loop{Name: "reaper", Every: every, Tick: func(context.Context) error {
						ticks.add(name)
						if name == "A" {
							aOnce.Do(func() { close(aLeads) })
						}
						return nil
					}})
				}()
				t.Cleanup(func() { cancel(); <-done })
			}
			run("A")
			select { // A campaigns alone and leads: its first tick says so
			case <-aLeads:
			case <-ctx.Done():
				t.Fatal("A never led the loop")
			}
			run("B")

			// Steady state: only A ticks.
			time.Sleep(3 * every) // real time for the leader's ticker against a real PostgreSQL
			for _, tk := range ticks.since(time.Time{}) {
				if tk.replica != "A" {
					t.Fatalf("replica %s ticked while A led", tk.replica)
				}
			}
			killed := time.Now()
			tc.kill(t, stores["A"], admin)
			deadline := time.Now().Add(2*every + time.Second)
			for {
				if at, ok := ticks.first("B", killed); ok {
					if took := at.Sub(killed); took > 2*every {
						t.Fatalf("B took over after %s, want within two intervals (%s)", took, 2*every)
					} else {
						t.Logf("B took over %s after the kill", took.Round(time.Millisecond))
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("B never took over")
				}
				time.Sleep(10 * time.Millisecond) // polls leadership through a real PostgreSQL
			}
			// A steps down (its lock ping fails) and, if alive, waits as the
			// standby: no A tick after B started, beyond the ping interval.
			time.Sleep(3 * every) // real time for the lock ping against a real PostgreSQL
			bFirst, _ := ticks.first("B", killed)
			if lastA := ticks.last("A"); lastA.After(bFirst.Add(fastOpts.LockPing + 50*time.Millisecond)) {
				t.Fatalf("A ticked at %s, after B took over at %s", lastA.Format(time.StampMilli), bFirst.Format(time.StampMilli))
			}
		})
	}
}

// Losing the lock's connection mid-tick ends the lead context, so the tick
// in progress stops instead of racing the next leader.
func TestLeadEndsWhenTheLockConnectionDies(t *testing.T) {
	dsn := pg.DSN(t)
	ctx := ctxT(t, 30*time.Second)
	s := open(t, dsn, fastOpts)
	lead, release, err := s.Elector().Campaign(ctx, "tick")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lead.Done():
	case <-time.After(10 * fastOpts.LockPing):
		t.Fatal("the lead context outlived its lock connection")
	}
	// The lock is free for the next campaign, here or on another replica.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, release2, err := s.Elector().Campaign(cctx, "tick")
	if err != nil {
		t.Fatalf("campaign after losing the lock: %v", err)
	}
	release2()
}
