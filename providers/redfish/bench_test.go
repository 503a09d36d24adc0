package redfish_test

import (
	"context"
	"testing"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/redfish"
	"github.com/tetherfleet/tether/providers/redfish/redfishtest"
)

// BenchmarkRedfishCalls measures what the provider's Redfish exchanges
// cost against the test BMC on loopback with an in-memory machine (no
// boot): a provision (walk from the service root, PATCH the override,
// reset On, read PowerState) and a status. Each call opens its own TLS
// connection, as a call in tetherd does.
//
//	go test -tags nobadger,nobbolt,nomysql -run '^$' -bench RedfishCalls ./providers/redfish/
func BenchmarkRedfishCalls(b *testing.B) {
	for _, op := range []string{"provision", "status"} {
		b.Run(op, func(b *testing.B) {
			fm := redfishtest.NewFakeMachine(redfish.PowerOff)
			e := newEnvTB(b, fm)
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var err error
				if op == "provision" {
					fm.Set(redfish.PowerOff)
					_, err = e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Node: "n1"})
				} else {
					_, err = e.p.Status(ctx, "redfish:n1")
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
