package tetherctl_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

// `tetherctl ca`: list as a table and as JSON, prepare, a second prepare
// and an early retire refused with the state named, activate; the client
// config of the first CA keeps working after activate (its tetherd leaf is
// then signed by the new CA, chained to the old through the cross
// certificate).
func TestCACommands(t *testing.T) {
	cp := testcp.Start(t)
	base := []string{"--config", filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig), "--endpoint", cp.Addr}
	type ca struct {
		Fingerprint      string `json:"fingerprint"`
		State            string `json:"state"`
		NotAfter         string `json:"not_after"`
		LiveCertificates string `json:"live_certificates"`
	}
	list := func() []ca {
		t.Helper()
		out, errOut, code := run(t, append(base, "ca", "list", "-o", "json")...)
		if code != 0 {
			t.Fatalf("ca list: %s", errOut)
		}
		var l struct {
			Authorities []ca `json:"authorities"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("ca list -o json: %v\n%s", err, out)
		}
		return l.Authorities
	}
	first := list()
	if len(first) != 1 || first[0].State != "active" || first[0].Fingerprint != cp.Fingerprint() || first[0].NotAfter == "" || first[0].LiveCertificates != "1" {
		t.Fatalf("before a rotation: %+v (the init admin's certificate is live)", first)
	}
	out, errOut, code := run(t, append(base, "ca", "prepare")...)
	if code != 0 || !strings.Contains(out, "prepared") {
		t.Fatalf("ca prepare: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := run(t, append(base, "ca", "prepare")...); code == 0 || !strings.Contains(errOut, "failed precondition") || !strings.Contains(errOut, "already prepared") {
		t.Fatalf("a second prepare: exit %d %s", code, errOut)
	}
	if _, errOut, code := run(t, append(base, "ca", "retire", first[0].Fingerprint)...); code == 0 || !strings.Contains(errOut, "is active") {
		t.Fatalf("retiring the active CA: exit %d %s", code, errOut)
	}
	if out, errOut, code := run(t, append(base, "ca", "activate")...); code != 0 || !strings.Contains(out, "active") {
		t.Fatalf("ca activate: exit %d\n%s%s", code, out, errOut)
	}
	after := list()
	if len(after) != 2 || after[0].State != "old" || after[1].State != "active" {
		t.Fatalf("after activate: %+v", after)
	}
	out, errOut, code = run(t, append(base, "ca", "list")...)
	if code != 0 || !strings.Contains(out, "FINGERPRINT") || !strings.Contains(out, after[1].Fingerprint) {
		t.Fatalf("ca list: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := run(t, append(base, "ca", "retire", first[0].Fingerprint)...); code == 0 || !strings.Contains(errOut, "live certificates") {
		t.Fatalf("retiring the old CA with live certificates: exit %d %s", code, errOut)
	}
}
