package identity

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzFwCfgSource lays out fuzzed fw_cfg entries and checks discovery: no
// panic; a value it accepts passes the same field checks the other sources
// use; and no error ever echoes the token, which is a secret until spent.
func FuzzFwCfgSource(f *testing.F) {
	f.Add(testURL, testToken, testCA)
	f.Add("", testToken, "")
	f.Add("http://x", "tbt_short", "sha1:abc")
	f.Add(testURL+"\n\x00", testToken+" \r\n", testCA+"\t")
	f.Add("", "", "")
	f.Add(strings.Repeat("u", maxValueBytes+1), "", "")
	f.Fuzz(func(t *testing.T, url, token, ca string) {
		dir := filepath.Join(t.TempDir(), "opt", "tether")
		for name, v := range map[string]string{"url": url, "token": token, "ca": ca} {
			if v == "" {
				continue // an absent entry, the usual partial case
			}
			if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name, "raw"), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		found, present, err := FwCfgSource{Dir: dir}.Lookup(context.Background())
		if err != nil {
			if secret := trimValue([]byte(token)); len(secret) >= 8 && strings.Contains(err.Error(), secret) {
				t.Fatalf("the error echoes the token: %v", err)
			}
			return
		}
		if !present {
			t.Fatalf("an existing fw_cfg directory was reported absent")
		}
		if _, err := found.Fields.check(func(field string) string { return field }); err != nil {
			t.Fatalf("accepted fields fail their own check: %v (%s)", err, found.Fields)
		}
		if strings.Contains(found.Fields.String(), found.Fields.Token) && found.Fields.Token != "" {
			t.Fatalf("Fields.String prints the token")
		}
	})
}
