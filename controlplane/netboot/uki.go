package netboot

import (
	"context"
	"debug/pe"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/measuredboot"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/uki"
)

// UKIBootPath is where a machine fetches the unified kernel image of its
// node's template, by hardware address. The DHCP responder hands it to
// UEFI HTTP Boot clients, and the iPXE boot route chains to it.
func UKIBootPath(mac string) string { return "/uki/boot?mac=" + mac }

// UKI is a signed unified kernel image a template boots (tetherd --uki,
// ADR 0035): one PE file holding the kernel, Tether's initramfs and the
// command line that pins the control plane. It holds no secret: what
// differs per boot reaches the node outside it (fw_cfg, or the hand-off).
type UKI struct {
	Template string
	// Digest is the file's sha256:HEX, its name in the blob store.
	Digest string
	Size   int64
	// Signed reports an Authenticode signature (a certificate table);
	// an unsigned image is served all the same, and Secure Boot
	// firmware refuses it.
	Signed bool
	// Cmdline is the image's .cmdline section.
	Cmdline string
	// PEHash is the Authenticode SHA-256 firmware measures into PCR 4
	// when it runs the image: what the measured-boot policy expects.
	PEHash []byte
}

// UKIs are the images by template name.
type UKIs map[string]UKI

var validTemplateName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// LoadUKIs checks each TEMPLATE=FILE of --uki and stores the file in the
// blob store. A file that is not a UKI, or whose command line carries a
// token, is refused: the image is public, served to every booting machine
// of the template.
func LoadUKIs(blobs *modules.Blobs, specs []string) (UKIs, error) {
	out := UKIs{}
	for _, s := range specs {
		tpl, file, ok := strings.Cut(s, "=")
		if !ok || file == "" {
			return nil, fmt.Errorf("--uki %q: want TEMPLATE=FILE", s)
		}
		if !validTemplateName.MatchString(tpl) {
			return nil, fmt.Errorf("--uki %q: %q is not a template name", s, tpl)
		}
		if _, dup := out[tpl]; dup {
			return nil, fmt.Errorf("--uki: template %s is given two images", tpl)
		}
		img, err := inspectUKI(file)
		if err != nil {
			return nil, fmt.Errorf("--uki %s: %w", s, err)
		}
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("--uki %s: %w", s, err)
		}
		img.Digest, img.Size, err = blobs.Ingest(f, false)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("--uki %s: store it: %w", s, err)
		}
		img.Template = tpl
		out[tpl] = img
	}
	return out, nil
}

// inspectUKI reads what the image says about itself.
func inspectUKI(file string) (UKI, error) {
	f, err := pe.Open(file)
	if err != nil {
		return UKI{}, fmt.Errorf("not a PE image (build one with tetherctl bootimage build): %w", err)
	}
	var img UKI
	if h, ok := f.OptionalHeader.(*pe.OptionalHeader64); ok && len(h.DataDirectory) > pe.IMAGE_DIRECTORY_ENTRY_SECURITY {
		img.Signed = h.DataDirectory[pe.IMAGE_DIRECTORY_ENTRY_SECURITY].Size > 0
	}
	f.Close()
	for _, name := range []string{".linux", ".initrd"} {
		if _, err := uki.Section(file, name); err != nil {
			return UKI{}, fmt.Errorf("not a unified kernel image: %w", err)
		}
	}
	c, err := uki.Section(file, ".cmdline")
	if err != nil {
		return UKI{}, fmt.Errorf("not a unified kernel image: %w", err)
	}
	img.Cmdline = strings.TrimRight(string(c), "\x00\n")
	if img.PEHash, err = uki.PEHash(file); err != nil {
		return UKI{}, err
	}
	if strings.Contains(img.Cmdline, "tether.token=") {
		return UKI{}, errors.New("its command line carries a tether.token: a token is a per-boot secret and must not be in a public image")
	}
	if i := strings.IndexAny(img.Cmdline, ipxeUnsafe); i >= 0 {
		return UKI{}, fmt.Errorf("its command line holds %q at byte %d, which an iPXE script expands or splits on: iPXE machines could not be chained to it", img.Cmdline[i], i)
	}
	if strings.Contains(img.Cmdline, "tether.instance=") {
		return UKI{}, errors.New("its command line names an instance: the image is the template's, and the instance comes per boot (tetherctl bootimage build --handoff)")
	}
	return img, nil
}

