package credentials_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
)

func TestKeyIsMadeOnceAndKept(t *testing.T) {
	dir := t.TempDir()
	s1, created, err := credentials.LoadOrCreateKey(dir)
	if err != nil || !created {
		t.Fatalf("first load: created=%v err=%v", created, err)
	}
	fi, err := os.Stat(filepath.Join(dir, credentials.KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	sealed, err := s1.Seal("rack-a", []byte("hunter2"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatal("the sealed value holds the password")
	}
	s2, created, err := credentials.LoadOrCreateKey(dir)
	if err != nil || created {
		t.Fatalf("second load: created=%v err=%v", created, err)
	}
	pw, err := s2.Open("rack-a", sealed)
	if err != nil || string(pw) != "hunter2" {
		t.Fatalf("open with the reloaded key: %q %v", pw, err)
	}
	// Bound to its name: a sealed password moved to another row fails.
	if _, err := s2.Open("rack-b", sealed); err == nil {
		t.Error("a sealed password opened under another credential's name")
	}
	other, _, err := credentials.LoadOrCreateKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Open("rack-a", sealed); err == nil {
		t.Error("another data dir's key opened the password")
	}
	for _, bad := range [][]byte{nil, {1}, append([]byte{9}, sealed[1:]...)} {
		if _, err := s2.Open("rack-a", bad); err == nil {
			t.Errorf("Open(%x) succeeded", bad)
		}
	}
	if err := os.Chmod(filepath.Join(dir, credentials.KeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := credentials.LoadOrCreateKey(dir); err == nil {
		t.Error("a key readable by others was accepted")
	}
	if err := os.WriteFile(filepath.Join(dir, credentials.KeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := credentials.LoadOrCreateKey(dir); err == nil {
		t.Error("a short key was accepted")
	}
}

func TestService(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealer, _, err := credentials.LoadOrCreateKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	svc := &credentials.Service{Store: st, Clock: clock.NewFake(time.Unix(1e9, 0)), Sealer: sealer}
	c, err := svc.Create(ctx, "rack-a", "root", []byte("calvin"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(c.Sealed, []byte("calvin")) {
		t.Fatal("stored in the clear")
	}
	raw, err := st.GetCredential(ctx, "rack-a")
	if err != nil || bytes.Contains(raw.Sealed, []byte("calvin")) {
		t.Fatalf("row: %v", err)
	}
	u, pw, err := svc.Open(ctx, st, "rack-a")
	if err != nil || u != "root" || pw != "calvin" {
		t.Fatalf("open: %q %q %v", u, pw, err)
	}
	for _, tc := range []struct {
		name, user string
		pw         []byte
		code       codes.Code
	}{
		{"rack-a", "root", []byte("x"), codes.AlreadyExists},
		{"b", "", []byte("x"), codes.InvalidArgument},
		{"b", "root", nil, codes.InvalidArgument},
		{"b", "ro\not", []byte("x"), codes.InvalidArgument},
		{"b", "root", bytes.Repeat([]byte("x"), credentials.MaxPassword+1), codes.InvalidArgument},
	} {
		_, err := svc.Create(ctx, tc.name, tc.user, tc.pw)
		if got := status.Code(fail.From(err)); got != tc.code {
			t.Errorf("Create(%q, %q) = %v, want %s", tc.name, tc.user, err, tc.code)
		}
	}
	if _, err := svc.Update(ctx, "rack-a", "", []byte("rotated")); err != nil {
		t.Fatal(err)
	}
	if u, pw, err := svc.Open(ctx, st, "rack-a"); err != nil || u != "root" || pw != "rotated" {
		t.Fatalf("after rotation: %q %q %v", u, pw, err)
	}
	if _, err := svc.Update(ctx, "rack-a", "", nil); status.Code(fail.From(err)) != codes.InvalidArgument {
		t.Errorf("rotate to an empty password: %v", err)
	}
	if _, err := svc.Update(ctx, "nope", "", []byte("x")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("rotate a missing credential: %v", err)
	}
	if _, _, err := svc.Open(ctx, st, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("open a missing credential: %v", err)
	}
	if err := svc.Delete(ctx, "rack-a"); err != nil {
		t.Fatal(err)
	}
	if l, err := svc.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("list after delete: %v %v", l, err)
	}
}
