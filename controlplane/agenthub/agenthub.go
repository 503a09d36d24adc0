// Package agenthub tracks the agents connected to this replica: it wakes
// their streams when a notification concerns them, coalesces their
// heartbeats into one write per flush interval, and says when the fleet
// has grown enough that every stream should be resent its settings. The
// agent API (controlplane/api) registers each stream here.
package agenthub

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/controlplane/store"
)

// Hub tracks the agents connected to this replica and wakes their
// streams when a notification (from any replica) concerns them. It also
// coalesces heartbeats: the newest per instance is kept in memory and
// written in one transaction per flush interval, not one per heartbeat.
type Hub struct {
	Config

	mu      sync.Mutex
	streams map[store.InstanceID]*Conn
	pending map[store.InstanceID]store.Heartbeat
	// grown is closed, and replaced, when the fleet reaches a new
	// SettingsTier: every stream waiting on it resends its settings. One
	// channel for all streams, so the news costs no goroutine per stream.
	grown chan struct{}
	tier  int
}

// DefaultSweep bounds how late a task whose notification was lost reaches
// its stream. Streams do not poll on their own: an idle fleet costs one
// query per sweep, not one per stream.
const DefaultSweep = 20 * time.Second

// Conn is an open stream as the hub sees it.
type Conn struct {
	// wake asks the stream to look for tasks and cancellations; it
	// returns at once.
	wake func()
	// kick ends the stream: a newer stream for the same instance replaced it.
	kick func()
}

// Config is what a hub is built with; nothing is set on it later.
type Config struct {
	Store store.Store
	Log   *slog.Logger
	// Flush is the heartbeat write interval.
	Flush time.Duration
	// Sweep is how often Run looks, in one query for every stream, for
	// work whose notification was lost (a dropped LISTEN connection, a
	// full subscriber buffer). Zero means DefaultSweep.
	Sweep time.Duration
	// Metrics count connected agents and heartbeats: the API server's
	// own instruments, made before both (nil: not counted).
	Metrics *Metrics
}

// Metrics are the hub's instruments.
type Metrics struct {
	ConnectedAgents prometheus.Gauge
	Heartbeats      prometheus.Counter
	HeartbeatWrites prometheus.Histogram
}

// New returns an idle hub; Run starts it.
func New(c Config) *Hub {
	return &Hub{Config: c, streams: map[store.InstanceID]*Conn{}, pending: map[store.InstanceID]store.Heartbeat{},
		grown: make(chan struct{})}
}

// Run follows task notifications and flushes heartbeats until ctx ends,
// then flushes once more so acknowledged heartbeats are not lost. The
// flushes run apart from the notifications: a batch of 19,000 agents'
// heartbeats can hold the store for most of a second, and a task's
// notification waiting behind it was the p99 of task push
// (docs/reliability.md).
func (h *Hub) Run(ctx context.Context) {
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		h.flushLoop(ctx)
	}()
	defer func() { <-flushed }()
	ch, stop := h.Store.Subscribe(store.ChannelTasks)
	defer stop()
	every := h.Sweep
	if every <= 0 {
		every = DefaultSweep
	}
	sweep := time.NewTicker(every)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-ch:
			h.Wake(store.InstanceID(id))
		case <-sweep.C:
			if _, err := h.SweepWork(ctx); err != nil && ctx.Err() == nil {
				h.Log.Warn("agent work sweep failed; the next one retries", "err", err)
			}
		}
	}
}

func (h *Hub) flushLoop(ctx context.Context) {
	t := time.NewTicker(h.Flush)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			h.FlushHeartbeats(fctx)
			cancel()
			return
		case <-t.C:
			h.FlushHeartbeats(ctx)
		}
	}
}

// Connected is the number of open streams.
func (h *Hub) Connected() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.streams)
}

// Grown is closed when the fleet next reaches a new settings tier.
func (h *Hub) Grown() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.grown
}