// Policy is the measured-boot policy of the images: an attested node of a
// template with one must have booted it with Secure Boot on (nil: no
// template has an image).
func (u UKIs) Policy(st store.Store) *measuredboot.Policy {
	if len(u) == 0 {
		return nil
	}
	p := &measuredboot.Policy{Store: st, Images: map[string]measuredboot.Image{}}
	for name, img := range u {
		p.Images[name] = measuredboot.Image{Template: name, Digest: img.Digest, PEHash: img.PEHash}
	}
	return p
}

// Reason codes of NetbootMachineRefused that only the UKI route gives.
const (
	refusedNoUKI = "template_boots_no_uki"
	refusedRange = "range_request"
)

// ukiFor is the image of the template of the instance's node.
func (s *Server) ukiFor(ctx context.Context, instanceID store.InstanceID) (UKI, *bootRefusal, error) {
	in, err := s.Store.GetInstance(ctx, instanceID)
	if err != nil {
		return UKI{}, nil, fmt.Errorf("read instance %s: %w", instanceID, err)
	}
	node, err := s.Store.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return UKI{}, nil, fmt.Errorf("read node of instance %s: %w", instanceID, err)
	}
	tpl, err := s.Store.GetTemplateByID(ctx, node.TemplateID)
	if err != nil {
		return UKI{}, nil, fmt.Errorf("read template of node %s: %w", node.Name, err)
	}
	img, ok := s.UKIs[tpl.Name]
	if !ok {
		return UKI{}, &bootRefusal{refusedNoUKI, fmt.Sprintf("template %s boots no unified kernel image: its machines boot through iPXE", tpl.Name)}, nil
	}
	return img, nil, nil
}

// BootsUKI reports whether the machine with this hardware address is
// booting an instance whose template boots a UKI: the DHCP responder
// then points its UEFI HTTP Boot at the image instead of the iPXE loader.
func (s *Server) BootsUKI(ctx context.Context, mac string) (bool, error) {
	if len(s.UKIs) == 0 {
		return false, nil
	}
	id, _, ref, err := s.bootingInstance(ctx, mac)
	if err != nil || ref != nil {
		return false, err
	}
	_, ref, err = s.ukiFor(ctx, id)
	return err == nil && ref == nil, err
}

