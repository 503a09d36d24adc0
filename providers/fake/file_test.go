package fake

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tetherfleet/tether/providers"
)

func TestOpenPersistsMachines(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "machines.json")
	p, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	boot := providers.Boot{Enrollment: providers.Enrollment{Token: "tbt_x", ControlPlaneURL: "https://127.0.0.1:1"}}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := p.Provision(ctx, providers.Spec{InstanceID: id, Boot: boot}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Terminate(ctx, MachineID("b")); err != nil {
		t.Fatal(err)
	}
	// A new process over the same file sees what the old one left.
	q, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	got := q.Machines()
	if len(got) != 2 || got[0].ID != MachineID("a") || got[1].ID != MachineID("c") {
		t.Fatalf("reopened machines = %+v, want a and c", got)
	}
	if e, ok := q.Enrollment(MachineID("a")); !ok || e.Token != "tbt_x" {
		t.Fatalf("enrollment after reopen = %+v %v", e, ok)
	}
	ms, err := ReadFile(path)
	if err != nil || len(ms) != 2 {
		t.Fatalf("ReadFile = %d machines, %v", len(ms), err)
	}
}

// Two Providers opened on one path, as two tetherd replicas open it, act on
// one machine list: what one does, the other sees at its next call.
func TestSharedFileSeenByBoth(t *testing.T) {
	ctx := context.Background()
	boot := func(tok string) providers.Boot { return providers.Boot{Enrollment: providers.Enrollment{Token: tok}} }
	cases := []struct {
		name string
		// act runs on a, then check looks through b.
		act   func(t *testing.T, a *Provider)
		check func(t *testing.T, b *Provider)
	}{
		{"provision on one, listed by the other",
			func(t *testing.T, a *Provider) {
				if _, err := a.Provision(ctx, providers.Spec{InstanceID: "x", Boot: boot("tbt_1")}); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, b *Provider) {
				ms, err := b.List(ctx)
				if err != nil || len(ms) != 1 || ms[0].ID != MachineID("x") {
					t.Fatalf("List = %+v, %v; want x", ms, err)
				}
				if e, ok := b.Enrollment(MachineID("x")); !ok || e.Token != "tbt_1" {
					t.Fatalf("Enrollment = %+v %v; want tbt_1", e, ok)
				}
			}},
		{"terminate on one, gone for the other",
			func(t *testing.T, a *Provider) {
				if err := a.Terminate(ctx, MachineID("x")); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, b *Provider) {
				m, err := b.Status(ctx, MachineID("x"))
				if err != nil || m.State != providers.StateGone {
					t.Fatalf("Status = %+v, %v; want gone", m, err)
				}
			}},
		{"reboot on one, new boot seen by the other",
			func(t *testing.T, a *Provider) {
				if _, err := a.Provision(ctx, providers.Spec{InstanceID: "y", Boot: boot("tbt_2")}); err != nil {
					t.Fatal(err)
				}
				if _, err := a.Reboot(ctx, MachineID("y"), boot("tbt_3")); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, b *Provider) {
				if n := b.Boots(MachineID("y")); n != 2 {
					t.Fatalf("Boots = %d, want 2", n)
				}
				if e, _ := b.Enrollment(MachineID("y")); e.Token != "tbt_3" {
					t.Fatalf("Enrollment after reboot = %q, want tbt_3", e.Token)
				}
			}},
		{"stop on one, state seen by the other",
			func(t *testing.T, a *Provider) {
				if _, err := a.Stop(ctx, MachineID("y")); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, b *Provider) {
				if m, err := b.Status(ctx, MachineID("y")); err != nil || m.State != providers.StateStopped {
					t.Fatalf("Status = %+v, %v; want stopped", m, err)
				}
			}},
		{"vanish on one, gone for the other",
			func(t *testing.T, a *Provider) {
				if !a.Vanish(MachineID("y")) {
					t.Fatal("Vanish found no y")
				}
			},
			func(t *testing.T, b *Provider) {
				if ms := b.Machines(); len(ms) != 0 {
					t.Fatalf("Machines = %+v, want none", ms)
				}
			}},
	}
	path := filepath.Join(t.TempDir(), "machines.json")
	a, b := openTwo(t, path)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.act(t, a)
			c.check(t, b)
		})
		// The same step the other way round: b acts, a sees.
		a, b = b, a
	}
}

// Concurrent provisions through two Providers on one path lose none: each
// is a read-modify-write of the whole file, so without the lock one
// process's write would drop the other's machine.
func TestSharedFileConcurrentCreatesLoseNone(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "machines.json")
	a, b := openTwo(t, path)
	const perGoroutine, goroutines = 25, 4
	var wg sync.WaitGroup
	errs := make(chan error, 2*goroutines*perGoroutine)
	for i, p := range []*Provider{a, b} {
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < perGoroutine; n++ {
					id := fmt.Sprintf("p%d-g%d-%d", i, g, n)
					if _, err := p.Provision(ctx, providers.Spec{InstanceID: id}); err != nil {
						errs <- err
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := 2 * goroutines * perGoroutine
	for name, p := range map[string]*Provider{"a": a, "b": b} {
		if ms, err := p.List(ctx); err != nil || len(ms) != want {
			t.Fatalf("%s lists %d machines (%v), want %d", name, len(ms), err, want)
		}
	}
	if ms, err := ReadFile(path); err != nil || len(ms) != want {
		t.Fatalf("the file holds %d machines (%v), want %d", len(ms), err, want)
	}
}

// A process killed between writing its temp file and renaming it leaves
// the temp file behind and the old list in place: the next Provider reads
// the old list and is not confused by the stray file.
func TestSharedFileSurvivesCrashBeforeRename(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "machines.json")
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Provision(ctx, providers.Spec{InstanceID: "x"}); err != nil {
		t.Fatal(err)
	}
	// What save leaves if the process dies after its write: a half-written
	// temp file beside the real one.
	if err := os.WriteFile(filepath.Join(dir, ".fake-machines-123"), []byte(`[{"id":"fake-tor`), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if ms := b.Machines(); len(ms) != 1 || ms[0].ID != MachineID("x") {
		t.Fatalf("Machines after the crash = %+v, want x", ms)
	}
	if _, err := b.Provision(ctx, providers.Spec{InstanceID: "y"}); err != nil {
		t.Fatal(err)
	}
	if ms, err := ReadFile(path); err != nil || len(ms) != 2 {
		t.Fatalf("the file holds %d machines (%v), want 2", len(ms), err)
	}
}

func openTwo(t *testing.T, path string) (*Provider, *Provider) {
	t.Helper()
	a, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}
