package libvirt

import (
	"context"
	"sync"
)

// keyedMutex serialises operations per instance within this process: an
// operation is several libvirt calls (look up, define, create), and a stop
// racing a start on the same domain would leave its state to chance.
// Waiting honours ctx, and entries are dropped when unused so the map does
// not grow with every instance ever seen.
type keyedMutex struct {
	mu      sync.Mutex
	entries map[string]*keyedEntry
}

type keyedEntry struct {
	ch   chan struct{} // holds one token while locked
	refs int
}

func newKeyedMutex() *keyedMutex {
	return &keyedMutex{entries: map[string]*keyedEntry{}}
}

func (k *keyedMutex) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	e, ok := k.entries[key]
	if !ok {
		e = &keyedEntry{ch: make(chan struct{}, 1)}
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

func (k *keyedMutex) release(key string, e *keyedEntry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e.refs--
	if e.refs == 0 {
		delete(k.entries, key)
	}
}
