package netboot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/macaddr"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Adoption on first sight (docs/adr/0030). With Announce on, an unknown
// hardware address is booted into the agent in announce mode instead of
// being refused: the agent reads its TPM's endorsement key and POSTs it
// here with the address, and the announcement is recorded as a
// netboot.announced event that `tetherctl netboot seen` shows and
// `tetherctl node adopt` checks. Nobody authenticates here: an
// announcement is a hint for an admin, never a binding, and enrollment
// still proves the TPM by credential activation.

// AnnouncePath is the route an announcing agent POSTs to.
const AnnouncePath = "/netboot/announce"

// MaxAnnounceBytes bounds an announcement: an EK and its certificate of at
// most attestation.MaxEKBytes each, a hardware address, and framing.
const MaxAnnounceBytes = 2*attestation.MaxEKBytes + 256

// AnnounceContentType is the body's type: a v1.NetbootAnnounce.
const AnnounceContentType = "application/x-protobuf"

// AnnounceArgs are the kernel arguments of the announce boot before the
// ip=, BOOTIF= and tether.announce= ones: a machine with no template has
// no console setting of its own, and its console is where the agent
// prints the command that adopts it. The last console= (the serial port)
// is /dev/console; the screen shows the kernel's lines too.
const AnnounceArgs = "console=tty0 console=ttyS0,115200"

// serveAnnounceScript answers an unknown machine with a boot of the
// default kernel and initramfs whose agent announces the machine's TPM.
// It carries no secret: the announce URL and the boot interface. Without
// default artifacts the machine gets the refusal script.
func (s *Server) serveAnnounceScript(w http.ResponseWriter, r *http.Request, mac string, ref bootRefusal) {
	boot, err := s.Instances.Artifacts.Boot(nil)
	if err != nil || boot.KernelURL == "" {
		s.Log.Warn("netboot announce boot unavailable; refusing instead", "mac", mac, "err", err)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = io.WriteString(w, RefusalScript(ref.msg))
		return
	}
	base := s.Instances.Artifacts.BaseURL
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, AnnounceScript(boot.KernelURL, boot.InitramfsURL, AnnounceArgs, base+AnnouncePath, mac))
}

// AnnounceScript boots the agent in announce mode for the machine mac.
func AnnounceScript(kernelURL, initramfsURL, kernelArgs, announceURL, mac string) string {
	args := strings.Join(strings.Fields(kernelArgs), " ")
	cmdline := "initrd=initramfs"
	if args != "" {
		cmdline += " " + args
	}
	cmdline += " ip=dhcp BOOTIF=" + macaddr.BootIF(mac) + " tether.announce=" + announceURL
	return "#!ipxe\n" +
		"echo Tether: " + ipxeText("no node has hardware address "+mac+"; booting to announce this machine's TPM for adoption") + "\n" +
		"kernel " + kernelURL + " " + cmdline + "\n" +
		"initrd --name initramfs " + initramfsURL + "\n" +
		"boot\n"
}

