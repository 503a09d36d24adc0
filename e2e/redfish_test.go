package e2e

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/redfish"
	"github.com/tetherfleet/tether/providers/redfish/redfishtest"
)

const bmcPassword = "bmc-Pa55-never-in-a-record"

// redfishEnv is a real tetherd (in-process) with a node whose BMC is a
// test BMC system driving m.
type redfishEnv struct {
	cp   *testcp.ControlPlane
	bmc  *redfishtest.BMC
	node string
}

func newRedfishEnv(t *testing.T, m redfishtest.Machine, mac string, opts ...testcp.Option) *redfishEnv {
	t.Helper()
	dir := t.TempDir()
	kernel, initramfs := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs")
	for _, f := range []string{kernel, initramfs} {
		// Never booted here: the fake machine fetches nothing.
		if err := os.WriteFile(f, []byte("placeholder "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opts = append([]testcp.Option{testcp.With(func(o *daemon.ServeOptions) {
		o.Providers.QEMU.Mode, o.Kernel, o.Initramfs, o.Listeners.Netboot = "disabled", kernel, initramfs, "127.0.0.1:0"
		o.Providers.Redfish.GracefulTimeout, o.Providers.Redfish.PowerTimeout, o.Providers.Redfish.RequestTimeout = 5*time.Second, 5*time.Second, 5*time.Second
	})}, opts...)
	cp := testcp.Start(t, opts...)
	return attachBMC(t, cp, m, mac, "bm-1", "tpl")
}

// attachBMC gives cp a credential, a template (if absent) and a node on
// a new test BMC's system 1.
func attachBMC(t *testing.T, cp *testcp.ControlPlane, m redfishtest.Machine, mac, node, tpl string) *redfishEnv {
	t.Helper()
	ctx := context.Background()
	b := redfishtest.New(t, redfishtest.Options{Username: "tether", Password: bmcPassword})
	b.AddSystem("1", m)
	if _, err := cp.Admin.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "rack", Username: "tether", Password: bmcPassword}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.GetTemplate(ctx, &v1.GetTemplateRequest{Name: tpl}); err != nil {
		cp.PushModule(ctx, "base", "1", testcp.TinyErofs())
		if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: tpl, RootModules: []*v1.ModuleRef{{Name: "base", Version: "1"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: node, Template: tpl, Macs: []string{mac},
		Bmc: &v1.NodeBMC{Address: b.Address("1"), Credential: "rack", CaPem: string(b.CAPEM()), BootMode: "legacy"}}); err != nil {
		t.Fatal(err)
	}
	return &redfishEnv{cp: cp, bmc: b, node: node}
}

func (e *redfishEnv) waitStatus(t *testing.T, ctx context.Context, id string, want ...v1.InstanceStatus) *v1.Instance {
	t.Helper()
	var last *v1.Instance
	for ctx.Err() == nil {
		in, err := e.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil {
			last = in
			for _, w := range want {
				if in.Status == w {
					return in
				}
			}
		}
		// Polling a real server's answers: there is no channel to wait on.
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("instance %s never reached %v; last %v", id, want, last)
	return nil
}

// noPasswordAnywhere reads every event, task and audit record and the
// instance, and fails if the BMC password is in any of them.
func (e *redfishEnv) noPasswordAnywhere(t *testing.T, ctx context.Context, id string) {
	t.Helper()
	var all strings.Builder
	evs, err := e.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := e.cp.Admin.ListTasks(ctx, &v1.ListTasksRequest{InstanceId: id, PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	au, err := e.cp.Admin.ListAudit(ctx, &v1.ListAuditRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	in, err := e.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := e.cp.Admin.ListNodes(ctx, &v1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][]byte{mustJSON(t, evs), mustJSON(t, ts), mustJSON(t, au), mustJSON(t, in), mustJSON(t, nodes)} {
		all.Write(b)
	}
	if strings.Contains(all.String(), bmcPassword) {
		t.Errorf("the BMC password is in an event, task, audit record, node or instance:\n%s", all.String())
	}
}

// lockedBuffer is a log sink tetherd's goroutines share.
type lockedBuffer = logbuf.Buffer

func mustJSON(t *testing.T, m interface{ ProtoReflect() protoreflect.Message }) []byte {
	t.Helper()
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRedfishWrongCredentials: a BMC that refuses the stored credentials
// errors the provision with a message naming the node, and the password
// appears nowhere.
func TestRedfishWrongCredentials(t *testing.T) {
	fm := redfishtest.NewFakeMachine(redfish.PowerOff)
	logs := &lockedBuffer{}
	env := newRedfishEnv(t, fm, "52:54:00:0e:3f:01", testcp.WithLog(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := env.cp.Admin.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "stale", Username: "tether", Password: "old-" + bmcPassword}); err != nil {
		t.Fatal(err)
	}
	cur, err := env.cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: env.node})
	if err != nil {
		t.Fatal(err)
	}
	cur.Bmc.Credential = "stale"
	if _, err := env.cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: env.node, UpdateMask: []string{"bmc"}, Bmc: cur.Bmc}); err != nil {
		t.Fatal(err)
	}
	resp, err := env.cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: env.node, Provider: redfish.Name})
	if err != nil {
		t.Fatal(err)
	}
	in := env.waitStatus(t, ctx, resp.Instance.Id, v1.InstanceStatus_INSTANCE_STATUS_ERROR)
	if !strings.Contains(in.ErrorMessage, "BMC credentials refused for node bm-1") {
		t.Errorf("error message %q does not say the BMC refused the credentials", in.ErrorMessage)
	}
	if st, _ := fm.PowerState(ctx); st != redfish.PowerOff {
		t.Errorf("the machine was powered on with refused credentials: %s", st)
	}
	env.noPasswordAnywhere(t, ctx, in.Id)
	if strings.Contains(logs.String(), bmcPassword) {
		t.Errorf("tetherd logged the BMC password:\n%s", logs.String())
	}
	// The errored instance terminates: there is no machine recorded.
	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: in.Id}); err != nil {
		t.Fatal(err)
	}
	env.waitStatus(t, ctx, in.Id, v1.InstanceStatus_INSTANCE_STATUS_TERMINATED)
}

