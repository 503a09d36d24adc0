package api

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/certificates"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki/ca"
)

// New builds none of the services it delegates to: a composition root
// that forgets one hears which, instead of getting a quiet default.
func TestNewNamesWhatIsMissing(t *testing.T) {
	var someStore struct{ store.Store } // never called: New refuses first
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"nothing", Config{}, "Config.Store is required"},
		{"no catalog", Config{Store: someStore, CA: &ca.CA{}}, "Config.Catalog is required"},
		{"no certificates", Config{Store: someStore, CA: &ca.CA{}, Catalog: &catalog.Service{}}, "Config.Certificates is required"},
		{"no instances", Config{Store: someStore, CA: &ca.CA{}, Catalog: &catalog.Service{}, Certificates: &certificates.Service{}}, "Config.Instances is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) || s != nil {
				t.Fatalf("New = %v, %v; want an error saying %q", s, err, tt.want)
			}
		})
	}
}
