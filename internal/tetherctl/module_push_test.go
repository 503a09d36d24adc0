package tetherctl_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
)

// A push of bytes already there under the name uploads nothing; a push of
// other bytes under it is refused before any upload. The audit trail
// counts the PushModule calls that reached tetherd.
func TestModulePushChecksTheNameFirst(t *testing.T) {
	cp := testcp.Start(t)
	base := []string{"--config", filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig), "--endpoint", cp.Addr}
	dir := t.TempDir()
	img, other := filepath.Join(dir, "a.erofs"), filepath.Join(dir, "b.erofs")
	if err := os.WriteFile(img, testcp.TinyErofs(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, testcp.BuildErofs(fstest.MapFS{"other": {Data: []byte("other bytes")}}), 0o644); err != nil {
		t.Fatal(err)
	}
	pushes := func(t *testing.T) int {
		t.Helper()
		out, errOut, code := run(t, append(base, "audit")...)
		if code != 0 {
			t.Fatalf("audit: exit %d\n%s", code, errOut)
		}
		return strings.Count(out, "PushModule")
	}

	for _, tc := range []struct {
		name      string
		file      string
		wantCode  bool // a non-zero exit
		wantErr   string
		wantCalls int
	}{
		{"first push uploads", img, false, "", 1},
		{"same bytes again upload nothing", img, false, "already there with this digest; nothing to upload", 1},
		{"other bytes are refused up front", other, true, "already exists with digest", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, append(base, "module", "push", "base:1", tc.file)...)
			if (code != 0) != tc.wantCode || !strings.Contains(errOut, tc.wantErr) {
				t.Fatalf("exit %d, stderr %q; want failure %v and %q\n%s", code, errOut, tc.wantCode, tc.wantErr, out)
			}
			if !tc.wantCode && !strings.Contains(out, "base") {
				t.Fatalf("push printed no module:\n%s", out)
			}
			if got := pushes(t); got != tc.wantCalls {
				t.Fatalf("%d PushModule calls reached tetherd; want %d", got, tc.wantCalls)
			}
		})
	}
}
