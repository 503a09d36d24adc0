// Package logbuf is a log sink that goroutines write while a test reads
// it: a control plane's slog handler, a provider's reaper, an agent's
// console. Tests of concurrent code need one, and each had grown its own
// copy of the same mutex around a bytes.Buffer.
package logbuf

import (
	"bytes"
	"sync"
	"time"
)

// Buffer is safe for concurrent use. Its zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// changed is closed and replaced by every write, so that Await waits
	// for the text it wants without polling.
	changed chan struct{}
}

// Write implements io.Writer.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Await blocks until ok holds for what was written, or d passes, and
// reports whether ok held.
func (l *Buffer) Await(d time.Duration, ok func(string) bool) bool {
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	for {
		l.mu.Lock()
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		text, changed := l.b.String(), l.changed
		l.mu.Unlock()
		if ok(text) {
			return true
		}
		select {
		case <-changed:
		case <-timeout.C:
			return false
		}
	}
}
