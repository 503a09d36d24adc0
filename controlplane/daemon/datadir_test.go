package daemon

import (
	"path/filepath"
	"testing"
)

// A relative data dir is made absolute: blob paths go to QEMU, which runs
// in another directory.
func TestServeMakesDataDirAbsolute(t *testing.T) {
	o := ServeOptions{DataDir: "rel/data"}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(o.DataDir) {
		t.Fatalf("data dir %q is still relative", o.DataDir)
	}
}
