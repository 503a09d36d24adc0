package modulebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzStageTar feeds arbitrary tar streams, as layers with whiteouts, to
// the stager. Whatever they hold, nothing may appear outside the staging
// root: a canary folder beside it, and one that links inside the tree
// point at, stay empty.
func FuzzStageTar(f *testing.F) {
	seeds := [][]ent{
		{{name: "etc/", typ: tar.TypeDir}, {name: "etc/x", body: "x"}},
		{{name: "esc", typ: tar.TypeSymlink, link: "../canary"}, {name: "esc/pwned", body: "x"}},
		{{name: "abs", typ: tar.TypeSymlink, link: "/"}, {name: "abs/canary/pwned", body: "x"}},
		{{name: "up", typ: tar.TypeSymlink, link: "../../../.."}, {name: "up/x", body: "x"}},
		{{name: "a/b", body: "x"}, {name: "a/.wh.b"}, {name: "a/.wh..wh..opq"}, {name: "l", typ: tar.TypeLink, link: "a/b"}},
		{{name: "d", typ: tar.TypeSymlink, link: "."}, {name: "d/d/d/x", body: "x"}, {name: "h", typ: tar.TypeLink, link: "d/d/x"}},
		{{name: "../x", body: "x"}},
		{{name: "/x", body: "x"}},
		{{name: "fifo", typ: tar.TypeFifo}, {name: "fifo/x", body: "x"}},
		{{name: "a/x", body: "x"}, {name: "a/.wh.."}, {name: ".wh..."}},
	}
	for _, s := range seeds {
		f.Add(tarOf(f, s...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		root := filepath.Join(base, "root")
		canary := filepath.Join(base, "canary")
		for _, d := range []string{root, canary} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		st := &stager{ctx: context.Background(), root: root, maxBytes: 1 << 20}
		_ = st.apply(bytes.NewReader(data), true) // errors are fine; escapes are not
		ents, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 2 {
			t.Fatalf("staging wrote beside its root: %v", ents)
		}
		if c, _ := os.ReadDir(canary); len(c) != 0 {
			t.Fatalf("staging wrote into %s outside its root: %v", canary, c)
		}
	})
}
