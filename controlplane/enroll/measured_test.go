package enroll_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/measuredboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/pki/attestation"
)

type failingPolicy struct{}

func (failingPolicy) Check(context.Context, store.InstanceID, attestation.Evidence) error {
	return errors.New("store down")
}

// A template with a signed image requires its attested nodes to show it
// in their event log: a node whose evidence does not (here, a TPM with no
// firmware before it, so no event log) is refused with a high-severity
// event saying what it booted, and no certificate. A template without an
// image enrolls as before; a policy that cannot decide issues nothing.
func TestMeasuredBootPolicyAtEnrollment(t *testing.T) {
	m := newTPMMachine(t)
	open := func(t *testing.T) store.Store {
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
		must(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}
	image := measuredboot.Image{Template: "web", Digest: "sha256:" + strings.Repeat("ab", 32), PEHash: make([]byte, 32)}
	tests := []struct {
		name   string
		policy func(st store.Store) enroll.MeasuredBoot
		code   codes.Code // OK: enrolls
		event  string
	}{
		{"template with an image", func(st store.Store) enroll.MeasuredBoot {
			return &measuredboot.Policy{Store: st, Images: map[string]measuredboot.Image{"web": image}}
		}, codes.PermissionDenied, "sent no firmware event log"},
		{"another template's image", func(st store.Store) enroll.MeasuredBoot {
			return &measuredboot.Policy{Store: st, Images: map[string]measuredboot.Image{"db": image}}
		}, codes.OK, ""},
		{"the policy cannot decide", func(store.Store) enroll.MeasuredBoot { return failingPolicy{} }, codes.Internal, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := newAttestEnv(t, open(t), []string{m.hash}, nil)
			e.svc.MeasuredBoot = tc.policy(e.st)
			a, c, ak, csr, err := m.begin(t, e.svc, e.inst.ID)
			must(t, err)
			s, ev := proof(t, a, c, ak, csr)
			_, err = e.svc.FinishAttested(ctx, a, s, ev)
			certs, lerr := e.st.ListCertificates(ctx, store.CertificateFilter{InstanceID: e.inst.ID}, store.Page{Limit: 10})
			must(t, lerr)
			if tc.code == codes.OK {
				if err != nil || len(certs) != 1 {
					t.Fatalf("err %v, %d certificates; want an enrollment", err, len(certs))
				}
				return
			}
			if err == nil || len(certs) != 0 {
				t.Fatalf("err %v, %d certificates; want a refusal and none", err, len(certs))
			}
			if tc.code == codes.PermissionDenied && status.Code(err) != codes.PermissionDenied {
				t.Fatalf("code %v (%v), want PermissionDenied", status.Code(err), err)
			}
			if tc.code == codes.Internal && fail.Code(err) != codes.Internal {
				t.Fatalf("a policy that could not decide: code %v (%v), want Internal, not a denial as if it had checked", fail.Code(err), err)
			}
			evs, lerr := e.st.ListEvents(ctx, store.EventFilter{Kind: events.EnrollRefused, InstanceID: e.inst.ID, MinSeverity: events.High}, store.Page{Limit: 10})
			must(t, lerr)
			if tc.event == "" {
				if len(evs) != 0 {
					t.Fatalf("%d high refusal events, want none", len(evs))
				}
				return
			}
			if len(evs) != 1 || !strings.Contains(evs[0].Message, tc.event) || !strings.Contains(string(evs[0].Payload), `"measured_boot":true`) ||
				!strings.Contains(string(evs[0].Payload), image.Digest) {
				t.Fatalf("events %+v, want one high refusal saying %q and naming the expected image", evs, tc.event)
			}
		})
	}
}
