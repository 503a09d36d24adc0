package revocation

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

// revokedStore answers ListRevokedSerials with serials, or fails while
// down is set; nothing else of the store is used.
type revokedStore struct {
	store.Store
	serials []store.CertSerial
	down    bool
}

func (s *revokedStore) ListRevokedSerials(context.Context, time.Time) ([]store.CertSerial, error) {
	if s.down {
		return nil, errors.New("database is locked")
	}
	return s.serials, nil
}

// A failing periodic reload is logged and counted, never dropped; after
// StaleAfterReloads failures in a row every certificate is refused (the
// list may be missing a revocation) until a reload succeeds.
func TestRevocationReloadFailuresAreLoudAndFailClosed(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	st := &revokedStore{serials: []store.CertSerial{"01"}}
	r := NewSet()
	if err := r.Load(ctx, st, now); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	failures := NewReloadFailures(nil)

	steps := []struct {
		down     bool
		reloads  int
		failures float64
		code     codes.Code // for serial "02", never revoked
	}{
		{false, 1, 0, codes.OK},
		{true, StaleAfterReloads - 1, StaleAfterReloads - 1, codes.OK},
		{true, 1, StaleAfterReloads, codes.Unavailable},
		{false, 1, StaleAfterReloads, codes.OK},
	}
	for i, s := range steps {
		st.down = s.down
		for range s.reloads {
			r.reload(ctx, st, now, log, failures)
		}
		if got := testutil.ToFloat64(failures); got != s.failures {
			t.Fatalf("step %d: %v failures counted, want %v", i, got, s.failures)
		}
		if got := fail.Code(r.Check("02")); got != s.code {
			t.Fatalf("step %d: a good certificate got %v, want %v", i, got, s.code)
		}
		if got := fail.Code(r.Check("01")); got == codes.OK {
			t.Fatalf("step %d: the revoked certificate was let in", i)
		}
	}
	if n := strings.Count(logs.String(), "certificate revocation list reload failed"); n != StaleAfterReloads {
		t.Fatalf("%d failures logged, want %d:\n%s", n, StaleAfterReloads, logs.String())
	}
	if !strings.Contains(logs.String(), "database is locked") || !strings.Contains(logs.String(), "level=ERROR") {
		t.Fatalf("the log does not carry the error at Error level:\n%s", logs.String())
	}
}

// A revocation ends only the streams of its serial, at once for one
// already revoked, and never one that stopped listening.
func TestOnRevokeCallsOnlyTheRevokedSerial(t *testing.T) {
	r := NewSet()
	calls := map[string]int{}
	stopA := r.OnRevoke("0a", func() { calls["a"]++ })
	r.OnRevoke("0b", func() { calls["b"]++ })
	stopC := r.OnRevoke("0a", func() { calls["c"]++ })
	stopC()
	r.Add("0a")
	r.Add("0a") // again: no second call
	if calls["a"] != 1 || calls["b"] != 0 || calls["c"] != 0 {
		t.Fatalf("calls %v after revoking 0a; want a once, b and c never", calls)
	}
	stopA()
	r.OnRevoke("0a", func() { calls["late"]++ })
	if calls["late"] != 1 {
		t.Fatalf("a stream opened with an already revoked serial was not ended at once: %v", calls)
	}
	if len(r.onRevoke) != 1 || len(r.onRevoke["0b"]) != 1 {
		t.Fatalf("callbacks kept %v; want only 0b's", r.onRevoke)
	}
}
