// Package keyed is a mutex per key, for providers that serialise the
// operations on one machine: an operation is several calls (to QMP, to
// libvirtd), and a stop racing a start on the same machine would leave its
// state to chance.
package keyed

import (
	"context"
	"sync"
)

// Mutex serialises work per key. Waiting honours ctx, and entries are
// dropped when unused so the map does not grow with every key ever seen.
type Mutex struct {
	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	ch   chan struct{} // holds one token while locked
	refs int
}

// New returns an unlocked Mutex.
func New() *Mutex { return &Mutex{entries: map[string]*entry{}} }

// Lock waits for key and returns its unlock, which may be called more than
// once; it fails only when ctx ends first.
func (k *Mutex) Lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	e, ok := k.entries[key]
	if !ok {
		e = &entry{ch: make(chan struct{}, 1)}
		k.entries[key] = e
	}
	e.refs++
	k.mu.Unlock()

	select {
	case e.ch <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-e.ch; k.release(key, e) }) }, nil
	case <-ctx.Done():
		k.release(key, e)
		return nil, ctx.Err()
	}
}

func (k *Mutex) release(key string, e *entry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e.refs--
	if e.refs == 0 {
		delete(k.entries, key)
	}
}

// Len is the number of keys held or waited for.
func (k *Mutex) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.entries)
}
