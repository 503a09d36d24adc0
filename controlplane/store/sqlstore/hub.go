package sqlstore

import "sync"

// Hub fans notifications out to in-process subscribers. SQLite uses it as
// its whole notification system; PostgreSQL feeds it from LISTEN.
type Hub struct {
	mu   sync.Mutex
	subs map[string]map[chan string]struct{}
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{subs: map[string]map[chan string]struct{}{}} }

// Publish delivers payload to every subscriber of channel without blocking:
// a subscriber whose buffer is full misses it (subscribers treat
// notifications as hints and re-read the store).
func (h *Hub) Publish(channel, payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs[channel] {
		select {
		case ch <- payload:
		default:
		}
	}
}

// Subscribe registers a subscriber; call the returned function to leave.
func (h *Hub) Subscribe(channel string) (<-chan string, func()) {
	ch := make(chan string, 256)
	h.mu.Lock()
	if h.subs[channel] == nil {
		h.subs[channel] = map[chan string]struct{}{}
	}
	h.subs[channel][ch] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs[channel], ch)
			h.mu.Unlock()
		})
	}
}
