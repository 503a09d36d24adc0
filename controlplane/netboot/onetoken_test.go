package netboot_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/netboot"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/pki"
)

// An instance holds one live token: a token handed out before (a
// provision printout, `token create`) ends when the boot's script issues
// the next, and only the newest enrolls.
func TestScriptTokenSupersedesEarlierTokens(t *testing.T) {
	f := setup(t)
	in := f.provision(t)
	printed, _, err := f.svc.IssueToken(f.ctx, in.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	code, body := f.get(t, netboot.ScriptPath(in.ID.String()))
	if code != http.StatusOK {
		t.Fatalf("%d %q", code, body)
	}
	i := strings.Index(body, "tether.token=")
	served := strings.Fields(body[i+len("tether.token="):])[0]
	if served == printed {
		t.Fatal("the script served the printed token")
	}
	_, err = f.st.ConsumeToken(f.ctx, pki.HashToken(printed), "", f.clk.Now())
	if !errors.Is(err, store.ErrTokenExpired) {
		t.Fatalf("the earlier token after the script's: %v, want it expired", err)
	}
	if _, err := f.st.ConsumeToken(f.ctx, pki.HashToken(served), "", f.clk.Now()); err != nil {
		t.Fatalf("the script's token: %v", err)
	}
}
