package identity

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func nic(name, mac string, up bool) net.Interface {
	hw, _ := net.ParseMAC(mac)
	ifi := net.Interface{Name: name, HardwareAddr: hw}
	if up {
		ifi.Flags = net.FlagUp
	}
	return ifi
}

func TestHandoffSource(t *testing.T) {
	const known = "52:54:00:12:34:56"
	tests := []struct {
		name    string
		status  int
		body    string
		nics    []net.Interface
		want    Fields
		absent  bool
		wantErr string
	}{
		{"token", 200, "instance=i-1\ntoken=" + testToken + "\n", []net.Interface{nic("eth0", known, true)}, Fields{Instance: "i-1", Token: testToken}, false, ""},
		{"tpm", 200, "instance=i-1\n", []net.Interface{nic("eth0", known, true)}, Fields{Instance: "i-1"}, false, ""},
		// The first NIC is not the one the machine booted from.
		{"second nic", 200, "instance=i-2\n", []net.Interface{{Name: "lo", Flags: net.FlagUp | net.FlagLoopback}, nic("eth0", "52:54:00:00:00:01", true), nic("eth1", known, true)}, Fields{Instance: "i-2"}, false, ""},
		{"no nic up", 200, "instance=i-1\n", []net.Interface{nic("eth0", known, false)}, Fields{}, false, "no network interface is up"},
		{"unknown everywhere", 200, "", []net.Interface{nic("eth0", "52:54:00:00:00:01", true)}, Fields{}, false, "knows none of this machine's addresses (eth0 52:54:00:00:00:01)"},
		{"already fetched", 410, "gone", []net.Interface{nic("eth0", known, true)}, Fields{}, false, "already fetched in this boot"},
		{"server error", 500, "internal error\x1b[2J", []net.Interface{nic("eth0", known, true)}, Fields{}, false, "500 Internal Server Error: internal error [2J"},
		{"unknown line", 200, "instance=i-1\nurl=https://evil:1\n", []net.Interface{nic("eth0", known, true)}, Fields{}, false, `unknown line "url"`},
		{"no instance", 200, "token=" + testToken + "\n", []net.Interface{nic("eth0", known, true)}, Fields{}, false, "names no instance"},
		{"bad token", 200, "instance=i-1\ntoken=hunter2\n", []net.Interface{nic("eth0", known, true)}, Fields{}, false, "hand-off token"},
		{"too large", 200, "instance=" + strings.Repeat("a", 5000), []net.Interface{nic("eth0", known, true)}, Fields{}, false, "larger than 4096"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var asked []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mac := r.URL.Query().Get("mac")
				asked = append(asked, r.Method+" "+r.URL.Path+" "+mac)
				if mac != known {
					http.Error(w, "no node has hardware address "+mac, http.StatusNotFound)
					return
				}
				w.WriteHeader(tc.status)
				w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			cmdline := filepath.Join(t.TempDir(), "cmdline")
			os.WriteFile(cmdline, []byte("console=ttyS0 tether.url="+testURL+" tether.ca="+testCA+" tether.handoff="+srv.URL+"/\n"), 0o644)
			src := HandoffSource{CmdlinePath: cmdline, Interfaces: func() ([]net.Interface, error) { return tc.nics, nil }}
			f, present, err := src.Lookup(context.Background())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !present || f.Fields != tc.want {
				t.Fatalf("%+v present %v err %v, want %+v", f.Fields, present, err, tc.want)
			}
			for _, a := range asked {
				if !strings.HasPrefix(a, "GET /uki/handoff ") {
					t.Errorf("asked %q", a)
				}
			}
		})
	}
}

// Without tether.handoff the source is absent and asks nobody; a bad one
// is the command line's error.
func TestHandoffSourceAbsent(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"none": "tether.url=" + testURL, "missing file": ""} {
		p := filepath.Join(dir, name)
		if content != "" {
			os.WriteFile(p, []byte(content), 0o644)
		}
		src := HandoffSource{CmdlinePath: p, Interfaces: func() ([]net.Interface, error) {
			t.Fatal("listed interfaces with no hand-off to ask")
			return nil, nil
		}}
		if _, present, err := src.Lookup(context.Background()); present || err != nil {
			t.Errorf("%s: present %v err %v", name, present, err)
		}
	}
	for _, bad := range []string{"https://x:1", "http://", "http://x:1/path", "http://x:1?mac=1", "http://u:p@x:1"} {
		if _, err := ParseTetherCmdline("tether.handoff=" + bad); err == nil || !strings.Contains(err.Error(), "want http://HOST:PORT") {
			t.Errorf("tether.handoff=%s: err %v", bad, err)
		}
	}
}
