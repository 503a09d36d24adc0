package store

import (
	"context"
	"sync"
)

// LocalElector grants leadership within one process: enough when one
// process owns the database (SQLite), and a stand-in for tests.
type LocalElector struct {
	mu      sync.Mutex
	holders map[string]chan struct{}
}

// NewLocalElector returns an elector with no leaders.
func NewLocalElector() *LocalElector { return &LocalElector{holders: map[string]chan struct{}{}} }

// Campaign implements Elector.
func (e *LocalElector) Campaign(ctx context.Context, name string) (context.Context, func(), error) {
	for {
		e.mu.Lock()
		held, busy := e.holders[name]
		if !busy {
			done := make(chan struct{})
			e.holders[name] = done
			e.mu.Unlock()
			lead, cancel := context.WithCancel(ctx)
			var once sync.Once
			return lead, func() {
				once.Do(func() {
					cancel()
					e.mu.Lock()
					delete(e.holders, name)
					e.mu.Unlock()
					close(done)
				})
			}, nil
		}
		e.mu.Unlock()
		select {
		case <-held:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}
