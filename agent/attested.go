package agent

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/tpm"
	"github.com/tetherfleet/tether/pki/attestation"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// AttesterCloser is a TPM the agent opened for one enrollment.
type AttesterCloser = enroll.AttesterCloser

// openTPM is the default Config.OpenTPM: the kernel's resource manager.
func openTPM() (AttesterCloser, error) {
	t, err := tpm.Open(tpm.DevicePath)
	if err != nil {
		return nil, err
	}
	return tpmAttester{t}, nil
}

// openTPM opens the TPM the configuration names, or the machine's.
func (a *agent) openTPM() (AttesterCloser, error) {
	if a.cfg.OpenTPM != nil {
		return a.cfg.OpenTPM()
	}
	return openTPM()
}

// tpmAttester fits agent/tpm to what enrollment needs.
type tpmAttester struct{ t *tpm.TPM }

func (a tpmAttester) Endorsement() ([]byte, []byte, error) {
	ek, err := a.t.EK()
	return ek.PublicDER, ek.CertificateDER, err
}

func (a tpmAttester) NewKey() (enroll.AttestationKey, error) {
	ak, err := a.t.NewAK()
	if err != nil {
		return nil, err
	}
	return ak, nil
}

func (a tpmAttester) Close() error { return a.t.Close() }

// enrollAttested proves the machine by its TPM on a boot that carries no
// token, only the instance it boots as (docs/adr/0023).
func (a *agent) enrollAttested(ctx context.Context, mgr *enroll.Manager, disc identity.Discovery) (*enroll.Identity, error) {
	t, err := a.openTPM()
	if errors.Is(err, tpm.ErrNoTPM) {
		return nil, fmt.Errorf("this boot carries no bootstrap token, only instance %s, and the machine has no TPM (%s) to prove it with: "+
			"boot it with a token (`tetherctl token create --instance %s`), or give it a TPM whose EK is bound to its node", disc.Instance, tpm.DevicePath, disc.Instance)
	}
	if err != nil {
		return nil, fmt.Errorf("open the TPM for an attested enrollment: %w", err)
	}
	defer t.Close()
	ek := "unknown EK"
	if pub, _, err := t.Endorsement(); err == nil {
		if h, err := attestation.EKHashDER(pub); err == nil {
			ek = "EK " + h
		}
	}
	a.setPhase(tetherv1.AgentPhase_AGENT_PHASE_ENROLLING)
	a.con.Printf("enrolling with %s as instance %s by TPM attestation (%s); no token", disc.URL, disc.Instance, ek)
	id, err := a.enrollOnce(ctx, mgr, "attested enrollment", func(c tetherv1.EnrollmentServiceClient) (*enroll.Identity, error) {
		return mgr.EnrollAttested(ctx, c, disc.Instance, t)
	})
	var pm *enroll.PinMismatchError
	switch {
	case err == nil:
		a.con.Printf("enrolled as instance %s by TPM attestation (certificate valid until %s)", id.InstanceID, stamp(id.Cert.NotAfter))
		return id, nil
	case errors.As(err, &pm):
		return nil, pm
	case status.Code(err) == codes.PermissionDenied, status.Code(err) == codes.FailedPrecondition:
		return nil, fmt.Errorf("the control plane refused this machine's TPM attestation (%s): %s", ek, status.Convert(err).Message())
	default:
		return nil, err
	}
}