// announce takes one machine's announcement and answers what the machine
// should do: wait to be adopted, wait for a boot, or reboot into its boot.
func (s *Server) announce(w http.ResponseWriter, r *http.Request) {
	if !s.Announce {
		http.Error(w, "announcements are off on this control plane (tetherd serve --netboot-announce)", http.StatusNotFound)
		return
	}
	if !s.allow(w, r) {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxAnnounceBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		s.refuseAnnounce(w, r, "", http.StatusRequestEntityTooLarge, fmt.Sprintf("an announcement is at most %d bytes", MaxAnnounceBytes))
		return
	case err != nil:
		s.refuseAnnounce(w, r, "", http.StatusBadRequest, "the announcement could not be read")
		return
	}
	var a v1.NetbootAnnounce
	if err := proto.Unmarshal(body, &a); err != nil {
		s.refuseAnnounce(w, r, "", http.StatusBadRequest, "the announcement is not a tether.v1.NetbootAnnounce")
		return
	}
	mac, err := macaddr.Normalize(a.Mac)
	if err != nil {
		s.refuseAnnounce(w, r, "", http.StatusBadRequest, "mac: not a valid hardware address")
		return
	}
	var ek string
	var issuer string
	switch {
	case len(a.EkPublic) > 0:
		if ek, err = attestation.EKHashDER(a.EkPublic); err != nil {
			s.refuseAnnounce(w, r, mac, http.StatusBadRequest, "ek_public: "+err.Error())
			return
		}
		if len(a.EkCertificate) > 0 {
			cert, err := attestation.CheckEKCertificate(a.EkPublic, a.EkCertificate)
			if err != nil {
				s.refuseAnnounce(w, r, mac, http.StatusBadRequest, "ek_certificate: "+err.Error())
				return
			}
			issuer = cut(cert.Issuer.String(), 200)
		}
	case len(a.EkCertificate) > 0:
		s.refuseAnnounce(w, r, mac, http.StatusBadRequest, "ek_certificate without ek_public")
		return
	}

	_, node, ref, err := s.bootingInstance(r.Context(), mac)
	var reply v1.NetbootAnnounceReply
	switch {
	case err != nil:
		s.Log.Error("netboot announce", "mac", mac, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	case ref == nil:
		reply = v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_BOOT, Node: node,
			Message: "node " + node + " has an instance booting: reboot to fetch its boot script"}
	case ref.code != events.RefusedUnknownMAC:
		reply = v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_ADOPTED, Node: node,
			Message: "adopted as node " + node + "; " + ref.msg + ": waiting for one (tetherctl instance provision --node " + node + " --provider external)"}
	case ek == "":
		reply = v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_ANNOUNCED,
			Message: "no node has hardware address " + mac + " and this machine sent no TPM endorsement key: adopt it by address (tetherctl node create NAME --template T --mac " + mac + ")"}
	default:
		s.recordAnnounce(r, mac, ek, issuer, len(a.EkCertificate) > 0)
		reply = v1.NetbootAnnounceReply{State: v1.NetbootAnnounceReply_STATE_ANNOUNCED, EkHash: ek,
			Message: "announced: an admin adopts this machine with `tetherctl node adopt " + mac + " --ek " + ek + " --template T`"}
	}
	out, err := proto.Marshal(&reply)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", AnnounceContentType)
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(out)
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// refuseAnnounce answers a bad announcement with the reason and records
// it as a coalesced netboot.refused event (reason malformed_announce).
func (s *Server) refuseAnnounce(w http.ResponseWriter, r *http.Request, mac string, code int, msg string) {
	s.recordMachineRefusal(r, mac, bootRefusal{events.RefusedMalformedAnnounce, msg})
	http.Error(w, "announcement refused: "+msg, code)
}

// recordAnnounce writes the netboot.announced event of one machine's EK,
// coalesced as refusals are: one per address and EK per window, at most
// perSourceMachines per sender and allSourcesMachines over every sender
// in a window, the rest counted in one summary. A sender that makes up
// addresses or keys fills no more of `netboot seen` than one that makes
// up addresses for the boot route.
func (s *Server) recordAnnounce(r *http.Request, mac, ek, issuer string, cert bool) {
	src := throttle.SourceKey(r.RemoteAddr)
	now := s.Clock.Now()
	if !s.announced.note(mac+"|"+ek, src, now) {
		s.Log.Debug("netboot announcement not recorded again", "mac", mac, "ek", ek, "remote", r.RemoteAddr)
		return
	}
	s.Log.Info("netboot announcement", "mac", mac, "ek", ek, "remote", r.RemoteAddr)
	ctx := context.WithoutCancel(r.Context())
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		_, err := events.E{Kind: events.NetbootAnnounced, Severity: events.Medium, CorrelationID: events.AnnounceCorrelation(mac),
			Message: fmt.Sprintf("unknown machine %s (%s) announced TPM endorsement key %s; adopt it with: tetherctl node adopt %s --ek %s --template T",
				mac, r.RemoteAddr, ek, mac, ek),
			Payload: events.AnnouncedPayload{EK: ek, EKCertificate: cert, EKCertificateIssuer: issuer, MAC: mac, Remote: r.RemoteAddr}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		s.Log.Warn("netboot: record announcement", "mac", mac, "err", err)
	}
}

// flushAnnouncements writes one event per sender (or for every sender
// together) whose window held announcements back.
func (s *Server) flushAnnouncements(ctx context.Context, now time.Time, final bool) {
	s.flushSummaries(ctx, now, s.announced.flush(now, final), events.NetbootAnnounced, "netboot announcements coalesced",
		func(sum sourceSummary) string {
			if sum.allSources {
				return fmt.Sprintf("%d more netboot announcements from many sources between %s and %s were counted, not recorded (past %d in a window over all sources)",
					sum.count, stamp(sum.first), stamp(sum.last), allSourcesMachines)
			}
			return fmt.Sprintf("%d more netboot announcements from %s between %s and %s were counted, not recorded (past %d distinct machines and keys from one address in a window)",
				sum.count, sum.source, stamp(sum.first), stamp(sum.last), perSourceMachines)
		})
}
