package instances

import (
	"strings"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/providers"
)

// Artifacts are the netboot kernel and initramfs. Both live in the blob
// store, content addressed: the defaults are ingested at start-up, and a
// template's kernel_digest / initramfs_digest names another stored blob.
type Artifacts struct {
	Blobs *modules.Blobs
	// Kernel and Initramfs are the default digests ("" when tetherd was
	// started without --kernel / --initramfs).
	Kernel, Initramfs string
	// BaseURL is where the netboot server serves blobs ("" when it does
	// not run); artifact URLs are BaseURL/artifacts/<digest>.
	BaseURL string
}

// Digests returns the kernel and initramfs digests a template boots.
func (a *Artifacts) Digests(tpl *store.Template) (kernel, initramfs string, err error) {
	if a == nil {
		return "", "", fail.Precondition("no netboot artifacts are configured: start tetherd with --kernel and --initramfs")
	}
	kernel, initramfs = a.Kernel, a.Initramfs
	if tpl != nil && tpl.KernelDigest != "" {
		kernel = tpl.KernelDigest
	}
	if tpl != nil && tpl.InitramfsDigest != "" {
		initramfs = tpl.InitramfsDigest
	}
	for _, d := range []struct{ what, flag, digest string }{{"kernel", "--kernel", kernel}, {"initramfs", "--initramfs", initramfs}} {
		if d.digest == "" {
			return "", "", fail.Precondition("no %s to boot: start tetherd with %s or set the template's %s_digest", d.what, d.flag, d.what)
		}
		if !a.Blobs.Has(d.digest) {
			return "", "", fail.Precondition("%s %s is not in the blob store (start tetherd once with %s pointing at it)", d.what, d.digest, d.flag)
		}
	}
	return kernel, initramfs, nil
}

// IsArtifact reports whether digest is a default artifact or one a
// template names; only those are served without authentication.
func (a *Artifacts) IsArtifact(digest string, templates []*store.Template) bool {
	if a == nil || digest == "" {
		return false
	}
	if digest == a.Kernel || digest == a.Initramfs {
		return true
	}
	for _, t := range templates {
		if digest == t.KernelDigest || digest == t.InitramfsDigest {
			return true
		}
	}
	return false
}

// URL is where the netboot server serves a blob, "" when it does not run.
func (a *Artifacts) URL(digest string) string {
	if a == nil || a.BaseURL == "" {
		return ""
	}
	return a.BaseURL + "/artifacts/" + digest
}

// Boot returns what a machine of tpl boots, without enrollment data.
func (a *Artifacts) Boot(tpl *store.Template) (providers.Boot, error) {
	k, i, err := a.Digests(tpl)
	if err != nil {
		return providers.Boot{}, err
	}
	kp, err := a.Blobs.Path(k)
	if err != nil {
		return providers.Boot{}, fail.Precondition("kernel: %v", err)
	}
	ip, err := a.Blobs.Path(i)
	if err != nil {
		return providers.Boot{}, fail.Precondition("initramfs: %v", err)
	}
	b := providers.Boot{KernelPath: kp, InitramfsPath: ip, KernelURL: a.URL(k), InitramfsURL: a.URL(i)}
	if tpl != nil {
		// The console first: a console= in the template's own arguments
		// comes later and so becomes /dev/console.
		b.KernelArgs = strings.TrimSpace(tpl.ConsoleArg() + " " + tpl.KernelArgs)
		// The template's required signers become the booted node's
		// own anchor: delivered with the boot, not by the assignment.
		b.Signers = tpl.RequiredSigners
	}
	return b, nil
}
