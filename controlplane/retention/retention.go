// Package retention is the record-retention policy (docs/design.md §0.6:
// nothing grows without bound): old events, finished tasks, expired tokens
// and certificates, and the audit trail are pruned on a tick, in batches.
package retention

import (
	"context"
	"log/slog"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// Policy is how long each kind of record is kept. Events keep their own,
// configurable windows; the rest is history nothing reads.
type Policy struct {
	// EventsLow and EventsHigh are the windows of low/medium and of
	// high/critical events. The audit trail is kept as long as EventsHigh.
	EventsLow, EventsHigh time.Duration
	// Tasks is how long a finished task's result stays readable.
	Tasks time.Duration
	// Tokens and Certificates count from expiry: a spent token is refused
	// anyway once expired, and revocation checks need only unexpired
	// certificates.
	Tokens, Certificates time.Duration
}

// Defaults of the Policy; the event windows are tetherd flags.
const (
	DefaultEventsLow    = 90 * 24 * time.Hour
	DefaultEventsHigh   = 365 * 24 * time.Hour
	DefaultTasks        = 30 * 24 * time.Hour
	DefaultTokens       = 7 * 24 * time.Hour
	DefaultCertificates = 30 * 24 * time.Hour
)

// withDefaults fills the zero fields of p.
func (p Policy) withDefaults() Policy {
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	set(&p.EventsLow, DefaultEventsLow)
	set(&p.EventsHigh, DefaultEventsHigh)
	set(&p.Tasks, DefaultTasks)
	set(&p.Tokens, DefaultTokens)
	set(&p.Certificates, DefaultCertificates)
	return p
}

// Batch bounds one retention transaction. A single DELETE of 500,000
// events (a 100,000-agent enrollment's worth) held SQLite's writer for
// 19 s, and every other write failed with SQLITE_BUSY after its 10 s
// wait. In batches of 1,000 the longest a write beside a 200,000-event
// prune waited was 0.15 s, against 2.3 s in one transaction, measured in
// one run of BenchmarkRetentionBesideWrites.
const Batch = 1000

// Pruner prunes the store by its Policy.
type Pruner struct {
	store  store.Store
	clock  clock.Clock
	log    *slog.Logger
	policy Policy
	batch  int
}

// New returns a Pruner; zero fields of policy take the defaults. batch is
// the rows of each kind per transaction: Batch in production; <= 0 prunes
// in one transaction, which only the benchmark compares against.
func New(st store.Store, clk clock.Clock, log *slog.Logger, policy Policy, batch int) *Pruner {
	return &Pruner{store: st, clock: clk, log: log, policy: policy.withDefaults(), batch: batch}
}

// Tick is one retention pass. Each batch is its own transaction, so that
// on SQLite it joins the group commit like any other write.
func (p *Pruner) Tick(ctx context.Context) error {
	now, pol := p.clock.Now(), p.policy
	events, err := p.drain(ctx, func(q store.Queries) ([]int64, error) {
		n, err := q.PruneEvents(ctx, now.Add(-pol.EventsLow), now.Add(-pol.EventsHigh), p.batch)
		return []int64{n}, err
	})
	if err != nil {
		return err
	}
	recs, err := p.drain(ctx, func(q store.Queries) ([]int64, error) {
		r, err := q.PruneRecords(ctx, now.Add(-pol.Tasks), now.Add(-pol.Tokens), now.Add(-pol.Certificates), p.batch)
		return []int64{r.Tasks, r.Tokens, r.Certificates}, err
	})
	if err != nil {
		return err
	}
	audits, err := p.drain(ctx, func(q store.Queries) ([]int64, error) {
		n, err := q.DeleteAuditBefore(ctx, now.Add(-pol.EventsHigh), p.batch)
		return []int64{int64(n)}, err
	})
	if err != nil {
		return err
	}
	if audits[0] > 0 {
		p.log.Info("pruned audit records", "count", audits[0])
	}
	if events[0]+recs[0]+recs[1]+recs[2] > 0 {
		p.log.Info("pruned records past retention", "events", events[0], "tasks", recs[0], "tokens", recs[1], "certificates", recs[2])
	}
	return nil
}

// drain runs step, one transaction a batch, until no count it returns is
// a full batch, and sums the counts of the batches that committed.
func (p *Pruner) drain(ctx context.Context, step func(store.Queries) ([]int64, error)) ([]int64, error) {
	var total []int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		var counts []int64
		if err := p.store.Tx(ctx, func(q store.Queries) error {
			var err error
			counts, err = step(q)
			return err
		}); err != nil {
			return total, err
		}
		if total == nil {
			total = make([]int64, len(counts))
		}
		more := false
		for i, n := range counts {
			total[i] += n
			more = more || (p.batch > 0 && n == int64(p.batch))
		}
		if !more {
			return total, nil
		}
	}
}
