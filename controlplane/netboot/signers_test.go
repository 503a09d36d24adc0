package netboot_test

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/controlplane/netboot"
)

// The script's kernel line carries the template's signers, and the agent
// reads them back as its anchor.
func TestScriptCarriesSignerAnchor(t *testing.T) {
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	script := netboot.Script("http://k", "http://i", netboot.WithSigners("quiet", []string{a, b}), "https://10.0.2.2:7443", "tbt_"+strings.Repeat("A", 43), "i-1", "sha256:"+strings.Repeat("c", 64))
	line := strings.Split(script, "\n")[1]
	c, err := identity.ParseTetherCmdline(strings.TrimPrefix(line, "kernel http://k "))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.Signers, ",") != a+","+b {
		t.Fatalf("anchor from the script = %v", c.Signers)
	}
	if got := netboot.WithSigners("quiet", nil); got != "quiet" {
		t.Fatalf("no signers changed the arguments: %q", got)
	}
}
