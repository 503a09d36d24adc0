package modules_test

import (
	"context"
	"crypto/ed25519"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/pki"
)

func TestAddAndRemoveSigner(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t0 := time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC)
	r := &modules.Registry{Store: st, Clock: clock.NewFake(t0)}
	key := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)).Public().(ed25519.PublicKey)
	other := ed25519.NewKeyFromSeed([]byte("0123456789abcdef0123456789abcdef")).Public().(ed25519.PublicKey)

	s, err := r.AddSigner(ctx, "release", key)
	if err != nil || s.Fingerprint != pki.SignerFingerprint(key) || !s.CreatedAt.Equal(t0) {
		t.Fatalf("AddSigner = %+v, %v; want the key's fingerprint, stamped now", s, err)
	}
	for _, tt := range []struct {
		name string
		key  ed25519.PublicKey
	}{{"release", other}, {"second-name", key}} {
		if _, err := r.AddSigner(ctx, tt.name, tt.key); fail.Code(err) != codes.AlreadyExists {
			t.Fatalf("AddSigner(%s) again = %v; want AlreadyExists", tt.name, err)
		}
	}
	if all, err := r.Signers(ctx); err != nil || len(all) != 1 {
		t.Fatalf("Signers = %v, %v; want the one registered", all, err)
	}
	if err := r.RemoveSigner(ctx, s.Fingerprint); err != nil {
		t.Fatal(err)
	}
	if err := r.RemoveSigner(ctx, "release"); fail.Code(err) != codes.NotFound {
		t.Fatalf("RemoveSigner of a removed signer = %v; want NotFound", err)
	}
	if all, err := r.Signers(ctx); err != nil || len(all) != 0 {
		t.Fatalf("Signers = %v, %v; want none", all, err)
	}
}
