package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
)

// TestGroupCommitIsolatesFailures: many concurrent transactions share
// commits; each one that fails (with an error or a panic) after writing is
// rolled back alone, and only the others' writes and notifications remain.
func TestGroupCommitIsolatesFailures(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	notes, stop := s.Subscribe(store.ChannelTasks)
	defer stop()

	const n = 200
	boom := errors.New("boom")
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = s.Tx(ctx, func(q store.Queries) error {
				if err := q.CreateToken(ctx, &store.Token{Hash: fmt.Sprint("h", i), InstanceID: "i", ExpiresAt: time.Now().Add(time.Hour), CreatedAt: time.Now()}); err != nil {
					return err
				}
				if err := q.Notify(ctx, store.ChannelTasks, fmt.Sprint(i)); err != nil {
					return err
				}
				switch i % 3 {
				case 1:
					return boom
				case 2:
					panic("kaboom")
				}
				return nil
			})
		}(i)
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		_, getErr := s.GetToken(ctx, fmt.Sprint("h", i))
		switch i % 3 {
		case 0:
			if errs[i] != nil || getErr != nil {
				t.Fatalf("tx %d should have committed: %v / %v", i, errs[i], getErr)
			}
		case 1:
			if !errors.Is(errs[i], boom) || !errors.Is(getErr, store.ErrNotFound) {
				t.Fatalf("tx %d failed but its write was kept (or wrong error): %v / %v", i, errs[i], getErr)
			}
		case 2:
			if errs[i] == nil || !errors.Is(getErr, store.ErrNotFound) {
				t.Fatalf("tx %d panicked but its write was kept (or no error): %v / %v", i, errs[i], getErr)
			}
		}
	}
	got := 0
	for {
		select {
		case <-notes:
			got++
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
	if want := (n + 2) / 3; got != want {
		t.Fatalf("%d notifications, want %d (only committed transactions notify)", got, want)
	}
}

// TestGroupCommitCancelledBeforeItsTurn: a caller whose context ended
// while queued gets its error and none of its work is done.
func TestGroupCommitCancelledBeforeItsTurn(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	err = s.Tx(cancelled, func(q store.Queries) error {
		return q.CreateToken(ctx, &store.Token{Hash: "x", InstanceID: "i", ExpiresAt: time.Now(), CreatedAt: time.Now()})
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if _, err := s.GetToken(ctx, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a cancelled transaction wrote: %v", err)
	}
}

// TestPresenceWritesJoinTheQueue: a presence write waits for the
// committer in the queue, not in SQLite's busy handler, which gives up
// after its timeout while the committer holds the write lock batch after
// batch (a connect storm).
func TestPresenceWritesJoinTheQueue(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	queued := make(chan struct{}, 8)
	s.OnQueued(func() { queued <- struct{}{} })
	release, blocking := make(chan struct{}), make(chan error, 1)
	go func() {
		blocking <- s.Tx(ctx, func(store.Queries) error { <-release; return nil })
	}()
	<-queued // the committer is busy with the blocker
	now := time.Now()
	writes := []struct {
		name string
		do   func() error
	}{
		{"open", func() error {
			return s.OpenPresence(ctx, &store.Presence{InstanceID: "i-1", Replica: "r", StreamID: "s-1", ConnectedAt: now, LeaseUntil: now.Add(time.Minute)})
		}},
		{"renew", func() error { _, err := s.RenewPresence(ctx, "r", now.Add(2*time.Minute)); return err }},
		{"close", func() error { _, err := s.ClosePresence(ctx, "i-1", "s-1", now); return err }},
		{"expire", func() error { _, err := s.ExpirePresence(ctx, "r", now); return err }},
	}
	done := make(chan error, len(writes))
	for _, w := range writes {
		go func() {
			if err := w.do(); err != nil {
				done <- fmt.Errorf("%s: %w", w.name, err)
				return
			}
			done <- nil
		}()
		select {
		case <-queued:
		case <-time.After(5 * time.Second):
			t.Fatalf("presence %s did not join the group commit queue", w.name)
		}
	}
	close(release)
	if err := <-blocking; err != nil {
		t.Fatal(err)
	}
	for range writes {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
