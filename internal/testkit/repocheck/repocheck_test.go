package repocheck

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// j joins its parts. Planted examples are written in pieces so that this
// file does not itself contain what the repository-wide check refuses.
func j(parts ...string) string { return strings.Join(parts, "") }

func TestScanFindsOutsideReferences(t *testing.T) {
	files := map[string]bool{"docs/design.md": true, "docs/adr": true, "README.md": true}
	exists := func(p string) bool { return files[p] }
	tests := []struct {
		name, file, text string
		want             int // findings
	}{
		{"sibling folder", "README.md", j("The contract is `..", "/shared/S", "PEC.md`."), 4},
		{"sibling folder alone", "docs/benchmarks.md", j("(see ..", "/shared/no", "tes/performance-goals.md)"), 2},
		{"doubled slash", "a.go", j("// see ..", "//shared/x"), 1},
		{"spec document", "docs/adr/0002.md", j("ARCHITECTU", "RE.md asks for one query layer"), 1},
		{"spec section in a comment", "controlplane/pool/pool.go", j("// Package pool runs warm instance pools (SP", "EC 4)."), 1},
		{"spec section word", "x.go", j("// rule is one row of SP", "EC section 2's table."), 1},
		{"development machine path", "scripts/x.sh", j("cp x /wo", "rk/shared/no", "tes"), 2},
		{"issue scratch", "x.go", j("// as /tmp/i", "ss/10.md says"), 1},
		{"home directory", "x.md", j("built in /ho", "me/alice/src"), 1},
		{"tool folder", "x.md", j("see .lib", "rary/env"), 1},
		{"markdown link leaving the repository", "docs/benchmarks.md", j("[goals](../..", "/shared/no", "tes/goals.md)"), 3},
		{"markdown link to a missing file", "README.md", "[design](docs/desing.md)", 1},

		{"own design doc", "controlplane/pool/pool.go", "// Package pool runs warm instance pools (docs/design.md §4).", 0},
		{"markdown link inside", "docs/adr/0004.md", "see [the design](../design.md#4-pools) and [ADRs](../adr)", 0},
		{"markdown link from the root", "README.md", "[design](docs/design.md) [ADRs](docs/adr/)", 0},
		{"external link", "README.md", "[go](https://go.dev/doc/) [mail](mailto:a@b)", 0},
		{"anchor only", "docs/design.md", "see [§2](#2-instance-lifecycle)", 0},
		{"identifier", "providers/p.go", "spec providers.Spec // SPECIAL_CASE and FOO_SPEC are identifiers", 0},
		{"throwaway data dir", "docs/benchmarks.md", "bin/tetherd init --data-dir /tmp/tb", 0},
		{"url path", "x.md", "https://example.com/work/x and a/work/b", 0},
		{"shared as a word", "x.go", "// a shared filesystem for blobs", 0},
		{"binary file", "x.bin", j("\x00..", "/shared/S", "PEC.md"), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Scan(tc.file, []byte(tc.text), exists)
			if len(got) != tc.want {
				t.Fatalf("Scan(%q, %q) found %d, want %d: %v", tc.file, tc.text, len(got), tc.want, got)
			}
			for _, f := range got {
				if f.File != tc.file || f.Line != 1 || f.Match == "" || f.Why == "" {
					t.Errorf("finding %+v: want file %s, line 1, a match and a reason", f, tc.file)
				}
			}
		})
	}
}

func TestScanReportsTheLine(t *testing.T) {
	text := j("line one\nline two\n// third names SP", "EC 3.2\n")
	got := Scan("a.go", []byte(text), nil)
	if len(got) != 1 || got[0].Line != 3 {
		t.Fatalf("got %v, want one finding on line 3", got)
	}
	if s := got[0].String(); !strings.HasPrefix(s, "a.go:3: ") || !strings.Contains(s, "docs/design.md") {
		t.Errorf("String() = %q, want a.go:3: and a hint naming docs/design.md", s)
	}
}

func TestCitationsNameExistingSections(t *testing.T) {
	design := []byte("# Tether: design\n\n## 0. Principles\n\n**0.1 Say what happened.** text\n\n" +
		"## 2. Instance lifecycle\n\n### 2.2 Transitions\n\nsee §2.2 and §0.1\n")
	sections := Sections(design)
	for _, want := range []string{"0", "0.1", "2", "2.2"} {
		if !sections[want] {
			t.Errorf("Sections: missing %s in %v", want, sections)
		}
	}
	tests := []struct {
		name, file, text string
		want             int
	}{
		{"existing sections", "a.go", "// (docs/design.md §2.2 and §0.1)", 0},
		{"whole section", "a.go", "// drives instances (docs/design.md §2):", 0},
		{"missing subsection", "a.go", "// the hold (docs/design.md §2.5)", 1},
		{"one good, one missing", "a.go", j("// (docs/design.md §2.2 and §", "9.9)"), 1},
		{"link from a doc", "docs/adr/0004.md", "[design §3.5](../design.md#35-x)", 1},
		{"line without the document", "a.go", "// §7 of some other text", 0},
		{"inside the design", DesignDoc, "as §2.2 says, unlike §4", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Citations(tc.file, []byte(tc.text), sections); len(got) != tc.want {
				t.Errorf("Citations(%q) = %v, want %d findings", tc.text, got, tc.want)
			}
		})
	}
}

