package external

import (
	"context"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/providers"
)

func TestProvision(t *testing.T) {
	p := New()
	m, err := p.Provision(context.Background(), providers.Spec{InstanceID: "i-1", Boot: providers.Boot{Enrollment: providers.Enrollment{Token: "secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "external:i-1" || m.InstanceID != "i-1" || m.State != providers.StateUnknown {
		t.Fatalf("provision = %+v", m)
	}
	if strings.Contains(m.Detail, "secret") {
		t.Fatal("token leaked into the machine detail")
	}
	if _, err := p.Provision(context.Background(), providers.Spec{}); providers.KindOf(err) != providers.KindPermanent {
		t.Fatalf("provision without id: %v", err)
	}
}

func TestOperations(t *testing.T) {
	ctx := context.Background()
	p := New()
	id := "external:i-1"
	tests := []struct {
		name string
		call func() error
		kind providers.Kind // "" means success
	}{
		{"start", func() error { _, err := p.Start(ctx, id, providers.Boot{}); return err }, providers.KindUnsupported},
		{"stop", func() error { _, err := p.Stop(ctx, id); return err }, providers.KindUnsupported},
		{"reboot", func() error { _, err := p.Reboot(ctx, id, providers.Boot{}); return err }, providers.KindUnsupported},
		{"list", func() error { _, err := p.List(ctx); return err }, providers.KindUnsupported},
		{"terminate", func() error { return p.Terminate(ctx, id) }, ""},
		{"terminate again", func() error { return p.Terminate(ctx, id) }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if tt.kind == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			if err == nil || providers.KindOf(err) != tt.kind {
				t.Fatalf("err = %v, want kind %s", err, tt.kind)
			}
			if !strings.Contains(err.Error(), "not managed by this control plane") {
				t.Fatalf("err = %q lacks the reason", err)
			}
		})
	}
}

func TestStatusIsUnknown(t *testing.T) {
	m, err := New().Status(context.Background(), "external:i-1")
	if err != nil || m.State != providers.StateUnknown || m.InstanceID != "i-1" || m.ID != "external:i-1" {
		t.Fatalf("status = %+v, %v", m, err)
	}
}
