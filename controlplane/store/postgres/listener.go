package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlstore"
)

// defaultChannels are LISTENed from the start, so a Subscribe on them never
// waits for the server.
var defaultChannels = []string{store.ChannelEvents, store.ChannelTasks, store.ChannelRevocations, store.ChannelInstances}

// listener holds one dedicated connection that LISTENs on every channel a
// local subscriber wants and feeds what arrives into the hub. It
// reconnects by itself; notifications sent while it is disconnected are
// lost, which subscribers tolerate (they treat notifications as hints and
// also poll).
type listener struct {
	cfg  *pgx.ConnConfig
	hub  *sqlstore.Hub
	log  *slog.Logger
	ping time.Duration
	// where names the server in logs.
	where string

	mu sync.Mutex
	// wanted is every channel to LISTEN on; listening those the current
	// connection does. pending are channels waiting for their LISTEN.
	wanted    map[string]bool
	listening map[string]bool
	waiters   map[string][]chan struct{}
	// interrupt, while the loop waits for a notification, stops the wait
	// so that the loop can issue a new LISTEN.
	interrupt func()

	cancel context.CancelFunc
	done   chan struct{}
}

// startListener connects, LISTENs on the default channels and returns once
// they are in place, so the first Subscribe sees every later commit.
func startListener(ctx context.Context, cfg *pgx.ConnConfig, hub *sqlstore.Hub, o Options, where string) (*listener, error) {
	l := &listener{
		cfg: cfg.Copy(), hub: hub, log: o.Log, ping: o.ListenerPing, where: where,
		wanted: map[string]bool{}, listening: map[string]bool{}, waiters: map[string][]chan struct{}{},
		done: make(chan struct{}),
	}
	for _, c := range defaultChannels {
		l.wanted[c] = true
	}
	conn, err := l.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go l.run(runCtx, conn)
	return l, nil
}

// connect opens the connection and LISTENs on every wanted channel.
func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, l.cfg)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	chans := make([]string, 0, len(l.wanted))
	for c := range l.wanted {
		chans = append(chans, c)
	}
	l.listening = map[string]bool{}
	l.mu.Unlock()
	for _, c := range chans {
		if err := l.listen(cctx, conn, c); err != nil {
			conn.Close(context.Background())
			return nil, err
		}
	}
	return conn, nil
}

func (l *listener) listen(ctx context.Context, conn *pgx.Conn, channel string) error {
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen %s: %w", channel, err)
	}
	l.mu.Lock()
	l.listening[channel] = true
	for _, w := range l.waiters[channel] {
		close(w)
	}
	delete(l.waiters, channel)
	l.mu.Unlock()
	return nil
}

func (l *listener) run(ctx context.Context, conn *pgx.Conn) {
	defer close(l.done)
	delay := 100 * time.Millisecond
	for {
		if conn != nil {
			err := l.serve(ctx, conn)
			conn.Close(context.Background())
			conn = nil
			if ctx.Err() != nil {
				return
			}
			l.log.Warn("PostgreSQL notification listener lost its connection; reconnecting", "server", l.where, "err", err)
			delay = 100 * time.Millisecond
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		c, err := l.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.log.Debug("PostgreSQL notification listener: reconnect failed", "server", l.where, "err", err, "retry_in", delay)
			// Capped low: notifications committed while we are away are
			// lost, so the gap after the server returns must stay short.
			delay = min(delay*2, time.Second)
			continue
		}
		l.log.Info("PostgreSQL notification listener reconnected", "server", l.where)
		conn = c
	}
}

// serve relays notifications until the connection fails or ctx ends.
func (l *listener) serve(ctx context.Context, conn *pgx.Conn) error {
	for {
		// New channels first: a subscriber is waiting for them.
		l.mu.Lock()
		var todo []string
		for c := range l.wanted {
			if !l.listening[c] {
				todo = append(todo, c)
			}
		}
		if len(todo) > 0 {
			l.mu.Unlock()
			for _, c := range todo {
				if err := l.listen(ctx, conn, c); err != nil {
					return err
				}
			}
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, l.ping)
		l.interrupt = cancel
		l.mu.Unlock()

		n, err := conn.WaitForNotification(wctx)

		l.mu.Lock()
		l.interrupt = nil
		l.mu.Unlock()
		interrupted := wctx.Err() != nil
		cancel()
		if n != nil {
			l.hub.Publish(n.Channel, n.Payload)
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case interrupted && conn.PgConn().IsClosed():
			return err
		case interrupted && errors.Is(wctx.Err(), context.DeadlineExceeded):
			// Quiet for a while: make sure the connection still works, so
			// a silently dead one is noticed rather than waited on forever.
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			err := conn.Ping(pctx)
			pcancel()
			if err != nil {
				return err
			}
		case interrupted:
			// A Subscribe wants a new channel; loop round to LISTEN.
		default:
			return err
		}
	}
}

// subscribe joins the hub and makes sure the channel is LISTENed. For a
// channel not yet listened on it waits (briefly) for the LISTEN, so the
// caller does not miss a notification committed right after.
func (l *listener) subscribe(channel string) (<-chan string, func()) {
	ch, stop := l.hub.Subscribe(channel)
	l.mu.Lock()
	if l.listening[channel] {
		l.mu.Unlock()
		return ch, stop
	}
	l.wanted[channel] = true
	w := make(chan struct{})
	l.waiters[channel] = append(l.waiters[channel], w)
	if l.interrupt != nil {
		l.interrupt()
	}
	l.mu.Unlock()
	select {
	case <-w:
	case <-l.done:
	case <-time.After(5 * time.Second):
		// The server is unreachable; the LISTEN happens on reconnect.
	}
	return ch, stop
}

func (l *listener) close() {
	l.cancel()
	<-l.done
}
