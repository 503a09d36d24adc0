package phases

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
)

type reports struct {
	mu  sync.Mutex
	got []string
	// live records whether the boot's context was live at each report.
	live []bool
}

func (r *reports) report(ctx context.Context, name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, name+": "+err.Error())
	r.live = append(r.live, ctx.Err() == nil)
}

func (r *reports) list() ([]string, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got), slices.Clone(r.live)
}

// Stop ends every loop, of both kinds, and returns only once they have.
func TestRunnerStopEndsAndWaitsForLoops(t *testing.T) {
	r := NewRunner(context.Background(), nil)
	var mu sync.Mutex
	var ended []string
	started := make(chan struct{}, 2)
	loop := func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			started <- struct{}{}
			<-ctx.Done()
			mu.Lock()
			ended = append(ended, name)
			mu.Unlock()
			return ctx.Err()
		}
	}
	r.Go("maintenance", loop("maintenance"))
	r.GoUntilStop("session", loop("session"))
	<-started
	<-started
	r.Stop()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(ended)
	if !slices.Equal(ended, []string{"maintenance", "session"}) {
		t.Fatalf("ended before Stop returned: %v", ended)
	}
	if r.Context().Err() == nil {
		t.Fatal("the boot's context is live after Stop")
	}
}

// The caller's context ending ends the loops under the boot's context, but
// not one started with GoUntilStop: that one waits for its last word.
func TestRunnerCallerEndVersusUntilStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	rep := &reports{}
	r := NewRunner(ctx, rep.report)
	defer r.Stop()
	maintEnded := make(chan struct{})
	sessionCtx := make(chan context.Context, 1)
	r.Go("maintenance", func(ctx context.Context) error {
		<-ctx.Done()
		close(maintEnded)
		return ctx.Err()
	})
	r.GoUntilStop("session", func(ctx context.Context) error {
		sessionCtx <- ctx
		<-ctx.Done()
		return errors.New("stream closed")
	})
	sctx := <-sessionCtx
	cancel()
	<-maintEnded
	if sctx.Err() != nil {
		t.Fatal("the session's context ended with the caller's; it must last until Stop")
	}
	if r.Context().Err() == nil {
		t.Fatal("the boot's context outlived the caller's")
	}
	r.Stop()
	if sctx.Err() == nil {
		t.Fatal("the session's context is live after Stop")
	}
	got, live := rep.list()
	// Both errors are handed over, each with the boot's context already
	// done: the loops ended because the boot did.
	slices.Sort(got)
	if !slices.Equal(got, []string{"maintenance: context canceled", "session: stream closed"}) || slices.Contains(live, true) {
		t.Fatalf("reports %v (live %v)", got, live)
	}
}

// A loop that fails while the boot runs is reported with a live context,
// by its name; one that ends cleanly is not reported.
func TestRunnerReportsAFailedLoop(t *testing.T) {
	rep := &reports{}
	r := NewRunner(context.Background(), rep.report)
	done := make(chan struct{}, 2)
	r.Go("certificate maintenance", func(context.Context) error {
		defer func() { done <- struct{}{} }()
		return errors.New("not enrolled")
	})
	r.Go("the watchdog", func(context.Context) error {
		defer func() { done <- struct{}{} }()
		return nil
	})
	<-done
	<-done
	r.Stop() // waits for the report, which runs in the loop's goroutine
	got, live := rep.list()
	if !slices.Equal(got, []string{"certificate maintenance: not enrolled"}) || !slices.Equal(live, []bool{true}) {
		t.Fatalf("reports %v (live %v)", got, live)
	}
}

// The clean-ups run once the loops have ended, the last registered first,
// once; one registered after Stop runs at once, and a loop started after
// Stop does not run at all.
func TestRunnerOnStop(t *testing.T) {
	r := NewRunner(context.Background(), nil)
	var order []string
	loopEnded := false
	started := make(chan struct{})
	r.Go("session", func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		loopEnded = true
		return nil
	})
	<-started
	r.OnStop(func() {
		if !loopEnded {
			t.Error("a clean-up ran before the loops ended")
		}
		order = append(order, "close the connection")
	})
	r.OnStop(func() { order = append(order, "second") })
	r.Stop()
	r.Stop()
	if !slices.Equal(order, []string{"second", "close the connection"}) {
		t.Fatalf("clean-ups ran %v", order)
	}
	r.OnStop(func() { order = append(order, "late") })
	if order[len(order)-1] != "late" {
		t.Fatalf("a clean-up registered after Stop did not run at once: %v", order)
	}
	ran := false
	r.Go("late loop", func(context.Context) error { ran = true; return nil })
	r.wg.Wait()
	if ran {
		t.Fatal("a loop started after Stop ran")
	}
}
