package postgres

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// elector grants leadership with session-level advisory locks. Each held
// lock lives on a connection of its own, outside the pool: the lock is
// exactly as alive as that session, so a leader that dies, or whose
// connection is cut, loses the lock with it and a campaigning replica's
// next try succeeds.
type elector struct {
	cfg  *pgx.ConnConfig
	poll time.Duration
	ping time.Duration
	log  *slog.Logger

	mu     sync.Mutex
	closed bool
	held   map[*heldLock]struct{}
	// lostAt is when this replica last lost a loop's lock to a failed
	// connection.
	lostAt map[string]time.Time
	stop   chan struct{} // closed by close(): campaigns give up
}

func newElector(cfg *pgx.ConnConfig, o Options) *elector {
	return &elector{cfg: cfg.Copy(), poll: o.CampaignPoll, ping: o.LockPing, log: o.Log,
		held: map[*heldLock]struct{}{}, lostAt: map[string]time.Time{}, stop: make(chan struct{})}
}

type heldLock struct {
	name    string
	key     int64
	conn    *pgx.Conn
	cancel  context.CancelFunc
	quit    chan struct{} // tells the watcher to stop
	stopped chan struct{} // the watcher has stopped
	once    sync.Once
}

// Campaign implements store.Elector: it tries the loop's lock every poll
// interval until it gets it or ctx ends.
func (e *elector) Campaign(ctx context.Context, name string) (context.Context, func(), error) {
	key := lockKey("tether/loop/" + name)
	// A replica whose lock connection just failed is the least healthy
	// candidate, and racing the standbys for the lock it dropped would
	// make the hand-over a coin toss: it sits out two polls, so a standby
	// (polling all along) takes the loop.
	e.mu.Lock()
	backoff := 2*e.poll - time.Since(e.lostAt[name])
	e.mu.Unlock()
	if backoff > 0 {
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, ctx.Err()
		case <-e.stop:
			t.Stop()
			return nil, nil, errClosed
		case <-t.C:
		}
	}
	var conn *pgx.Conn
	dropConn := func() {
		if conn != nil {
			conn.Close(context.Background())
			conn = nil
		}
	}
	for {
		if e.isClosed() {
			dropConn()
			return nil, nil, errClosed
		}
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := pgx.ConnectConfig(cctx, e.cfg)
			cancel()
			if err == nil {
				conn = c
			} else if ctx.Err() == nil {
				e.log.Debug("campaign: cannot reach PostgreSQL; retrying", "loop", name, "err", err)
			}
		}
		if conn != nil {
			var got bool
			qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := conn.QueryRow(qctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&got)
			cancel()
			switch {
			case err != nil:
				dropConn()
			case got:
				return e.lead(ctx, name, key, conn)
			}
		}
		t := time.NewTimer(e.poll)
		select {
		case <-ctx.Done():
			t.Stop()
			dropConn()
			return nil, nil, ctx.Err()
		case <-e.stop:
			t.Stop()
			dropConn()
			return nil, nil, errClosed
		case <-t.C:
		}
	}
}

func (e *elector) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// lead registers a won lock and starts watching its connection.
func (e *elector) lead(ctx context.Context, name string, key int64, conn *pgx.Conn) (context.Context, func(), error) {
	lead, cancel := context.WithCancel(ctx)
	h := &heldLock{name: name, key: key, conn: conn, cancel: cancel, quit: make(chan struct{}), stopped: make(chan struct{})}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		cancel()
		conn.Close(context.Background())
		return nil, nil, errClosed
	}
	e.held[h] = struct{}{}
	e.mu.Unlock()
	go e.watch(lead, h)
	return lead, func() { e.release(h) }, nil
}

// watch pings the lock's connection. A failed ping means the session, and
// with it the lock, may be gone: leadership ends at once, so the tick in
// progress stops rather than racing the next leader.
func (e *elector) watch(lead context.Context, h *heldLock) {
	defer close(h.stopped)
	t := time.NewTicker(e.ping)
	defer t.Stop()
	for {
		select {
		case <-h.quit:
			return
		case <-lead.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(context.Background(), max(e.ping, time.Second))
		err := h.conn.Ping(pctx)
		cancel()
		if err != nil {
			e.log.Warn("lost the connection holding a loop's leadership; stepping down", "loop", h.name, "err", err)
			e.mu.Lock()
			e.lostAt[h.name] = time.Now()
			e.mu.Unlock()
			h.cancel()
			return
		}
	}
}

// release gives the lock up: unlock explicitly (so a waiting replica's
// next try wins without waiting for the session to end) and close.
func (e *elector) release(h *heldLock) {
	h.once.Do(func() {
		h.cancel()
		close(h.quit)
		<-h.stopped
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if !h.conn.IsClosed() {
			_, _ = h.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", h.key)
		}
		h.conn.Close(ctx)
		cancel()
		e.mu.Lock()
		delete(e.held, h)
		e.mu.Unlock()
	})
}

// close ends every leadership and campaign of this store.
func (e *elector) close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	close(e.stop)
	held := make([]*heldLock, 0, len(e.held))
	for h := range e.held {
		held = append(held, h)
	}
	e.mu.Unlock()
	for _, h := range held {
		e.release(h)
	}
}