// ukiBoot serves the UKI of the machine's node's booting instance. It
// answers HEAD as GET without the body (OVMF asks the size first), and
// refuses Range: the image is served whole. A refusal is an HTTP status
// and a line of text (firmware shows the status), with one coalesced
// event per machine and reason, as on the iPXE boot route.
func (s *Server) ukiBoot(w http.ResponseWriter, r *http.Request) {
	if !s.allow(w, r) {
		return
	}
	mac, err := bootMAC(r)
	if err != nil {
		s.refuseUKI(w, r, "", bootRefusal{events.RefusedMalformed, err.Error()})
		return
	}
	if r.Header.Get("Range") != "" {
		s.refuseUKI(w, r, mac, bootRefusal{refusedRange, "Range requests are refused: the boot image is served whole"})
		return
	}
	id, _, ref, err := s.bootingInstance(r.Context(), mac)
	if err == nil && ref == nil {
		var img UKI
		img, ref, err = s.ukiFor(r.Context(), id)
		if err == nil && ref == nil {
			s.serveUKI(w, r, mac, id, img)
			return
		}
	}
	if err != nil {
		s.Log.Error("netboot uki route", "mac", mac, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	s.refuseUKI(w, r, mac, *ref)
}

func (s *Server) serveUKI(w http.ResponseWriter, r *http.Request, mac string, id store.InstanceID, img UKI) {
	f, err := s.Instances.Artifacts.Blobs.Open(img.Digest)
	if err != nil {
		s.Log.Error("netboot uki: the image is missing from the blob store", "template", img.Template, "digest", img.Digest, "err", err)
		http.Error(w, "the boot image is missing from the blob store", http.StatusServiceUnavailable)
		return
	}
	defer f.Close()
	if r.Method == http.MethodGet {
		// HEAD is how OVMF learns the size before its GET: one event per
		// download, not two.
		now := s.Clock.Now()
		err := s.Store.Tx(r.Context(), func(q store.Queries) error {
			_, err := events.E{Kind: events.NetbootUKIServed, InstanceID: id,
				Message: fmt.Sprintf("unified kernel image %s of template %s served to %s (%s)", img.Digest, img.Template, mac, r.RemoteAddr),
				Payload: events.UKIServedPayload{Digest: img.Digest, MAC: mac, Remote: r.RemoteAddr, Signed: img.Signed, Template: img.Template}}.Write(r.Context(), q, now)
			return err
		})
		if err != nil {
			s.Log.Error("netboot uki: record the download", "instance", id, "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		s.Log.Info("netboot uki served", "instance", id, "mac", mac, "remote", r.RemoteAddr, "digest", img.Digest)
	}
	w.Header().Set("Content-Type", "application/efi")
	w.Header().Set("Cache-Control", "no-store")
	// No modification time and no Range (refused above): a plain 200 with
	// the length, which is all UEFI HTTP Boot needs.
	http.ServeContent(w, r, "", time.Time{}, f)
}

// refuseUKI answers a refused UKI request with a status and the reason.
func (s *Server) refuseUKI(w http.ResponseWriter, r *http.Request, mac string, ref bootRefusal) {
	s.recordMachineRefusal(r, mac, ref)
	code := http.StatusConflict
	switch ref.code {
	case events.RefusedMalformed:
		code = http.StatusBadRequest
	case events.RefusedUnknownMAC, refusedNoUKI:
		code = http.StatusNotFound
	case refusedRange:
		code = http.StatusRequestedRangeNotSatisfiable
	}
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, "Tether netboot refused: "+ref.msg, code)
}

// UKIHandoffPath is where the agent of a machine that booted a signed
// image fetches what differs per boot, by the hardware address it booted
// with: the image carries the control plane's URL and CA pin, and no
// secret.
func UKIHandoffPath(mac string) string { return "/uki/handoff?mac=" + mac }

// Handoff is the per-boot hand-off's body: the instance, and the one-time
// token unless the node attests with its TPM (ADR 0023), one key=value a
// line, the names of the fw_cfg entries.
func Handoff(instanceID, token string) string {
	b := "instance=" + instanceID + "\n"
	if token != "" {
		b += "token=" + token + "\n"
	}
	return b
}

// ukiHandoff serves the machine's per-boot hand-off, once per boot, as
// the iPXE route serves a script: only to a machine whose template boots
// a signed image (others get theirs in the script), refused with 410 and
// a high-severity event when fetched twice in one boot.
func (s *Server) ukiHandoff(w http.ResponseWriter, r *http.Request) {
	if !s.allow(w, r) {
		return
	}
	mac, err := bootMAC(r)
	if err != nil {
		s.refuseUKI(w, r, "", bootRefusal{events.RefusedMalformed, err.Error()})
		return
	}
	if r.Method != http.MethodGet {
		// A HEAD would count as the boot's one fetch, with no body.
		s.refuseUKI(w, r, mac, bootRefusal{events.RefusedMalformed, "the hand-off is fetched with GET, once per boot"})
		return
	}
	id, _, ref, err := s.bootingInstance(r.Context(), mac)
	if err == nil && ref == nil {
		_, ref, err = s.ukiFor(r.Context(), id)
		if err == nil && ref == nil {
			s.serveScript(w, r, id, "", false, true)
			return
		}
	}
	if err != nil {
		s.Log.Error("netboot hand-off route", "mac", mac, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	s.refuseUKI(w, r, mac, *ref)
}

// ukiChain is the iPXE script that chains a machine to its UKI: the same
// image UEFI HTTP Boot loads, so an iPXE setup boots it too (iPXE for
// UEFI hands it to the firmware's loader, which checks its signature).
//
// The script passes the image's own command line. iPXE always gives the
// image load options (at least the image's name), and without Secure
// Boot systemd's stub takes load options in place of its .cmdline: the
// kernel booted with no console, no tether.url and no CA. Under Secure
// Boot the stub ignores them and the signed .cmdline holds.
func ukiChain(base, mac, cmdline string) string {
	return "#!ipxe\nchain " + base + UKIBootPath(mac) + " " + cmdline + "\n"
}

// ipxeUnsafe are the characters an iPXE script line expands or splits on
// (settings, quoting, comments, command separators); a command line
// holding one cannot be passed through ukiChain as it is.
const ipxeUnsafe = "$\"'\\#|&;"
