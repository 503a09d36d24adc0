package agent

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/modules"
	"github.com/tetherfleet/tether/pki"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A node with a signer anchor boots only modules an anchored signer signed,
// whatever its assignment says, and never switches into a refused root.
func TestRunSignerAnchor(t *testing.T) {
	anchoredPub, anchoredKey, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, otherKey, _ := ed25519.GenerateKey(rand.Reader)
	sign := func(pub ed25519.PublicKey, key ed25519.PrivateKey, m *tetherv1.Module, digest string) {
		m.Signatures = append(m.Signatures, &tetherv1.ModuleSignature{Signer: pki.SignerFingerprint(pub), PublicKey: pub,
			Signature: pki.SignModule(key, m.Name, m.Version, digest)})
	}
	tests := []struct {
		name   string
		adjust func(a *tetherv1.Assignment)
		reason string // empty: boots
	}{
		{"signed by the anchored key", func(a *tetherv1.Assignment) {
			sign(anchoredPub, anchoredKey, a.RootModules[0], a.RootModules[0].Digest)
		}, ""},
		{"unsigned, and the assignment requires nothing", func(*tetherv1.Assignment) {}, "unsigned"},
		{"signed by a key that is not anchored", func(a *tetherv1.Assignment) {
			sign(otherPub, otherKey, a.RootModules[0], a.RootModules[0].Digest)
		}, "signed only by " + pki.SignerFingerprint(otherPub)},
		{"a valid signature over another digest", func(a *tetherv1.Assignment) {
			sign(anchoredPub, anchoredKey, a.RootModules[0], "sha256:"+strings.Repeat("0", 64))
		}, "does not verify"},
		{"the assignment names only its own signer", func(a *tetherv1.Assignment) {
			sign(otherPub, otherKey, a.RootModules[0], a.RootModules[0].Digest)
			a.RequireSignedModules, a.SigningKeys, a.RequiredSigners = true, [][]byte{otherPub}, []string{pki.SignerFingerprint(otherPub)}
		}, "node signer anchor"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cp := newControlPlane(t)
			asg := cp.assign(t, 1, 0)
			cp.Lock()
			tt.adjust(asg)
			cp.Unlock()
			line := filepath.Join(t.TempDir(), "cmdline")
			if err := os.WriteFile(line, []byte("console=ttyS0 tether.signers="+pki.SignerFingerprint(anchoredPub)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			root := &fakeRoot{switched: make(chan struct{}), release: make(chan struct{})}
			none := filepath.Join(t.TempDir(), "none")
			r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)},
				RootMode: RootModeSwitch, Root: root, RootTarget: "/newroot",
				Anchor: identity.AnchorSources{CmdlinePath: line, FwCfgDir: none, KeysDir: none}})
			// After start's clean-up is registered, so it runs first: the
			// fake switch returns only once released.
			t.Cleanup(func() { close(root.release) })
			if tt.reason == "" {
				<-root.switched
				return
			}
			err := r.wait(t)
			var ref *modules.SignatureRefused
			if !errors.As(err, &ref) || ref.Module != "root-0:1" || !strings.Contains(ref.Reason, tt.reason) {
				t.Fatalf("Run = %v, want root-0:1 refused: %s", err, tt.reason)
			}
			select {
			case <-root.switched:
				t.Fatal("the agent switched into a refused root")
			default:
			}
			if out := r.console.String(); !strings.Contains(out, "REFUSED: module.signature_refused: module root-0:1 refused") {
				t.Fatalf("console does not name the refusal:\n%s", out)
			}
			cp.stream(t).waitFor(t, "a heartbeat carrying the refusal", func(m *tetherv1.AgentMessage) bool {
				return strings.HasPrefix(m.GetHeartbeat().GetError(), "module.signature_refused: module root-0:1 refused")
			})
		})
	}
}
