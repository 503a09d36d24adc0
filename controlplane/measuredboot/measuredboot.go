// Package measuredboot checks, at a TPM-attested enrollment, that the node
// booted its template's signed unified kernel image with Secure Boot on
// (issue 29, item 4; ADR 0036). The firmware measures every EFI application
// it starts into PCR 4 (EV_EFI_BOOT_SERVICES_APPLICATION, whose digest is
// the image's Authenticode hash) and its Secure Boot configuration into
// PCR 7; the event log, replayed against PCRs the quote has already
// authenticated, says what those were. The expected digest is computed by
// tetherd from the image it serves (uki.PEHash), never asked of a node.
package measuredboot

import (
	"context"
	"crypto"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	gattest "github.com/google/go-attestation/attest"

	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki/attestation"
)

// Image is what a template's nodes must have booted.
type Image struct {
	Template string
	// Digest is the file's sha256:HEX, for messages.
	Digest string
	// PEHash is its Authenticode SHA-256, what PCR 4 shows.
	PEHash []byte
}

// Policy holds the templates' images.
type Policy struct {
	Store  store.Store
	Images map[string]Image // by template name
}

// Booted is what a node's replayed event log says it ran.
type Booted struct {
	// Applications are the Authenticode SHA-256 digests (hex) of the EFI
	// applications the firmware measured into PCR 4, in boot order.
	Applications []string
	SecureBoot   bool
	// SecureBootUnknown says why PCR 7 could not be read, if it could not.
	SecureBootUnknown string
}

// Refusal is a node that did not boot what its template requires.
type Refusal struct {
	Image  Image
	Booted Booted
	Reason string
}

func (r *Refusal) Error() string { return r.Reason }

// EFI event types (TCG PC Client Platform Firmware Profile).
const evEFIBootServicesApplication = 0x80000003

// Check requires the node of instanceID, if its template boots a signed
// image, to have booted that image with Secure Boot on. ev has passed
// attestation.VerifyEvidence: its PCRs are the quoted ones. A *Refusal
// says what the node booted instead; other errors are the store's.
func (p *Policy) Check(ctx context.Context, instanceID store.InstanceID, ev attestation.Evidence) error {
	if p == nil || len(p.Images) == 0 {
		return nil
	}
	in, err := p.Store.GetInstance(ctx, instanceID)
	if err != nil {
		return fmt.Errorf("measured boot: read instance %s: %w", instanceID, err)
	}
	node, err := p.Store.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return fmt.Errorf("measured boot: read node of instance %s: %w", instanceID, err)
	}
	tpl, err := p.Store.GetTemplateByID(ctx, node.TemplateID)
	if err != nil {
		return fmt.Errorf("measured boot: read template of node %s: %w", node.Name, err)
	}
	img, ok := p.Images[tpl.Name]
	if !ok {
		return nil
	}
	_, err = Verify(img, ev.EventLog, ev.PCRs)
	return err
}

// Verify replays the event log against the PCRs and requires img in PCR 4
// and Secure Boot enabled in PCR 7.
func Verify(img Image, eventLog []byte, pcrs []attestation.PCR) (Booted, error) {
	var b Booted
	refuse := func(format string, args ...any) (Booted, error) {
		return b, &Refusal{Image: img, Booted: b, Reason: fmt.Sprintf(format, args...)}
	}
	if len(eventLog) == 0 {
		return refuse("template %s requires its image %s, but the node sent no firmware event log (it booted no UEFI firmware that measures, e.g. straight into a kernel)", img.Template, img.Digest)
	}
	gp := make([]gattest.PCR, 0, len(pcrs))
	for _, p := range pcrs {
		gp = append(gp, gattest.PCR{Index: p.Index, Digest: p.Digest, DigestAlg: crypto.SHA256})
	}
	el, err := gattest.ParseEventLog(eventLog)
	if err != nil {
		return refuse("the node's event log does not parse: %v", err)
	}
	events, err := el.Verify(gp)
	if err != nil {
		return refuse("the node's event log does not replay to its quoted PCRs: %v", err)
	}
	want := hex.EncodeToString(img.PEHash)
	for _, e := range events {
		if e.Index == 4 && uint32(e.Type) == evEFIBootServicesApplication {
			b.Applications = append(b.Applications, hex.EncodeToString(e.Digest))
		}
	}
	sb, err := gattest.ParseSecurebootState(events)
	if err != nil {
		b.SecureBootUnknown = err.Error()
	} else {
		b.SecureBoot = sb.Enabled
	}
	if !slices.Contains(b.Applications, want) {
		booted := "no EFI application"
		if len(b.Applications) > 0 {
			booted = "EFI applications " + strings.Join(b.Applications, ", ")
		}
		return refuse("template %s requires its image %s (Authenticode sha256:%s), but the node's firmware ran %s", img.Template, img.Digest, want, booted)
	}
	switch {
	case b.SecureBootUnknown != "":
		return refuse("the node booted template %s's image, but its Secure Boot state cannot be read from PCR 7: %s", img.Template, b.SecureBootUnknown)
	case !b.SecureBoot:
		return refuse("the node booted template %s's image with Secure Boot off", img.Template)
	}
	return b, nil
}

// IsRefusal reports whether err is a policy refusal (not a store error).
func IsRefusal(err error) bool {
	var r *Refusal
	return errors.As(err, &r)
}
