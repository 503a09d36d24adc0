// Package guard keeps a panic in one request from taking tetherd down. A
// goroutine that serves untrusted input (a TFTP transfer, a DHCP packet,
// a router solicitation, an HTTP request, a gRPC call) defers Recover: the
// panic becomes one logged error line with its stack, counted by where it
// happened, and the rest of the process keeps serving.
package guard

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Panics logs and counts recovered panics. A nil *Panics still recovers
// (a forgotten wiring must not bring the crash back); it just has nowhere
// to say so.
type Panics struct {
	Log *slog.Logger
	// Count is tether_panics_recovered_total{listener}; may be nil.
	Count *prometheus.CounterVec
}

// New registers the counter with reg (may be nil) and logs to log.
func New(reg prometheus.Registerer, log *slog.Logger) *Panics {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_panics_recovered_total",
		Help: "Panics recovered in a goroutine serving untrusted input, by listener (each is a bug: the log has its stack)."},
		[]string{"listener"})
	if reg != nil {
		reg.MustRegister(c)
	}
	return &Panics{Log: log, Count: c}
}

// Recover must be deferred directly (`defer p.Recover("tftp")`): recover
// works only in the deferred call itself.
func (p *Panics) Recover(listener string) {
	if v := recover(); v != nil {
		p.Note(listener, v)
	}
}

// Note records a panic value that the caller recovered itself (a caller
// that must answer the request after the panic, as gRPC's does).
func (p *Panics) Note(listener string, v any) error {
	err := fmt.Errorf("panic serving %s: %v", listener, v)
	if p == nil {
		return err
	}
	if p.Count != nil {
		p.Count.WithLabelValues(listener).Inc()
	}
	if p.Log != nil {
		p.Log.Error("recovered a panic; the request was dropped and tetherd keeps serving", "listener", listener,
			"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	}
	return err
}
