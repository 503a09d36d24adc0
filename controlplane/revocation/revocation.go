// Package revocation keeps the set of revoked certificate serials every
// authenticated call is checked against: loaded from the store, added to
// by notifications from any replica, reloaded periodically, and failing
// closed when reloads keep failing. Open streams authenticated with a
// serial are ended when it is revoked (OnRevoke).
package revocation

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Set is the in-memory set of revoked, unexpired certificate serials
// that every authenticated call checks. It is loaded from the
// store, follows revocations from any replica through notifications, and
// is reloaded periodically in case a notification was missed.
type Set struct {
	mu     sync.RWMutex
	serial map[store.CertSerial]struct{}
	// onRevoke holds, per serial, the callbacks of the open streams
	// authenticated with it: a revocation reaches its streams without a
	// goroutine per stream or a broadcast to all of them.
	onRevoke map[store.CertSerial]map[*func()]struct{}

	// What Follow keeps, under mu: when the set last loaded, and how many
	// periodic reloads in a row have failed since. Counting reloads rather
	// than reading a clock keeps the bound the same whatever clock the
	// control plane runs on.
	loadedAt time.Time
	failed   int
}

// StaleAfterReloads is how many periodic reloads in a row may fail before
// the set is stale and certificates are refused.
const StaleAfterReloads = 10

var reloadFailuresOpts = prometheus.CounterOpts{Name: "tether_revocation_reload_failures_total",
	Help: "Periodic reloads of the certificate revocation list that failed (past StaleAfterReloads in a row, certificates are refused)."}

// NewSet returns an empty set.
func NewSet() *Set {
	return &Set{serial: map[store.CertSerial]struct{}{}, onRevoke: map[store.CertSerial]map[*func()]struct{}{}}
}

// Check refuses a revoked serial, and every serial once the set is
// stale: a revocation list that stopped reloading may be missing a
// revocation, and a revoked certificate must not get in (fail closed).
func (r *Set) Check(serial store.CertSerial) error {
	if loaded, stale := r.Stale(); stale {
		return fail.Unavailable("the certificate revocation list has failed to reload %d times in a row (last loaded %s; see the tetherd log): certificates are refused until it reloads",
			StaleAfterReloads, loaded.UTC().Format(time.RFC3339))
	}
	if r.IsRevoked(serial) {
		return fail.Unauthenticated("client certificate %s is revoked", serial)
	}
	return nil
}

// Stale reports whether StaleAfterReloads periodic reloads in a row have
// failed, and when the set last loaded.
func (r *Set) Stale() (time.Time, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.loadedAt, r.failed >= StaleAfterReloads
}

// IsRevoked reports whether serial is revoked.
func (r *Set) IsRevoked(serial store.CertSerial) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.serial[serial]
	return ok
}

// Add marks serials revoked and ends the open streams authenticated with
// them.
func (r *Set) Add(serials ...store.CertSerial) {
	var ends []func()
	r.mu.Lock()
	for _, s := range serials {
		if _, ok := r.serial[s]; ok {
			continue
		}
		r.serial[s] = struct{}{}
		for f := range r.onRevoke[s] {
			ends = append(ends, *f)
		}
	}
	r.mu.Unlock()
	for _, end := range ends {
		end()
	}
}

// OnRevoke calls end (which must not block) once serial is revoked, at
// once if it already is; stop forgets it.
func (r *Set) OnRevoke(serial store.CertSerial, end func()) (stop func()) {
	f := &end
	r.mu.Lock()
	_, revoked := r.serial[serial]
	if !revoked {
		if r.onRevoke[serial] == nil {
			r.onRevoke[serial] = map[*func()]struct{}{}
		}
		r.onRevoke[serial][f] = struct{}{}
	}
	r.mu.Unlock()
	if revoked {
		end()
		return func() {}
	}
	return func() {
		r.mu.Lock()
		delete(r.onRevoke[serial], f)
		if len(r.onRevoke[serial]) == 0 {
			delete(r.onRevoke, serial)
		}
		r.mu.Unlock()
	}
}

// Load replaces the set from the store.
func (r *Set) Load(ctx context.Context, s store.Store, now time.Time) error {
	serials, err := s.ListRevokedSerials(ctx, now)
	if err != nil {
		return err
	}
	fresh := make(map[store.CertSerial]struct{}, len(serials))
	for _, x := range serials {
		fresh[x] = struct{}{}
	}
	r.mu.Lock()
	old := r.serial
	r.serial, r.loadedAt, r.failed = fresh, now, 0
	r.mu.Unlock()
	var added []store.CertSerial
	for x := range fresh {
		if _, ok := old[x]; !ok {
			added = append(added, x)
		}
	}
	if len(added) > 0 {
		// Re-add through Add so watchers hear about ones a missed
		// notification would have announced.
		r.mu.Lock()
		for _, x := range added {
			delete(r.serial, x)
		}
		r.mu.Unlock()
		r.Add(added...)
	}
	return nil
}

// Follow keeps the set current until ctx ends: notifications add
// serials as they come, and a reload every period catches any that were
// missed. A failed reload is logged and counted in failures (may be nil);
// after StaleAfterReloads failures in a row the set is stale and
// authentication refuses every certificate until a reload succeeds.
func (r *Set) Follow(ctx context.Context, s store.Store, clock interface{ Now() time.Time }, every time.Duration, log *slog.Logger, failures prometheus.Counter) {
	ch, stop := s.Subscribe(store.ChannelRevocations)
	defer stop()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case serial := <-ch:
			// The notification's payload is the serial (store.ChannelRevocations).
			r.Add(store.CertSerial(serial))
		case <-t.C:
			r.reload(ctx, s, clock.Now(), log, failures)
		}
	}
}

// reload is one periodic reload of Follow.
func (r *Set) reload(ctx context.Context, s store.Store, now time.Time, log *slog.Logger, failures prometheus.Counter) {
	err := r.Load(ctx, s, now)
	if err == nil || ctx.Err() != nil {
		return
	}
	if failures != nil {
		failures.Inc()
	}
	r.mu.Lock()
	r.failed++
	r.mu.Unlock()
	loaded, stale := r.Stale()
	log.Error("certificate revocation list reload failed", "err", err, "last_loaded", loaded, "refusing_certificates", stale)
}

// NewReloadFailures is the counter Follow's failures go to, registered
// with reg when it is not nil.
func NewReloadFailures(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(reloadFailuresOpts)
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}
