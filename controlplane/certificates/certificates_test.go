package certificates_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
)

// A revocation is the mark, its event naming who asked and the
// notification every replica's revocation set follows, together.
func TestRevoke(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s := &certificates.Service{Store: st, Clock: clock.NewFake(now)}
	if err := st.CreateCertificate(ctx, &store.Certificate{Serial: "0a", InstanceID: "i-1", Kind: "instance", NotBefore: now,
		NotAfter: now.Add(time.Hour), CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	notes, stop := st.Subscribe(store.ChannelRevocations)
	defer stop()
	c, err := s.Revoke(ctx, "0a", "", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if c.RevokedAt == nil || !c.RevokedAt.Equal(now) || c.RevokeReason != certificates.DefaultReason {
		t.Fatalf("revoked = %+v", c)
	}
	select {
	case serial := <-notes:
		if serial != "0a" {
			t.Fatalf("notified %q", serial)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no revocation notification")
	}
	evs, err := st.ListEvents(ctx, store.EventFilter{Kind: events.CertRevoked}, store.Page{Limit: 10})
	if err != nil || len(evs) != 1 || evs[0].InstanceID != "i-1" {
		t.Fatalf("events = %+v, %v", evs, err)
	}
	if _, err := s.Revoke(ctx, "ff", "", "alice"); fail.Code(err) != codes.NotFound {
		t.Fatalf("an unknown serial: %v", err)
	}
}
