package agent

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// console prints one line per event, prefixed with a UTC timestamp, the way
// an operator reads a serial console:
//
//	2026-11-30T05:40:01Z tether-agent: enrolled as instance i-1 (...)
type console struct {
	mu  sync.Mutex
	w   io.Writer
	now func() time.Time
}

func (c *console) Printf(format string, args ...any) {
	msg := strings.TrimRight(fmt.Sprintf(format, args...), "\n")
	c.mu.Lock()
	defer c.mu.Unlock()
	// Milliseconds: a whole boot takes a few seconds, and a phase that
	// costs half of one must show.
	fmt.Fprintf(c.w, "%s tether-agent: %s\n", c.now().UTC().Format("2006-01-02T15:04:05.000Z07:00"), msg)
}
