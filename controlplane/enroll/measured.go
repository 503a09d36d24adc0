package enroll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/measuredboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki/attestation"
)

// MeasuredBoot checks an attested node's boot against its template's
// policy (measuredboot.Policy): nil when it passes or the template has
// none, a *measuredboot.Refusal saying what the node booted otherwise.
type MeasuredBoot interface {
	Check(ctx context.Context, instanceID store.InstanceID, ev attestation.Evidence) error
}

// checkMeasured runs the measured-boot policy on verified evidence. A
// node that booted something else is refused with a high-severity event
// naming what it booted: it is running an image its template does not
// allow, or with Secure Boot off.
func (s *Service) checkMeasured(ctx context.Context, a *Attestation, ev attestation.Evidence, now time.Time) error {
	if s.MeasuredBoot == nil {
		return nil
	}
	err := s.MeasuredBoot.Check(ctx, a.InstanceID, ev)
	var ref *measuredboot.Refusal
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &ref):
		return fmt.Errorf("attested enrollment: %w", err)
	}
	s.note(ctx, "measured/"+a.InstanceID.String()+"/"+ref.Reason, now, refusal{kind: events.EnrollRefused, severity: events.High, instanceID: a.InstanceID,
		message: "attested enrollment refused by the measured-boot policy: " + ref.Reason},
		events.MeasuredBootRefusedPayload{Attested: true, Booted: ref.Booted.Applications, Count: 1, EK: a.EKHash, Expected: ref.Image.Digest,
			MeasuredBoot: true, SecureBoot: ref.Booted.SecureBoot, Template: ref.Image.Template})
	return fail.Denied("attested enrollment refused by the measured-boot policy: %s", ref.Reason)
}
