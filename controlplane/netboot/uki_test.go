package netboot_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/uki"
)

// ukiTools skips loudly without objcopy, sbsign or systemd's stub.
func ukiTools(t *testing.T) uki.Tools {
	t.Helper()
	tl, err := uki.FindTools(true)
	if err == nil {
		_, err = os.Stat(uki.DefaultStub)
	}
	if err != nil {
		msg := "SKIPPING " + t.Name() + ": " + err.Error() + " (apt-get install binutils sbsigntool systemd-boot-efi)"
		os.Stderr.WriteString(msg + "\n")
		t.Skip(msg)
	}
	return tl
}

// buildUKI makes a small unsigned image with the given command line.
func buildUKI(t *testing.T, cmdline string) string {
	t.Helper()
	tl := ukiTools(t)
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	os.WriteFile(kernel, bytes.Repeat([]byte("K"), 4099), 0o644)
	os.WriteFile(initrd, bytes.Repeat([]byte("I"), 2049), 0o644)
	out := filepath.Join(dir, "node.efi")
	if err := uki.Build(context.Background(), tl, uki.Spec{Kernel: kernel, Initramfs: initrd, Cmdline: cmdline}, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// signUKI signs in with a throwaway key.
func signUKI(t *testing.T, in string) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test db"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k, c, out := filepath.Join(dir, "db.key"), filepath.Join(dir, "db.crt"), filepath.Join(dir, "signed.efi")
	os.WriteFile(k, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
	os.WriteFile(c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	if err := uki.Sign(context.Background(), ukiTools(t), uki.Signer{Key: k, Cert: c}, in, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func openBlobs(t *testing.T) *modules.Blobs {
	t.Helper()
	b, err := modules.OpenBlobs(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const ukiCmdline = "console=ttyS0 tether.url=https://10.0.2.2:7443 tether.ca=sha256:abab"

func TestLoadUKIs(t *testing.T) {
	unsigned := buildUKI(t, ukiCmdline)
	signed := signUKI(t, unsigned)
	blobs := openBlobs(t)
	got, err := netboot.LoadUKIs(blobs, []string{"tpl=" + signed, "other=" + unsigned})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := uki.Digest(signed)
	if img := got["tpl"]; img.Digest != want || !img.Signed || img.Cmdline != ukiCmdline || img.Template != "tpl" || !blobs.Has(want) {
		t.Fatalf("signed image: %+v, want digest %s, signed, its command line, in the blob store", img, want)
	}
	if got["other"].Signed {
		t.Fatal("an unsigned image reads signed")
	}
	// The measured-boot policy expects what the firmware will measure of
	// the file served.
	ph, err := uki.PEHash(signed)
	if err != nil {
		t.Fatal(err)
	}
	pol := got.Policy(nil)
	if !bytes.Equal(got["tpl"].PEHash, ph) || !bytes.Equal(pol.Images["tpl"].PEHash, ph) || pol.Images["tpl"].Digest != want || len(pol.Images) != 2 {
		t.Fatalf("PE hash %x, policy %+v; want %x for tpl", got["tpl"].PEHash, pol.Images, ph)
	}
	if netboot.UKIs(nil).Policy(nil) != nil {
		t.Fatal("no images, yet a policy")
	}

	notPE := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(notPE, []byte("not a PE file"), 0o644)
	withToken := buildUKI(t, ukiCmdline+" tether.token=tbt_x")
	withSetting := buildUKI(t, ukiCmdline+" tether.debug=${net0/mac}")
	for _, tc := range []struct {
		name  string
		specs []string
		want  string
	}{
		{"no file", []string{"tpl"}, "want TEMPLATE=FILE"},
		{"empty file", []string{"tpl="}, "want TEMPLATE=FILE"},
		{"bad template name", []string{"a/b=" + signed}, "not a template name"},
		{"twice", []string{"tpl=" + signed, "tpl=" + unsigned}, "two images"},
		{"missing", []string{"tpl=/nonexistent.efi"}, "no such file"},
		{"not PE", []string{"tpl=" + notPE}, "not a PE image"},
		{"bare stub", []string{"tpl=" + uki.DefaultStub}, "not a unified kernel image"},
		{"token in the image", []string{"tpl=" + withToken}, "tether.token"},
		{"an iPXE setting in the command line", []string{"tpl=" + withSetting}, "'$' at byte"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := netboot.LoadUKIs(openBlobs(t), tc.specs); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// withUKI gives the fixture's template "tpl" an image, and returns its bytes.
func (f *fixture) withUKI(t *testing.T, template string) []byte {
	t.Helper()
	file := buildUKI(t, ukiCmdline)
	imgs, err := netboot.LoadUKIs(f.svc.Artifacts.Blobs, []string{template + "=" + file})
	if err != nil {
		t.Fatal(err)
	}
	f.nb.UKIs = imgs
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fixture) do(t *testing.T, method, path string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func (f *fixture) count(t *testing.T, kind store.EventKind) int {
	t.Helper()
	evs, err := f.st.ListEvents(f.ctx, store.EventFilter{Kind: kind}, store.Page{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(evs)
}

// The machine's image is served whole to HEAD (headers only) and GET, one
// event per GET, and no token is issued: the image holds none.
func TestUKIRouteServesTheTemplatesImage(t *testing.T) {
	f := setup(t)
	img := f.withUKI(t, "tpl")
	f.bindMAC(t, mac)
	in := f.provision(t)
	if ok, err := f.nb.BootsUKI(f.ctx, mac); !ok || err != nil {
		t.Fatalf("BootsUKI = %v, %v", ok, err)
	}

	resp, body := f.do(t, http.MethodHead, netboot.UKIBootPath("52-54-00-12-34-56"), nil)
	if resp.StatusCode != http.StatusOK || len(body) != 0 || resp.ContentLength != int64(len(img)) || resp.Header.Get("Content-Type") != "application/efi" {
		t.Fatalf("HEAD: %d, %d body bytes, length %d (want %d), type %q", resp.StatusCode, len(body), resp.ContentLength, len(img), resp.Header.Get("Content-Type"))
	}
	if n := f.count(t, events.NetbootUKIServed); n != 0 {
		t.Fatalf("%d served events after a HEAD, want 0", n)
	}
	resp, body = f.do(t, http.MethodGet, netboot.UKIBootPath(mac), nil)
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, img) {
		t.Fatalf("GET: %d, %d bytes, want the image's %d", resp.StatusCode, len(body), len(img))
	}
	evs, err := f.st.ListEvents(f.ctx, store.EventFilter{Kind: events.NetbootUKIServed, InstanceID: in.ID}, store.Page{Limit: 10})
	if err != nil || len(evs) != 1 || !strings.Contains(string(evs[0].Payload), f.nb.UKIs["tpl"].Digest) {
		t.Fatalf("served events %v %v, want one naming the digest", evs, err)
	}
	if f.tokens(t) != 0 {
		t.Fatal("serving the image issued a token")
	}

	// iPXE asking the boot route is chained to the same image, with no
	// token, passing the image's own command line (without Secure Boot
	// the stub takes iPXE's load options in place of its .cmdline).
	code, script := f.get(t, netboot.BootPath(mac))
	if code != http.StatusOK || script != "#!ipxe\nchain http://10.0.2.2:8080/uki/boot?mac="+mac+" "+ukiCmdline+"\n" {
		t.Fatalf("boot route for a UKI template: %d %q", code, script)
	}
	if f.tokens(t) != 0 {
		t.Fatal("the chain script issued a token")
	}
}

// Everything the route refuses gets a status that says why, no image
// bytes, and one netboot.refused event per machine and reason however
// often the firmware asks.
func TestUKIRouteRefusals(t *testing.T) {
	tests := []struct {
		name, query string
		hdr         map[string]string
		setup       func(t *testing.T, f *fixture)
		code        int
		reason      string
		msg         string
	}{
		{"unknown mac", "mac=52:54:00:99:99:99", nil, nil, http.StatusNotFound, events.RefusedUnknownMAC, "no node has hardware address"},
		{"no booting instance", "mac=" + mac, nil, func(t *testing.T, f *fixture) { f.bindMAC(t, mac) }, http.StatusConflict, events.RefusedNotBooting, "no instance that is booting"},
		{"template boots no image", "mac=" + mac, nil, func(t *testing.T, f *fixture) {
			f.withUKI(t, "another")
			f.bindMAC(t, mac)
			f.provision(t)
		}, http.StatusNotFound, "template_boots_no_uki", "template tpl boots no unified kernel image"},
		{"range", "mac=" + mac, map[string]string{"Range": "bytes=0-99"}, func(t *testing.T, f *fixture) {
			f.bindMAC(t, mac)
			f.provision(t)
		}, http.StatusRequestedRangeNotSatisfiable, "range_request", "served whole"},
		{"no mac", "", nil, nil, http.StatusBadRequest, events.RefusedMalformed, "exactly one mac"},
		{"two macs", "mac=" + mac + "&mac=" + mac, nil, nil, http.StatusBadRequest, events.RefusedMalformed, "exactly one mac"},
		{"other parameter", "mac=" + mac + "&x=1", nil, nil, http.StatusBadRequest, events.RefusedMalformed, "other than mac"},
		{"bad mac", "mac=52:54:00:12:34", nil, nil, http.StatusBadRequest, events.RefusedMalformed, "not a valid hardware address"},
	}
	for _, tc := range tests {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			t.Run(tc.name+"/"+method, func(t *testing.T) {
				f := setup(t)
				if tc.setup != nil {
					tc.setup(t, f)
				}
				if f.nb.UKIs == nil {
					f.withUKI(t, "tpl")
				}
				for range 3 {
					resp, body := f.do(t, method, "/uki/boot?"+tc.query, tc.hdr)
					if resp.StatusCode != tc.code || resp.Header.Get("Content-Type") == "application/efi" {
						t.Fatalf("%d %q (%s), want %d", resp.StatusCode, body, resp.Header.Get("Content-Type"), tc.code)
					}
					if method == http.MethodGet && !strings.Contains(string(body), tc.msg) {
						t.Fatalf("body %q, want %q", body, tc.msg)
					}
				}
				evs := f.machineRefusals(t)
				if len(evs) != 1 || !strings.Contains(string(evs[0].Payload), `"reason":"`+tc.reason+`"`) {
					t.Fatalf("refusal events %d (%v), want one with reason %s", len(evs), evs, tc.reason)
				}
				if n := f.count(t, events.NetbootUKIServed); n != 0 || f.tokens(t) != 0 {
					t.Fatalf("%d images and %d scripts served to a refused machine", n, f.tokens(t))
				}
			})
		}
	}
}

// Without images (no --uki), the DHCP responder is never told to point a
// machine at one, and the route refuses every request.
func TestNoUKIsConfigured(t *testing.T) {
	f := setup(t)
	f.bindMAC(t, mac)
	f.provision(t)
	if ok, err := f.nb.BootsUKI(f.ctx, mac); ok || err != nil {
		t.Fatalf("BootsUKI = %v, %v with no images", ok, err)
	}
	if code, _ := f.get(t, netboot.UKIBootPath(mac)); code != http.StatusNotFound {
		t.Fatalf("%d, want 404", code)
	}
	if code, body := f.get(t, netboot.BootPath(mac)); code != http.StatusOK || !strings.Contains(body, "tether.token=") {
		t.Fatalf("the iPXE route changed without images: %d %q", code, body)
	}
}

// The agent of a machine that booted its image fetches what differs per
// boot once: the instance and a token, or, for a node whose TPM is bound,
// the instance alone. A second fetch in the boot is refused like a
// script's, with a high-severity event.
func TestUKIHandoff(t *testing.T) {
	for _, tpm := range []bool{false, true} {
		t.Run(map[bool]string{false: "token", true: "tpm"}[tpm], func(t *testing.T) {
			f := setup(t)
			f.withUKI(t, "tpl")
			f.bindMAC(t, mac)
			if tpm {
				n, err := f.st.GetNode(f.ctx, "n")
				if err != nil {
					t.Fatal(err)
				}
				n.EKHashes = []string{"sha256:" + strings.Repeat("ef", 32)}
				if err := f.st.Tx(f.ctx, func(q store.Queries) error { return q.UpdateNode(f.ctx, n) }); err != nil {
					t.Fatal(err)
				}
			}
			in := f.provision(t)
			code, body := f.get(t, netboot.UKIHandoffPath(mac))
			lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
			if code != http.StatusOK || lines[0] != "instance="+in.ID.String() {
				t.Fatalf("%d %q", code, body)
			}
			if tpm && len(lines) != 1 {
				t.Fatalf("a TPM node's hand-off carries more than its instance: %q", body)
			}
			if !tpm && (len(lines) != 2 || !strings.HasPrefix(lines[1], "token=tbt_")) {
				t.Fatalf("hand-off without its token: %q", body)
			}
			code, body = f.get(t, netboot.UKIHandoffPath(mac))
			if code != http.StatusGone || strings.Contains(body, "token=") || !strings.Contains(body, "hand-off of instance "+in.ID.String()+" was already served") {
				t.Fatalf("second fetch: %d %q", code, body)
			}
			evs, _ := f.st.ListEvents(f.ctx, store.EventFilter{InstanceID: in.ID, Kind: events.NetbootRefused, MinSeverity: events.High}, store.Page{Limit: 10})
			if len(evs) != 1 {
				t.Fatalf("%d high-severity refusal events, want 1", len(evs))
			}
		})
	}
}

func TestUKIHandoffRefusals(t *testing.T) {
	tests := []struct {
		name, method, query string
		setup               func(t *testing.T, f *fixture)
		code                int
		reason              string
	}{
		{"unknown mac", http.MethodGet, "mac=52:54:00:99:99:99", nil, http.StatusNotFound, events.RefusedUnknownMAC},
		{"no booting instance", http.MethodGet, "mac=" + mac, func(t *testing.T, f *fixture) { f.bindMAC(t, mac) }, http.StatusConflict, events.RefusedNotBooting},
		// Its machine's token is in its iPXE script: never handed out here.
		{"template boots no image", http.MethodGet, "mac=" + mac, func(t *testing.T, f *fixture) {
			f.withUKI(t, "another")
			f.bindMAC(t, mac)
			f.provision(t)
		}, http.StatusNotFound, "template_boots_no_uki"},
		{"HEAD", http.MethodHead, "mac=" + mac, func(t *testing.T, f *fixture) {
			f.bindMAC(t, mac)
			f.provision(t)
		}, http.StatusBadRequest, events.RefusedMalformed},
		{"malformed", http.MethodGet, "mac=" + mac + "&token=x", nil, http.StatusBadRequest, events.RefusedMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t)
			if tc.setup != nil {
				tc.setup(t, f)
			}
			if f.nb.UKIs == nil {
				f.withUKI(t, "tpl")
			}
			for range 3 {
				if resp, body := f.do(t, tc.method, "/uki/handoff?"+tc.query, nil); resp.StatusCode != tc.code || strings.Contains(string(body), "token=") {
					t.Fatalf("%d %q, want %d", resp.StatusCode, body, tc.code)
				}
			}
			evs := f.machineRefusals(t)
			if len(evs) != 1 || !strings.Contains(string(evs[0].Payload), `"reason":"`+tc.reason+`"`) {
				t.Fatalf("refusal events %d (%v), want one with reason %s", len(evs), evs, tc.reason)
			}
			if f.tokens(t) != 0 {
				t.Fatal("a refused hand-off was served")
			}
		})
	}
}
