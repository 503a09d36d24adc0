package agent

import (
	"fmt"
	"sync"

	"github.com/tetherfleet/tether/agent/modules"
)

// progressPrinter turns per-chunk progress into a few console lines per
// module: the start, every quarter, and the verified end. A serial console
// at 115200 baud must not be flooded with a line per chunk.
type progressPrinter struct {
	con *console

	mu      sync.Mutex
	printed map[string]int // digest → last quarter printed
}

func newProgressPrinter(con *console) *progressPrinter {
	return &progressPrinter{con: con, printed: map[string]int{}}
}

func (p *progressPrinter) report(pr modules.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pr.Cached {
		p.con.Printf("verified %s %s (%s, from the cache, hashed again)", pr.Module, pr.Digest, size(pr.Total))
		return
	}
	last, seen := p.printed[pr.Digest]
	if !seen {
		p.con.Printf("pulling %s %s (%s)", pr.Module, pr.Digest, size(pr.Total))
		p.printed[pr.Digest] = 0
	}
	if pr.Total <= 0 {
		return
	}
	q := int(4 * pr.Done / pr.Total)
	if q <= last {
		return
	}
	p.printed[pr.Digest] = q
	if q >= 4 {
		resumed := ""
		if pr.Resumed > 0 {
			resumed = fmt.Sprintf(", resumed %d times", pr.Resumed)
		}
		p.con.Printf("pulled %s (%s%s); verifying its digest", pr.Module, size(pr.Total), resumed)
		return
	}
	p.con.Printf("pulling %s: %d%% (%s of %s)", pr.Module, 25*q, size(pr.Done), size(pr.Total))
}

func size(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}
