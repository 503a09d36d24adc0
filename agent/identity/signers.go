package identity

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tetherfleet/tether/pki"
)

// The node's signer anchor: fingerprints of the module signers it trusts,
// learned outside the control plane. Unlike the enrollment fields, every
// place is read and the sets are joined: an anchor is never skipped
// because another source already said something.

// ParamSigners is the kernel command line parameter of the anchor.
const ParamSigners = "tether.signers"

// DefaultSignersDir holds signer public keys baked into the initramfs
// (`make initramfs SIGNERS=...`), one *.pub file each.
const DefaultSignersDir = "/etc/tether/signers"

// AnchorSources says where to look; empty fields take the defaults.
type AnchorSources struct {
	CmdlinePath string // default /proc/cmdline
	FwCfgDir    string // default /sys/firmware/qemu_fw_cfg/by_name/opt/tether
	KeysDir     string // default /etc/tether/signers
}

// Anchor is the set of trusted signer fingerprints and where each came from.
type Anchor struct {
	Signers []string
	From    []string
}

// DiscoverAnchor reads every anchor source. A malformed anchor is an error,
// never an empty one: a mangled anchor must not turn into "trust anything".
func DiscoverAnchor(s AnchorSources) (Anchor, error) {
	if s.CmdlinePath == "" {
		s.CmdlinePath = DefaultCmdlinePath
	}
	if s.FwCfgDir == "" {
		s.FwCfgDir = DefaultFwCfgDir
	}
	if s.KeysDir == "" {
		s.KeysDir = DefaultSignersDir
	}
	var a Anchor
	seen := map[string]bool{}
	add := func(fps []string, from string) {
		if len(fps) == 0 {
			return
		}
		a.From = append(a.From, fmt.Sprintf("%d from %s", len(fps), from))
		for _, fp := range fps {
			if !seen[fp] {
				seen[fp], a.Signers = true, append(a.Signers, fp)
			}
		}
	}
	c, err := ReadCmdline(s.CmdlinePath)
	if err != nil {
		return Anchor{}, err
	}
	add(c.Signers, "kernel command line")

	p := filepath.Join(s.FwCfgDir, "signers", "raw")
	v, ok, err := readValue(p)
	if err != nil {
		return Anchor{}, fmt.Errorf("cannot read %s: %w (check the VM's -fw_cfg name=opt/tether/signers option)", p, err)
	}
	if ok {
		fps, err := pki.ParseSignerList(v)
		if err != nil {
			return Anchor{}, fmt.Errorf("%s: %w", p, err)
		}
		add(fps, "QEMU fw_cfg")
	}

	keys, err := readKeyDir(s.KeysDir)
	if err != nil {
		return Anchor{}, err
	}
	add(keys, s.KeysDir)
	return a, nil
}

func readKeyDir(dir string) ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.pub"))
	if err != nil {
		return nil, fmt.Errorf("signer keys in %s: %w", dir, err)
	}
	sort.Strings(paths)
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("signer key %s: %w", p, err)
		}
		pub, err := pki.ParseSignerPublicKey(b)
		if err != nil {
			return nil, fmt.Errorf("signer key %s: %w", p, err)
		}
		out = append(out, pki.SignerFingerprint(pub))
	}
	return out, nil
}

// String is the console line: which signers, from where.
func (a Anchor) String() string {
	if len(a.Signers) == 0 {
		return "no signer anchor (modules are checked only as the template asks)"
	}
	return fmt.Sprintf("signer anchor %s (%s)", strings.Join(a.Signers, ","), strings.Join(a.From, ", "))
}
