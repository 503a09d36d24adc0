package provsync

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
)

// SourceStreamLost names the death signal of a stream that ended other
// than by a newer one replacing it.
const SourceStreamLost = "stream_lost"

// Check asks the provider at once for one instance's machine, on a death
// signal (source names it: "qemu_exit", "stream_lost"), and errors a
// row whose machine should be on (machineOn) and that the provider
// observes stopped or gone. A
// machine the provider reports running leaves the row as it is: its agent
// may be partitioned, which the fleet view shows as disconnected. It
// reports whether the row moved.
func (s *Syncer) Check(ctx context.Context, instanceID store.InstanceID, source string) (bool, error) {
	in, err := s.Store.GetInstance(ctx, instanceID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check %s: %w", instanceID, err)
	}
	if !machineOn(in.Status) {
		return false, nil
	}
	p, err := s.Instances.Provider(in.Provider)
	if err != nil {
		return false, fmt.Errorf("check %s: %w", instanceID, err)
	}
	moved, err := s.confirmDead(ctx, p, in, source, nil)
	if err != nil {
		return false, fmt.Errorf("check %s: %w", instanceID, err)
	}
	return moved, nil
}

// machineOn reports whether a row in state st has a machine that should
// be running: a running instance, and one booting after a provision,
// start or reboot. A machine that exits in any of them died; in the
// others (stopping, stopped, error, terminated) it may be off on
// purpose.
func machineOn(st lifecycle.State) bool {
	switch st {
	case lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting, lifecycle.Running:
		return true
	}
	return false
}

// Checks runs Check for death signals as they arrive, a few at a time,
// each instance once however often it is signalled while queued. Signals
// come from provider goroutines and stream handlers, which must not wait
// on the store or a provider: Signal never blocks.
type Checks struct {
	Syncer *Syncer
	// Workers bounds concurrent checks (default 4): a reconnect storm
	// signals thousands of dropped streams at once.
	Workers int
	// Done, if set, is told each finished check (tests wait on it).
	Done func(instanceID store.InstanceID, moved bool, err error)

	mu      sync.Mutex
	queued  map[store.InstanceID]string // instance -> source
	order   []store.InstanceID
	wake    chan struct{}
	started bool
}

func (c *Checks) init() {
	if c.queued == nil {
		c.queued = map[store.InstanceID]string{}
		c.wake = make(chan struct{}, 1)
	}
}

// Signal queues a check of instanceID.
func (c *Checks) Signal(instanceID store.InstanceID, source string) {
	if c == nil || instanceID == "" {
		return
	}
	c.mu.Lock()
	c.init()
	if _, ok := c.queued[instanceID]; !ok {
		c.queued[instanceID] = source
		c.order = append(c.order, instanceID)
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Exit is the providers.ExitWatcher hook: the exited machine's instance
// is checked at once.
func (c *Checks) Exit(e providers.Exit) {
	if e.InstanceID == "" {
		return // provider sync finds it on its next pass
	}
	c.Signal(store.InstanceID(e.InstanceID), "provider_exit: "+e.Detail)
}

func (c *Checks) next() (store.InstanceID, string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.order) == 0 {
		return "", "", false
	}
	id := c.order[0]
	c.order = c.order[1:]
	src := c.queued[id]
	delete(c.queued, id)
	return id, src, true
}

// Run works the queue until ctx ends.
func (c *Checks) Run(ctx context.Context) {
	c.mu.Lock()
	c.init()
	c.mu.Unlock()
	n := c.Workers
	if n <= 0 {
		n = 4
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				for {
					key, src, ok := c.next()
					if !ok {
						break
					}
					c.run(ctx, key, src)
				}
				select {
				case <-ctx.Done():
					return
				case <-c.wake:
					// Pass the wake on: another worker may take the rest.
					select {
					case c.wake <- struct{}{}:
					default:
					}
				}
			}
		}()
	}
	wg.Wait()
}

func (c *Checks) run(ctx context.Context, id store.InstanceID, source string) {
	moved, err := c.Syncer.Check(ctx, id, source)
	if err != nil && ctx.Err() == nil {
		c.Syncer.Log.Warn("death signal: check failed; provider sync retries", "instance", id, "source", source, "err", err)
	}
	if c.Done != nil {
		c.Done(id, moved, err)
	}
}
