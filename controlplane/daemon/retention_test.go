package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
)

// The retention tick prunes old events, finished tasks, expired tokens and
// expired certificates, and nothing live.
func TestRetentionTick(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	long := now.Add(-400 * 24 * time.Hour)
	if err := st.AppendEvent(ctx, &store.Event{Kind: "old", Severity: store.SeverityCritical, CreatedAt: long}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateToken(ctx, &store.Token{Hash: "spent", InstanceID: "i", ExpiresAt: long, CreatedAt: long}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateToken(ctx, &store.Token{Hash: "live", InstanceID: "i", ExpiresAt: now.Add(time.Hour), CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	o := ServeOptions{Clock: clock.NewFake(now), EventRetentionLow: 90 * 24 * time.Hour, EventRetentionHigh: 365 * 24 * time.Hour}
	if err := prune(ctx, st, slog.New(slog.NewTextHandler(io.Discard, nil)), o); err != nil {
		t.Fatal(err)
	}
	if evs, _ := st.ListEvents(ctx, store.EventFilter{}, store.Page{}); len(evs) != 0 {
		t.Fatalf("a 400-day-old critical event survived: %v", evs)
	}
	if _, err := st.GetToken(ctx, "spent"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an expired token survived: %v", err)
	}
	if _, err := st.GetToken(ctx, "live"); err != nil {
		t.Fatalf("a live token was pruned: %v", err)
	}
}
