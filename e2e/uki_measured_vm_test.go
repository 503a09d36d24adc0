package e2e

import (
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/uki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/qemu"
)

// TestUKIMeasuredBootEnrollment: with a TPM bound to the node, the image
// its template names boots under Secure Boot over UEFI HTTP Boot and
// enrolls by attestation, the event log showing that image in PCR 4 and
// Secure Boot on in PCR 7. Then someone on the provisioning network
// serves another image, properly signed but built from another
// initramfs: the firmware runs it, and the enrollment is refused by the
// measured-boot check with a high event naming what the node booted.
func TestUKIMeasuredBootEnrollment(t *testing.T) {
	swtpmtest.Require(t)
	u := prepareUKI(t, "127.0.0.1")

	// The path between the machines and tetherd's netboot port, which can
	// swap the image.
	var swap atomic.Bool
	var otherImage string
	target, _ := url.Parse("http://" + u.netLis.Addr().String())
	rp := httputil.NewSingleHostReverseProxy(target)
	mitm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if swap.Load() && r.URL.Path == "/uki/boot" {
			f, err := os.Open(otherImage)
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer f.Close()
			// OVMF tells an EFI image by this type (the URL has no .efi).
			w.Header().Set("Content-Type", "application/efi")
			http.ServeContent(w, r, "", time.Time{}, f)
			return
		}
		rp.ServeHTTP(w, r)
	})}
	go srv.Serve(mitm)
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(mitm.Addr().String())

	other := filepath.Join(t.TempDir(), "other-initramfs.cpio")
	b, err := os.ReadFile(u.a.initramfs)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel skips zero padding between archives: the same agent, a
	// different initramfs, a different image.
	if err := os.WriteFile(other, append(b, make([]byte, 4096)...), 0o644); err != nil {
		t.Fatal(err)
	}
	good := u.build(t, "good.efi", u.a.initramfs, port, true)
	otherImage = u.build(t, "other.efi", other, port, true)
	otherHash, err := uki.PEHash(otherImage)
	if err != nil {
		t.Fatal(err)
	}

	env := newVMEnv(t, testcp.WithDataDir(u.data), testcp.With(func(o *daemon.ServeOptions) {
		o.Listeners.GRPC, o.Test.NetbootListener, o.Listeners.NetbootURL = u.apiAddr, u.netLis, "http://10.0.2.2:"+port
		o.Providers.QEMU.Boot, o.Providers.QEMU.SecureBoot, o.Providers.QEMU.TPM = "uefi-http", true, true
		o.UKIs = []string{strings.ToLower(t.Name()) + "=" + good}
	}))
	ctx := vmCtx(t)
	ek, err := qemu.PrepareTPM(qemu.TPMDir(env.stateDir, env.node))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: env.node, UpdateMask: []string{"ek_hashes", "require_attestation"},
		EkHashes: []string{ek}, RequireAttestation: true}); err != nil {
		t.Fatal(err)
	}

	id := env.provision(t, ctx)
	env.waitRunning(t, ctx, id, nil)
	if got := env.events(t, ctx, "enroll.succeeded", id); len(got) != 1 || !strings.Contains(got[0].Message, "TPM attestation") {
		t.Fatalf("enroll.succeeded events %v, want one by attestation", got)
	}
	if c := env.console(ctx, id); !strings.Contains(c, "secureboot: Secure boot enabled") {
		t.Errorf("the node did not boot under Secure Boot:\n%s", tail(c, 3000))
	}
	if _, err := env.cp.Admin.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id}); err != nil {
		t.Fatal(err)
	}

	swap.Store(true)
	id2 := env.provision(t, ctx)
	deadline := time.Now().Add(bootTimeout)
	var refused *v1.FleetEvent
	for time.Now().Before(deadline) && refused == nil {
		for _, ev := range env.events(t, ctx, "enroll.refused", id2) {
			if ev.Payload.GetFields()["measured_boot"].GetBoolValue() {
				refused = ev
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	if refused == nil {
		t.Fatalf("no measured-boot refusal for a node that booted another image\nconsole:\n%s", tail(env.console(ctx, id2), 3000))
	}
	if !strings.Contains(refused.Message, hex.EncodeToString(otherHash)) || refused.Severity != v1.Severity_SEVERITY_HIGH {
		t.Errorf("refusal %q (severity %v), want a high one naming the image it booted (%x)", refused.Message, refused.Severity, otherHash)
	}
	if c := env.console(ctx, id2); !strings.Contains(c, "secureboot: Secure boot enabled") {
		t.Errorf("the other image did not boot under Secure Boot (the refusal must be the policy's, not the firmware's):\n%s", tail(c, 3000))
	}
	if certs := env.certs(t, ctx, id2); len(certs) != 0 {
		t.Errorf("the node that booted another image got %d certificates", len(certs))
	}
	t.Logf("refused: %s", refused.Message)
}
