package e2e

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

// A renewed server certificate is served without a restart once tetherd
// is told (SIGHUP), and connections made before it go on.
func TestServerCertificateReloadsWithoutARestart(t *testing.T) {
	reload := make(chan struct{}, 1)
	cp := testcp.Start(t, testcp.With(func(o *daemon.ServeOptions) { o.ReloadServerCert = reload; o.Loops.ServerCertCheck = time.Hour }))
	served := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", cp.Addr, cp.TLS(nil))
		if err != nil {
			t.Fatalf("TLS to tetherd: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Text(16)
	}
	before := served()
	if _, _, err := daemon.RenewServerCert(daemon.RenewServerCertOptions{DataDir: cp.DataDir}); err != nil {
		t.Fatal(err)
	}
	if got := served(); got != before {
		t.Fatalf("the new certificate (%s) was served before tetherd was told", got)
	}
	reload <- struct{}{}
	// The reload runs on tetherd's own goroutine: a bounded wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for served() == before {
		if time.Now().After(deadline) {
			t.Fatalf("still serving %s 10 s after the reload", before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The admin client, which verifies the certificate against the CA, still works.
	if _, err := cp.Admin.ListInstances(t.Context(), nil); err != nil {
		t.Fatalf("admin call after the reload: %v", err)
	}
}
