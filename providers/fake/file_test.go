package fake

import (
	"context"
	"path/filepath"
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