func TestLinkAnchors(t *testing.T) {
	docs := map[string][]byte{
		"docs/design.md": []byte("# Tether: design\n## 0. Principles\n### 2.6 Power operations go by what the provider observes\n" +
			"### 3.5 Renewal, and every boot needs an identity\n```\n# not a heading\n```\n## Notes\n## Notes\n"),
		"docs/architecture.md": []byte("## Store\n## `internal/` packages\n"),
	}
	anchorsOf := func(p string) (map[string]bool, bool) {
		b, ok := docs[p]
		if !ok {
			return nil, false
		}
		return Anchors(b), true
	}
	tests := []struct {
		name, file, text string
		want             int
	}{
		{"numbered heading", "docs/adr/0004.md", "[x](../design.md#26-power-operations-go-by-what-the-provider-observes)", 0},
		{"punctuation dropped", "docs/architecture.md", "[x](design.md#35-renewal-and-every-boot-needs-an-identity)", 0},
		{"code spans", "README.md", "[x](docs/architecture.md#internal-packages)", 0},
		{"repeated heading", "docs/architecture.md", "[x](design.md#notes-1)", 0},
		{"same file", "docs/architecture.md", "[x](#store)", 0},
		{"missing heading", "docs/adr/0004.md", "[x](../design.md#25-ops-hold)", 1},
		{"heading inside a code fence", "docs/architecture.md", "[x](design.md#not-a-heading)", 1},
		{"same file, missing", "docs/architecture.md", "[x](#stores)", 1},
		{"file not in the repository", "README.md", "[x](docs/other.md#x)", 0},
		{"not markdown", "README.md", "[x](Makefile#L3)", 0},
		{"not a markdown file", "a.go", "// [x](docs/design.md#nope)", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := LinkAnchors(tc.file, []byte(tc.text), anchorsOf); len(got) != tc.want {
				t.Errorf("LinkAnchors(%q) = %v, want %d findings", tc.text, got, tc.want)
			}
		})
	}
}

// repoFiles lists and reads what git tracks (and the untracked files it
// does not ignore), as paths relative to the repository root. tracked
// holds those paths and every folder above them.
func repoFiles(t *testing.T) (names []string, tracked map[string]bool, contents map[string][]byte) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("SKIP: git is not installed; the repository-wide checks need `git ls-files`")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("SKIP: not inside a git checkout (%v); the repository-wide checks need `git ls-files`", err)
	}
	root := strings.TrimSpace(string(top))
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	tracked, contents = map[string]bool{}, map[string][]byte{}
	for _, n := range bytes.Split(out, []byte{0}) {
		if len(n) == 0 {
			continue
		}
		name := string(n)
		b, err := os.ReadFile(filepath.Join(root, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		names = append(names, name)
		contents[name] = b
		tracked[name] = true
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			tracked[d] = true
		}
	}
	if len(names) == 0 {
		t.Fatal("git ls-files listed no files")
	}
	return names, tracked, contents
}

// TestRepositoryStandsAlone runs the checks on every file git tracks (and
// every untracked file git does not ignore, which is about to be): no path
// outside the repository, no broken Markdown link or anchor, and no
// citation of a docs/design.md section that does not exist.
func TestRepositoryStandsAlone(t *testing.T) {
	names, tracked, contents := repoFiles(t)
	exists := func(p string) bool { return tracked[p] }
	design, ok := contents[DesignDoc]
	if !ok {
		t.Fatalf("%s is missing: code comments cite its sections", DesignDoc)
	}
	sections := Sections(design)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(p string) (map[string]bool, bool) {
		b, ok := contents[p]
		if !ok {
			return nil, false
		}
		if anchors[p] == nil {
			anchors[p] = Anchors(b)
		}
		return anchors[p], true
	}
	var found []Finding
	for _, name := range names {
		b := contents[name]
		found = append(found, Scan(name, b, exists)...)
		found = append(found, Citations(name, b, sections)...)
		found = append(found, LinkAnchors(name, b, anchorsOf)...)
	}
	for _, f := range found {
		t.Error(f)
	}
	if len(found) > 0 {
		t.Logf("%d findings: a clone has only what git tracks, and docs/design.md is what code cites", len(found))
	}
}
