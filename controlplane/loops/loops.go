// Package loops runs the control plane's periodic work (lease expiry,
// liveness, provider sync, the pool reaper, event retention) on exactly
// one replica at a time.
package loops

import (
	"context"
	"log/slog"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// Loop is one periodic job.
type Loop struct {
	Name  string
	Every time.Duration
	// Tick does one round. Its context ends when leadership is lost, so a
	// tick that outlives its lease stops rather than racing the new leader.
	Tick func(ctx context.Context) error
}

// Run campaigns for each loop and ticks it while leading, until ctx ends.
func Run(ctx context.Context, el store.Elector, log *slog.Logger, ls ...Loop) {
	done := make(chan struct{})
	for _, l := range ls {
		go func(l Loop) {
			defer func() { done <- struct{}{} }()
			runOne(ctx, el, log, l)
		}(l)
	}
	for range ls {
		<-done
	}
}

func runOne(ctx context.Context, el store.Elector, log *slog.Logger, l Loop) {
	for ctx.Err() == nil {
		lead, release, err := el.Campaign(ctx, l.Name)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("loop campaign failed; retrying", "loop", l.Name, "err", err)
			sleep(ctx, l.Every)
			continue
		}
		log.Debug("leading loop", "loop", l.Name)
		lead1(lead, log, l)
		release()
		if ctx.Err() == nil {
			log.Info("lost leadership of loop", "loop", l.Name)
		}
	}
}

// The cadence is the wall clock's on purpose: it is mechanism (how often
// to look), while each Tick reads the time it judges by from the injected
// clock. Tests that move a fake clock rely on the loops looking again on
// their next real tick; a fake-clock ticker here would make them advance
// the clock once per loop per round, in lockstep.
func lead1(lead context.Context, log *slog.Logger, l Loop) {
	t := time.NewTicker(l.Every)
	defer t.Stop()
	for {
		if err := l.Tick(lead); err != nil && lead.Err() == nil {
			log.Warn("loop tick failed", "loop", l.Name, "err", err)
		}
		select {
		case <-lead.Done():
			return
		case <-t.C:
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
