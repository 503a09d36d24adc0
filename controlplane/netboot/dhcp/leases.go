package dhcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
)

// StoreLeases keeps leases in the store, so a restart keeps them and
// replicas share them. The store's unique keys are the guarantee that no
// address is leased twice; a writer that loses a race retries.
type StoreLeases struct {
	Store store.Store
	Pool  Pool

	mu   sync.Mutex
	next netip.Addr // where the next free address probably is
}

// probes is how many addresses from the hint are tried one by one before
// the whole table is read: a fresh range fills in order, so the first
// probe nearly always hits, and a scan per lease would make leasing
// quadratic in the range.
const probes = 8

// maxPoolSize bounds a range: a provisioning network, not a campus.
const maxPoolSize = 1 << 16

// Size is the number of addresses in p.
func (p Pool) Size() int {
	a, b := p.First.As4(), p.Last.As4()
	u := func(x [4]byte) int64 { return int64(x[0])<<24 | int64(x[1])<<16 | int64(x[2])<<8 | int64(x[3]) }
	return int(u(b) - u(a) + 1)
}

// Lease implements Leases.
func (l *StoreLeases) Lease(ctx context.Context, mac string, now time.Time, d time.Duration) (netip.Addr, error) {
	var addr netip.Addr
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = l.Store.Tx(ctx, func(q store.Queries) error {
			addr, err = l.lease(ctx, q, mac, now, d)
			return err
		})
		if !errors.Is(err, store.ErrAlreadyExists) {
			break
		}
		// Another replica leased the address we picked: pick again.
	}
	return addr, err
}

func (l *StoreLeases) lease(ctx context.Context, q store.Queries, mac string, now time.Time, d time.Duration) (netip.Addr, error) {
	cur, err := q.GetDHCPLeaseByMAC(ctx, mac)
	switch {
	case err == nil:
		a, perr := netip.ParseAddr(cur.IP)
		if perr == nil && l.Pool.Contains(a) {
			cur.ExpiresAt, cur.UpdatedAt = now.Add(d), now
			return a, q.UpdateDHCPLease(ctx, cur)
		}
		// The range changed under an old lease: lease anew.
		if err := q.DeleteDHCPLease(ctx, cur.IP); err != nil {
			return netip.Addr{}, err
		}
	case !errors.Is(err, store.ErrNotFound):
		return netip.Addr{}, err
	}
	if a, ok, err := l.probe(ctx, q, mac, now, d); err != nil || ok {
		return a, err
	}
	all, err := q.ListDHCPLeases(ctx)
	if err != nil {
		return netip.Addr{}, err
	}
	taken := make(map[netip.Addr]*store.DHCPLease, len(all))
	for _, x := range all {
		if a, err := netip.ParseAddr(x.IP); err == nil {
			taken[a] = x
		}
	}
	// First a never-leased address, then the longest-expired one: a
	// machine that comes back soon after its lease ran out may find its
	// old address still free.
	var expired *store.DHCPLease
	for a := l.Pool.First; a.IsValid() && a.Compare(l.Pool.Last) <= 0; a = a.Next() {
		x, ok := taken[a]
		if !ok {
			l.hint(a)
			return a, q.CreateDHCPLease(ctx, &store.DHCPLease{IP: a.String(), MAC: mac, ExpiresAt: now.Add(d), UpdatedAt: now})
		}
		if x.ExpiresAt.Before(now) && (expired == nil || x.ExpiresAt.Before(expired.ExpiresAt)) {
			expired = x
		}
	}
	if expired == nil {
		return netip.Addr{}, ErrPoolExhausted
	}
	if err := q.DeleteDHCPLease(ctx, expired.IP); err != nil {
		return netip.Addr{}, err
	}
	a, _ := netip.ParseAddr(expired.IP)
	return a, q.CreateDHCPLease(ctx, &store.DHCPLease{IP: expired.IP, MAC: mac, ExpiresAt: now.Add(d), UpdatedAt: now})
}

// probe tries a few never-leased addresses from the hint onwards.
func (l *StoreLeases) probe(ctx context.Context, q store.Queries, mac string, now time.Time, d time.Duration) (netip.Addr, bool, error) {
	l.mu.Lock()
	a := l.next
	l.mu.Unlock()
	if !l.Pool.Contains(a) {
		a = l.Pool.First
	}
	for range probes {
		_, err := q.GetDHCPLeaseByIP(ctx, a.String())
		if errors.Is(err, store.ErrNotFound) {
			l.hint(a)
			return a, true, q.CreateDHCPLease(ctx, &store.DHCPLease{IP: a.String(), MAC: mac, ExpiresAt: now.Add(d), UpdatedAt: now})
		}
		if err != nil {
			return netip.Addr{}, false, err
		}
		if a = a.Next(); !l.Pool.Contains(a) {
			a = l.Pool.First
		}
	}
	return netip.Addr{}, false, nil
}

func (l *StoreLeases) hint(leased netip.Addr) {
	l.mu.Lock()
	l.next = leased.Next()
	l.mu.Unlock()
}

// Current implements Leases.
func (l *StoreLeases) Current(ctx context.Context, mac string, now time.Time) (netip.Addr, bool, error) {
	cur, err := l.Store.GetDHCPLeaseByMAC(ctx, mac)
	if errors.Is(err, store.ErrNotFound) {
		return netip.Addr{}, false, nil
	}
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("lease of %s: %w", mac, err)
	}
	a, err := netip.ParseAddr(cur.IP)
	if err != nil || !l.Pool.Contains(a) || cur.ExpiresAt.Before(now) {
		return netip.Addr{}, false, nil
	}
	return a, true, nil
}

// Release implements Leases.
// The read and the delete are one transaction, so a lease given to
// another MAC in between is not the one deleted.
func (l *StoreLeases) Release(ctx context.Context, mac string) error {
	return l.Store.Tx(ctx, func(q store.Queries) error {
		cur, err := q.GetDHCPLeaseByMAC(ctx, mac)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return q.DeleteDHCPLease(ctx, cur.IP)
	})
}