// TestRedfishProvisionAndTerminateThroughTetherd: provisioning sets the
// one-time PXE override and powers the machine on, recording machine
// redfish:<node>; terminate powers it off and clears the override. An
// unverified BMC raises a warning event on every use.
func TestRedfishProvisionAndTerminateThroughTetherd(t *testing.T) {
	fm := redfishtest.NewFakeMachine(redfish.PowerOff)
	env := newRedfishEnv(t, fm, "52:54:00:0e:3f:02")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cur, err := env.cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: env.node})
	if err != nil {
		t.Fatal(err)
	}
	cur.Bmc.CaPem, cur.Bmc.InsecureSkipVerify = "", true
	if _, err := env.cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: env.node, UpdateMask: []string{"bmc"}, Bmc: cur.Bmc}); err != nil {
		t.Fatal(err)
	}
	resp, err := env.cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: env.node, Provider: redfish.Name})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Instance.Id
	// Booting: the machine is recorded and on; only an agent makes it running.
	for ctx.Err() == nil {
		in, err := env.cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
		if err == nil && in.CloudInstanceId != "" {
			if in.CloudInstanceId != "redfish:bm-1" {
				t.Fatalf("machine %q", in.CloudInstanceId)
			}
			break
		}
		if err == nil && in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR {
			t.Fatalf("provision failed: %s", in.ErrorMessage)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, _ := fm.PowerState(ctx); st != redfish.PowerOn {
		t.Errorf("machine %s after provision", st)
	}
	if got := env.bmc.Boots("1"); len(got) != 1 || got[0] != redfish.TargetPxe {
		t.Errorf("boots %q, want one from Pxe", got)
	}
	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	env.waitStatus(t, ctx, id, v1.InstanceStatus_INSTANCE_STATUS_TERMINATED)
	if st, _ := fm.PowerState(ctx); st != redfish.PowerOff {
		t.Errorf("machine %s after terminate", st)
	}
	if b := env.bmc.Boot("1"); b.BootSourceOverrideEnabled != redfish.OverrideDisabled {
		t.Errorf("override after terminate: %+v", b)
	}
	evs, err := env.cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "bmc.tls_unverified", PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Events) < 2 {
		t.Errorf("%d unverified-TLS warnings for a provision and a terminate; want one per use", len(evs.Events))
	}
	env.noPasswordAnywhere(t, ctx, id)
}

