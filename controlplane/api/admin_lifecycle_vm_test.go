package api_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// TestQEMURealThroughTetherd boots a real VM through the API (provision,
// worker, qemu real mode) and reboots it: each boot must read its own
// fresh token from fw_cfg, and the token must be one the control plane
// issued for the instance. It skips loudly without qemu or the kernel.
func TestQEMURealThroughTetherd(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM")
	}
	qemutest.RequireQEMU(t)
	kernel := qemutest.FetchKernel(t)
	initrd := qemutest.TinyInitramfs(t, kernel)
	stateDir, err := os.MkdirTemp("", "tq") // QMP sockets need a short path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })

	logs := &logBuffer{}
	cp := lifecycleCP(t, logs, func(o *daemon.ServeOptions) {
		o.Providers.QEMU.Mode, o.Providers.QEMU.StateDir = "real", stateDir
		o.Kernel, o.Initramfs = kernel.Path, initrd
	})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fleet := cp.SeedFleet(ctx, "vm")
	resp, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: fleet.Node, Provider: "qemu"})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Instance.Id
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := cp.Admin.TerminateInstance(cctx, &v1.InstanceActionRequest{Id: id}); err != nil {
			t.Errorf("cleanup terminate: %v", err)
		}
		if t.Failed() {
			out, _ := readConsole(cctx, cp, &v1.GetInstanceConsoleRequest{Id: id})
			t.Logf("console:\n%s\nlog:\n%s", out, logs.String())
		}
	})
	in := waitInstance(t, cp, id, func(in *v1.Instance) bool { return in.CloudInstanceId != "" || in.ErrorMessage != "" })
	if in.Status != v1.InstanceStatus_INSTANCE_STATUS_PROVISIONING {
		t.Fatalf("provision: %v %q", in.Status, in.ErrorMessage)
	}
	console := func(n int) string {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for {
			out, _ := readConsole(ctx, cp, &v1.GetInstanceConsoleRequest{Id: id})
			var lines []string
			// Only whole lines: the console is read while the guest
			// writes it, and a digest cut mid-line names no token.
			if i := strings.LastIndexByte(out, '\n'); i >= 0 {
				out = out[:i+1]
			} else {
				out = ""
			}
			for _, l := range strings.Split(out, "\n") {
				if i := strings.Index(l, qemutest.TokenDigestPrefix); i >= 0 {
					lines = append(lines, strings.TrimSpace(l[i+len(qemutest.TokenDigestPrefix):]))
				}
			}
			if len(lines) >= n {
				return lines[n-1]
			}
			if time.Now().After(deadline) {
				t.Fatalf("boot %d printed no token digest:\n%s", n, out)
			}
			time.Sleep(200 * time.Millisecond) // polls a real VM's console log
		}
	}
	// The tiny init has no agent to report ready: the test says it for it.
	st, err := sqlite.Open(ctx, cp.DataDir+"/"+daemon.SQLiteFile)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ready := func() {
		t.Helper()
		if err := st.Tx(ctx, func(q store.Queries) error {
			in, err := q.LockInstance(ctx, store.InstanceID(id))
			if err != nil {
				return err
			}
			in.Status = lifecycle.Running
			return q.UpdateInstance(ctx, in)
		}); err != nil {
			t.Fatal(err)
		}
	}
	digests := []string{console(1)}
	ready()
	if _, err := cp.Admin.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}
	digests = append(digests, console(2))
	ready()
	if got, err := cp.Admin.StopInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_STOPPED {
		t.Fatalf("stop: %v %v", got, err)
	}
	if got, err := cp.Admin.StartInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_STARTING {
		t.Fatalf("start: %v %v", got, err)
	}
	digests = append(digests, console(3))
	// Each boot read its own token, and each is one the control plane
	// issued for this instance: the digest the guest printed is the
	// token's stored hash.
	seen := map[string]bool{}
	for i, h := range digests {
		if seen[h] {
			t.Fatalf("boot %d reused an earlier boot's token", i+1)
		}
		seen[h] = true
		tok, err := st.GetToken(ctx, h)
		if err != nil || tok.InstanceID.String() != id || tok.UsedAt != nil {
			t.Fatalf("boot %d read a token the control plane did not issue for it: %+v %v", i+1, tok, err)
		}
	}
	noTokenLogged(t, logs)
}