// Register records an open stream for instance id: wake asks it to look
// for work and must return at once; kick ends it. A stream already open
// for id is kicked: the newer one replaces it.
func (h *Hub) Register(id store.InstanceID, wake, kick func()) *Conn {
	c := &Conn{wake: wake, kick: kick}
	h.mu.Lock()
	old := h.streams[id]
	h.streams[id] = c
	// Only a rise counts: a shrinking fleet leaves agents with a longer
	// window than needed, which is safe, and a fleet hovering at a tier's
	// edge does not resend settings on every connect.
	if t := SettingsTier(len(h.streams)); t > h.tier {
		h.tier = t
		close(h.grown)
		h.grown = make(chan struct{})
	}
	h.mu.Unlock()
	if old != nil {
		old.kick()
	}
	if h.Metrics != nil {
		h.Metrics.ConnectedAgents.Inc()
	}
	return c
}

// Unregister forgets a stream Register returned, unless a newer one has
// replaced it.
func (h *Hub) Unregister(id store.InstanceID, c *Conn) {
	h.mu.Lock()
	if h.streams[id] == c {
		delete(h.streams, id)
	}
	h.mu.Unlock()
	if h.Metrics != nil {
		h.Metrics.ConnectedAgents.Dec()
	}
}

// Wake nudges an instance's stream to look for tasks and cancellations.
// It reports whether this replica holds that stream.
func (h *Hub) Wake(instanceID store.InstanceID) bool {
	h.mu.Lock()
	c := h.streams[instanceID]
	h.mu.Unlock()
	if c == nil {
		return false
	}
	c.wake()
	return true
}

// SweepWork wakes the connected streams whose instance has a pending task
// or a cancellation to relay, found in one query, and returns how many it
// woke. It is the safety net under notifications, which are best effort.
func (h *Hub) SweepWork(ctx context.Context) (int, error) {
	h.mu.Lock()
	idle := len(h.streams) == 0
	h.mu.Unlock()
	if idle {
		return 0, nil // nothing here to wake: spare the query
	}
	ids, err := h.Store.ListInstancesWithAgentWork(ctx)
	if err != nil {
		return 0, fmt.Errorf("agent work sweep: %w", err)
	}
	woke := 0
	for _, id := range ids {
		if h.Wake(id) {
			woke++
		}
	}
	return woke, nil
}

// Queued is the number of heartbeats waiting for the next flush.
func (h *Hub) Queued() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pending)
}

// Heartbeat queues a heartbeat for the next batch.
func (h *Hub) Heartbeat(hb store.Heartbeat) {
	h.mu.Lock()
	h.pending[hb.InstanceID] = hb
	h.mu.Unlock()
	if h.Metrics != nil {
		h.Metrics.Heartbeats.Inc()
	}
}

// FlushHeartbeats writes the queued heartbeats in one transaction. If the
// write fails (the database is down) they go back in the queue, unless a
// newer one arrived meanwhile, and are written by a later flush.
func (h *Hub) FlushHeartbeats(ctx context.Context) {
	h.mu.Lock()
	if len(h.pending) == 0 {
		h.mu.Unlock()
		return
	}
	batch := make([]store.Heartbeat, 0, len(h.pending))
	for _, hb := range h.pending {
		batch = append(batch, hb)
	}
	h.pending = make(map[store.InstanceID]store.Heartbeat, len(batch))
	h.mu.Unlock()

	err := h.Store.Tx(ctx, func(q store.Queries) error { return q.RecordHeartbeats(ctx, batch) })
	if err != nil {
		h.Log.Warn("heartbeat batch not written; keeping it for the next flush", "heartbeats", len(batch), "err", err)
		h.mu.Lock()
		for _, hb := range batch {
			if cur, ok := h.pending[hb.InstanceID]; !ok || cur.At.Before(hb.At) {
				h.pending[hb.InstanceID] = hb
			}
		}
		h.mu.Unlock()
		return
	}
	if h.Metrics != nil {
		h.Metrics.HeartbeatWrites.Observe(float64(len(batch)))
	}
}
