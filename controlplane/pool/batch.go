package pool

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// MaxClaimBatch bounds how many waiting claims share one transaction.
const MaxClaimBatch = 64

// lanes is how many claim transactions of one pool selection may run at
// once. On PostgreSQL two let one batch claim its rows while the previous
// one commits; SQLite has one writer, so a second lane would only split
// the queue into smaller batches, each paying its own fsync.
func (s *Service) lanes() int {
	switch {
	case s.ClaimLanes > 0:
		return s.ClaimLanes
	case s.Store.Backend() == "sqlite":
		return 1
	}
	return 2
}

// claimTimeout bounds a claim transaction run on behalf of several callers.
const claimTimeout = 30 * time.Second

// claimReq is one caller's claim: of the pool named by id or name, else
// of any active pool, narrowed by class.
type claimReq struct {
	poolID                  store.PoolID
	poolName, class         string
	acquiredBy, acquiredFor string

	done   chan struct{}
	claim  *Claim
	pool   *store.Pool // the named pool as the claim's transaction read it
	err    error
	queued bool // still waiting to be taken into a batch (under batcher.mu)
}

// batcher is group commit for claims. Claimers of one pool selection that
// arrive while a claim transaction is running wait, and the next
// transaction claims for all of them: one commit (one fsync, one hold of
// the event-ordering lock on PostgreSQL) instead of one each. A lone
// claimer runs at once, so batching adds no latency when there is no
// queue. Every claim in a batch still writes its own pool.claimed event in
// the transaction that claims its member; if that transaction fails, each
// claim is retried in a transaction of its own, so one claim's failure is
// never another's.
type batcher struct {
	s       *Service
	mu      sync.Mutex
	queues  map[string][]*claimReq
	running map[string]int
}

func (s *Service) claims() *batcher {
	s.batchOnce.Do(func() {
		s.batch = &batcher{s: s, queues: map[string][]*claimReq{}, running: map[string]int{}}
	})
	return s.batch
}

// key is what the claims of one batch share: the pool as named and the
// class, so that a refusal for either is every claim's answer.
func (r *claimReq) key() string {
	switch {
	case r.poolID != "":
		return "id:" + r.poolID.String() + "/" + r.class
	case r.poolName != "":
		return "name:" + r.poolName + "/" + r.class
	}
	return "class:" + r.class
}

// claim queues r and either runs the batches for its key or waits for the
// goroutine that does.
func (b *batcher) claim(ctx context.Context, r *claimReq) (*Claim, *store.Pool, error) {
	r.done, r.queued = make(chan struct{}), true
	k := r.key()
	b.mu.Lock()
	b.queues[k] = append(b.queues[k], r)
	lead := b.running[k] < b.s.lanes()
	if lead {
		b.running[k]++
	}
	b.mu.Unlock()
	if lead {
		b.run(k, r)
	}
	select {
	case <-r.done:
		return r.claim, r.pool, r.err
	case <-ctx.Done():
	}
	// A caller that leaves before its claim was taken is dropped; once
	// taken, the claim may commit, so it waits for the answer rather than
	// leave a member claimed by nobody who knows.
	b.mu.Lock()
	if r.queued {
		q := b.queues[k]
		for i, x := range q {
			if x == r {
				b.queues[k] = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		r.queued = false
		b.mu.Unlock()
		return nil, nil, ctx.Err()
	}
	b.mu.Unlock()
	<-r.done
	return r.claim, r.pool, r.err
}

// run claims for what is queued under k, a batch at a time. Once mine
// (the leading caller's own claim) is answered, the leader hands the rest
// to a goroutine of its own, so no caller waits on other callers' claims.
func (b *batcher) run(k string, mine *claimReq) {
	for {
		b.mu.Lock()
		batch := b.queues[k]
		if len(batch) == 0 {
			b.leave(k)
			b.mu.Unlock()
			return
		}
		if limit := b.s.maxBatch(); len(batch) > limit {
			batch = batch[:limit]
		}
		b.queues[k] = b.queues[k][len(batch):]
		for _, r := range batch {
			r.queued = false
		}
		b.mu.Unlock()
		b.s.claimBatch(batch)
		answered := false
		for _, r := range batch {
			answered = answered || r == mine
			close(r.done)
		}
		if answered {
			b.mu.Lock()
			if len(b.queues[k]) == 0 {
				b.leave(k)
				b.mu.Unlock()
				return
			}
			b.mu.Unlock()
			go b.run(k, nil)
			return
		}
	}
}

func (s *Service) maxBatch() int {
	if s.ClaimBatch > 0 {
		return s.ClaimBatch
	}
	return MaxClaimBatch
}

// leave gives up a lane of k (under b.mu).
func (b *batcher) leave(k string) {
	if b.running[k]--; b.running[k] <= 0 {
		delete(b.running, k)
		if len(b.queues[k]) == 0 {
			delete(b.queues, k)
		}
	}
}

// claimBatch claims for every request in one transaction. The context is
// not any one caller's: a caller that leaves does not fail the others.
// The claims that found no ready member share one exhausted answer.
func (s *Service) claimBatch(batch []*claimReq) {
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	s.claimAll(ctx, batch)
	var none *exhausted
	for _, r := range batch {
		if errors.Is(r.err, errNoReady) {
			if none == nil {
				none = &exhausted{s: s, named: r.pool, class: r.class}
			}
			r.err = none
		}
	}
}

// claimAll answers every request of the batch: a claim, or an error.
func (s *Service) claimAll(ctx context.Context, batch []*claimReq) {
	now := s.Clock.Now()
	var named *store.Pool
	var out []*Claim
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		var err error
		named, out, err = s.claimTx(ctx, q, batch, now)
		return err
	})
	var refused refusal
	switch {
	case err == nil:
		for i, r := range batch {
			if r.pool, r.claim = named, out[i]; r.claim == nil {
				r.err = errNoReady
			}
		}
		return
	case errors.As(err, &refused):
		for _, r := range batch {
			r.err = refused.err
		}
		return
	case errors.Is(err, errNoReady) || len(batch) == 1:
		for _, r := range batch {
			r.pool, r.err = named, err
		}
		return
	}
	for _, r := range batch {
		var c []*Claim
		r.err = s.Store.Tx(ctx, func(q store.Queries) error {
			var err error
			r.pool, c, err = s.claimTx(ctx, q, []*claimReq{r}, now)
			return err
		})
		if errors.As(r.err, &refused) {
			r.err = refused.err
		}
		if r.err == nil {
			r.claim = c[0]
		}
	}
}
