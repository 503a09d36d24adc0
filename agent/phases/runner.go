package phases

import (
	"context"
	"sync"
)

// Runner owns the background loops a boot starts (the session, renewal,
// the watchdog, the power button) and their shutdown: Stop ends them all,
// waits for them, then runs the clean-ups registered with OnStop. The
// phases reach it through their state.
type Runner struct {
	// ctx is the boot's: it ends with the caller's context or at Stop.
	ctx    context.Context
	cancel context.CancelFunc
	// last ends only at Stop, for a loop that must outlive the caller's
	// context to finish its work (a session's goodbye).
	last       context.Context
	cancelLast context.CancelFunc
	report     func(ctx context.Context, name string, err error)

	wg      sync.WaitGroup
	mu      sync.Mutex
	stopped bool
	onStop  []func()
}

// NewRunner returns a runner under ctx. report, if set, is told of every
// loop that returns an error, with the boot's context: a loop that ended
// because the boot did finds it done, and one that failed finds it live.
func NewRunner(ctx context.Context, report func(ctx context.Context, name string, err error)) *Runner {
	r := &Runner{report: report}
	r.ctx, r.cancel = context.WithCancel(ctx)
	r.last, r.cancelLast = context.WithCancel(context.WithoutCancel(ctx))
	return r
}

// Context is the boot's context, for the phases: it ends with the caller's
// or at Stop.
func (r *Runner) Context() context.Context { return r.ctx }

// Go runs fn in the background under the boot's context.
func (r *Runner) Go(name string, fn func(ctx context.Context) error) {
	r.start(r.ctx, name, fn)
}

// GoUntilStop runs fn in the background under a context that ends only at
// Stop, not with the caller's: the loop stays up for a last word after the
// boot was told to stop, and whoever says it closes the loop.
func (r *Runner) GoUntilStop(name string, fn func(ctx context.Context) error) {
	r.start(r.last, name, fn)
}

func (r *Runner) start(ctx context.Context, name string, fn func(context.Context) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		// Nothing would stop or wait for it.
		return
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := fn(ctx); err != nil && r.report != nil {
			r.report(r.ctx, name, err)
		}
	}()
}

// OnStop registers fn to run at Stop once every loop has ended (closing
// the connection the loops use, say); the last registered runs first.
// Registered after Stop, fn runs at once.
func (r *Runner) OnStop(fn func()) {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		fn()
		return
	}
	r.onStop = append(r.onStop, fn)
	r.mu.Unlock()
}

// Stop ends every loop, waits for them and runs the OnStop functions. It
// is safe to call more than once.
func (r *Runner) Stop() {
	r.mu.Lock()
	already := r.stopped
	r.stopped = true
	onStop := r.onStop
	r.onStop = nil
	r.mu.Unlock()
	if already {
		return
	}
	r.cancel()
	r.cancelLast()
	r.wg.Wait()
	for i := len(onStop) - 1; i >= 0; i-- {
		onStop[i]()
	}
}
