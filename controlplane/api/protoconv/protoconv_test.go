package protoconv_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/api/protoconv"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TestRoundTrips: every named proto value converts to a domain value
// that converts back to it; UNSPECIFIED is the zero value both ways; a
// number the proto does not name is refused with an error naming it.
func TestRoundTrips(t *testing.T) {
	tests := []struct {
		enum   string
		values map[string]int32
		// trip converts proto number n to the domain and back.
		trip func(n int32) (domain string, back int32, err error)
	}{
		{"task status", v1.TaskStatus_value, func(n int32) (string, int32, error) {
			s, err := protoconv.TaskStatusFrom(v1.TaskStatus(n))
			return string(s), int32(protoconv.TaskStatus(s)), err
		}},
		{"task target", v1.TaskTarget_value, func(n int32) (string, int32, error) {
			s, err := protoconv.TaskTargetFrom(v1.TaskTarget(n))
			return string(s), int32(protoconv.TaskTarget(s)), err
		}},
		{"task kind", v1.TaskKind_value, func(n int32) (string, int32, error) {
			s, err := protoconv.TaskKindFrom(v1.TaskKind(n))
			return string(s), int32(protoconv.TaskKind(s)), err
		}},
		{"certificate kind", v1.CertificateKind_value, func(n int32) (string, int32, error) {
			s, err := protoconv.CertKindFrom(v1.CertificateKind(n))
			back := int32(protoconv.CertKind(s))
			if s == "" {
				back = 0 // CertKind reports an unset kind as a node's; UNSPECIFIED has no domain value
			}
			return string(s), back, err
		}},
		{"severity", v1.Severity_value, func(n int32) (string, int32, error) {
			s, err := protoconv.SeverityFrom(v1.Severity(n))
			if s == 0 {
				return "", int32(protoconv.Severity(s)), err
			}
			return s.String(), int32(protoconv.Severity(s)), err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.enum, func(t *testing.T) {
			for name, n := range tt.values {
				domain, back, err := tt.trip(n)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if back != n {
					t.Errorf("%s (%d) -> %q -> %d", name, n, domain, back)
				}
				if (n == 0) != (domain == "") {
					t.Errorf("%s (%d) -> %q: only UNSPECIFIED is the zero value", name, n, domain)
				}
				if n != 0 && !strings.EqualFold(name[len(name)-len(domain):], domain) {
					t.Errorf("%s -> %q: the stored name is the proto name's suffix", name, domain)
				}
			}
			_, _, err := tt.trip(99)
			if err == nil || !errors.Is(err, store.ErrUnknownValue) || !strings.Contains(err.Error(), "99") {
				t.Errorf("value 99: %v; want an ErrUnknownValue naming 99", err)
			}
		})
	}
}

// TestToProtoOfUnknownValues: a domain value the proto does not name is
// UNSPECIFIED (a certificate's, NODE, as the API always answered).
func TestToProtoOfUnknownValues(t *testing.T) {
	if got := protoconv.TaskKind("mystery"); got != v1.TaskKind_TASK_KIND_UNSPECIFIED {
		t.Errorf("TaskKind(mystery) = %v", got)
	}
	if got := protoconv.TaskStatus("done"); got != v1.TaskStatus_TASK_STATUS_UNSPECIFIED {
		t.Errorf("TaskStatus(done) = %v", got)
	}
	if got := protoconv.CertKind("instance"); got != v1.CertificateKind_CERTIFICATE_KIND_NODE {
		t.Errorf("CertKind(instance) = %v", got)
	}
}
