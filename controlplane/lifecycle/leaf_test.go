package lifecycle

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The store imports this package for its state types (docs/adr/0008), so
// lifecycle must stay a leaf: importing anything of this module from here
// would make a cycle or drag a higher layer under the store.
func TestLifecycleIsALeaf(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), e.Name(), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if strings.Contains(path, ".") {
				t.Errorf("%s imports %s: lifecycle may import only the standard library", e.Name(), path)
			}
		}
	}
}
