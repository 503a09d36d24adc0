package dashboard

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A revoked identity's dashboard stops receiving events: tetherd ends the
// event stream the dashboard holds for it, and the page hears why.
func TestRevocationEndsTheEventStream(t *testing.T) {
	cp := testcp.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := testcp.NewNodeKey(t)
	resp, err := cp.Admin.CreateIdentity(ctx, &v1.CreateIdentityRequest{Name: "pat", Role: "viewer", CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatal(err)
	}
	cert := key.Certificate(t, resp.CertificatePem)
	srv, err := New(Config{Client: v1.NewAdminServiceClient(cp.Dial(&cert)), Identity: "pat", Role: "viewer", Endpoint: cp.Addr})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+srv.Path("/sse/events"), nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("sse: %d", res.StatusCode)
	}
	lines := bufio.NewScanner(res.Body)
	lines.Scan() // ": open": the stream is up
	// An event arrives while the identity is good.
	cp.SeedFleet(ctx, "edge")
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "event: fleet") {
	}
	if _, err := cp.Admin.RevokeIdentity(ctx, &v1.RevokeIdentityRequest{Name: "pat"}); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	for lines.Scan() { // ends when the dashboard closes the stream
		rest.WriteString(lines.Text() + "\n")
	}
	if !strings.Contains(rest.String(), "event: error") || !strings.Contains(rest.String(), "revoked") {
		t.Fatalf("after the revoke the stream said:\n%s", rest.String())
	}
}