// TestRedfishPoolTakesFreeBareMetalNodes: a pool on the redfish provider
// lends the template's nodes that have a BMC and no live instance, one
// member each, and creates none; with every machine taken it stays short
// and says why. Its members' nodes survive the pool.
func TestRedfishPoolTakesFreeBareMetalNodes(t *testing.T) {
	m1, m2 := redfishtest.NewFakeMachine(redfish.PowerOff), redfishtest.NewFakeMachine(redfish.PowerOff)
	env := newRedfishEnv(t, m1, "52:54:00:0e:3f:11")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	env.bmc.AddSystem("2", m2)
	if _, err := env.cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "bm-2", Template: "tpl", Macs: []string{"52:54:00:0e:3f:12"},
		Bmc: &v1.NodeBMC{Address: env.bmc.Address("2"), Credential: "rack", CaPem: string(env.bmc.CAPEM())}}); err != nil {
		t.Fatal(err)
	}
	// A node of the template without a BMC is never lent.
	if _, err := env.cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "vm-1", Template: "tpl"}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: "metal", Template: "tpl", Provider: redfish.Name, TargetSize: 3,
		LifecycleClass: v1.LifecycleClass_LIFECYCLE_CLASS_EPHEMERAL}); err != nil {
		t.Fatal(err)
	}
	var members []*v1.PoolMember
	for ctx.Err() == nil {
		p, err := env.cp.Admin.GetPool(ctx, &v1.GetPoolRequest{Name: "metal"})
		if err != nil {
			t.Fatal(err)
		}
		members = p.Members
		on1, _ := m1.PowerState(ctx)
		on2, _ := m2.PowerState(ctx)
		if len(members) >= 2 && on1 == redfish.PowerOn && on2 == redfish.PowerOn {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(members) != 2 {
		t.Fatalf("members %v, want one on each bare-metal node", members)
	}
	got := []string{members[0].NodeName, members[1].NodeName}
	if !(got[0] == "bm-1" && got[1] == "bm-2" || got[0] == "bm-2" && got[1] == "bm-1") {
		t.Errorf("members on nodes %v, want bm-1 and bm-2", got)
	}
	nodes, err := env.cp.Admin.ListNodes(ctx, &v1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Nodes) != 3 {
		t.Errorf("the pool created nodes: %d, want the 3 the operator made", len(nodes.Nodes))
	}
	resp, err := env.cp.Admin.ReplenishPool(ctx, &v1.PoolActionRequest{Name: "metal"})
	if (err == nil && resp.Provisioned != 0) || (err != nil && !strings.Contains(err.Error(), "no free machine")) {
		t.Errorf("replenish with every machine lent: %v %v, want nothing provisioned and a reason saying there is no free machine", resp, err)
	}
	// Members still warming (no agent here) are terminated directly, the
	// pool paused first so that it does not lend the freed nodes again.
	if _, err := env.cp.Admin.PausePool(ctx, &v1.PoolActionRequest{Name: "metal"}); err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: m.InstanceId}); err != nil {
			t.Fatal(err)
		}
		env.waitStatus(t, ctx, m.InstanceId, v1.InstanceStatus_INSTANCE_STATUS_TERMINATED)
	}
	for ctx.Err() == nil {
		off1, _ := m1.PowerState(ctx)
		off2, _ := m2.PowerState(ctx)
		if off1 == redfish.PowerOff && off2 == redfish.PowerOff {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := env.cp.Admin.DeletePool(ctx, &v1.PoolActionRequest{Name: "metal"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"bm-1", "bm-2"} {
		if _, err := env.cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: n}); err != nil {
			t.Errorf("node %s did not outlive the pool: %v", n, err)
		}
	}
}

// TestCredentialsKeyForAnOldDataDir: init makes the sealing key; a data
// dir from before credentials gets one on its first serve, and a
// credential stored then opens after a restart on the same key.
func TestCredentialsKeyForAnOldDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := daemon.Init(daemon.InitOptions{DataDir: dir}); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "credentials.key")
	fi, err := os.Stat(key)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("init's key: %v %v", fi, err)
	}
	if err := os.Remove(key); err != nil { // as a data dir made before credentials
		t.Fatal(err)
	}
	cp := testcp.Start(t, testcp.WithDataDir(dir))
	if _, err := os.Stat(key); err != nil {
		t.Fatalf("serve did not make the key for an old data dir: %v", err)
	}
	ctx := context.Background()
	if _, err := cp.Admin.CreateCredential(ctx, &v1.CreateCredentialRequest{Name: "rack", Username: "u", Password: "p"}); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	cp.Stop()
	testcp.Start(t, testcp.WithDataDir(dir))
	after, err := os.ReadFile(key)
	if err != nil || string(after) != string(before) {
		t.Fatalf("the key changed across a restart (%v)", err)
	}
}
