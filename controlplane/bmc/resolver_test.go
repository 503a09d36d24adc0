package bmc_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/bmc"
	"github.com/tetherfleet/tether/controlplane/credentials"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers/redfish"
)

func TestResolver(t *testing.T) {
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
	clk := clock.NewFake(time.Unix(2e9, 0))
	creds := &credentials.Service{Store: st, Clock: clk, Sealer: sealer}
	if _, err := creds.Create(ctx, "rack", "root", []byte("calvin")); err != nil {
		t.Fatal(err)
	}
	now := clk.Now()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(st.CreateModule(ctx, &store.Module{Name: "m", Version: "1", Digest: "sha256:00", CreatedAt: now}))
	tpl := &store.Template{Name: "t", RootModules: []store.ModuleRef{{Name: "m", Version: "1"}}, CreatedAt: now, UpdatedAt: now}
	must(st.CreateTemplate(ctx, tpl))
	addr := "redfish://10.0.0.1/redfish/v1/Systems/1"
	nodes := map[string]store.NodeBMC{
		"good":   {Address: addr, Credential: "rack", Fingerprint: "sha256:ab", BootMode: redfish.ModeLegacy},
		"broken": {Address: addr, Credential: "gone"},
		"plain":  {},
	}
	ids := map[string]store.NodeID{}
	for name, b := range nodes {
		n := &store.Node{Name: name, TemplateID: tpl.ID, Enabled: true, BMC: b, CreatedAt: now, UpdatedAt: now}
		must(st.CreateNode(ctx, n))
		ids[name] = n.ID
	}
	// An instance that recorded the machine, one that did not, and a terminated one.
	for _, in := range []*store.Instance{
		{ID: "rec", NodeID: ids["good"], Provider: redfish.Name, Status: lifecycle.Running, CloudInstanceID: "redfish:good"},
		{ID: "old", NodeID: ids["good"], Provider: redfish.Name, Status: lifecycle.Terminated, CloudInstanceID: "redfish:good"},
		{ID: "unrec", NodeID: ids["broken"], Provider: redfish.Name, Status: lifecycle.Provisioning},
	} {
		in.CreatedAt, in.UpdatedAt = now, now
		must(st.CreateInstance(ctx, in))
	}
	r := &bmc.Resolver{Store: st, Credentials: creds, Clock: clk}

	got, err := r.Target(ctx, "good")
	must(err)
	if got.Username != "root" || got.Password != "calvin" || got.Address != addr || got.TLS.Fingerprint != "sha256:ab" ||
		got.BootMode != redfish.ModeLegacy || got.InstanceID != "rec" {
		t.Errorf("target %+v", got)
	}
	for node, want := range map[string]error{"plain": redfish.ErrNoBMC, "nope": redfish.ErrNoBMC, "broken": redfish.ErrMisconfigured} {
		if _, err := r.Target(ctx, node); !errors.Is(err, want) {
			t.Errorf("Target(%s) = %v, want %v", node, err, want)
		}
	}
	ts, err := r.Targets(ctx)
	must(err)
	if len(ts) != 2 || ts[0].Node != "broken" || ts[0].InstanceID != "" || ts[1].Node != "good" || ts[1].InstanceID != "rec" {
		t.Errorf("targets %+v", ts)
	}
	r.Warn(ctx, "good", "TLS verification off")
	evs, err := st.ListEvents(ctx, store.EventFilter{Kind: "bmc.tls_unverified"}, store.Page{})
	must(err)
	if len(evs) != 1 || evs[0].Message != "TLS verification off" {
		t.Errorf("warning events %+v", evs)
	}
}
