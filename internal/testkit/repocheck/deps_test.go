package repocheck

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckImports(t *testing.T) {
	m := func(rel string) string { return Module + "/" + rel }
	tests := []struct {
		name, pkg string
		imports   []string
		want      int
	}{
		{"agent imports a service", "agent/session", []string{m("controlplane/tasks")}, 1},
		{"agent imports proto and pki", "agent/enroll", []string{m("proto/tether/v1"), m("pki"), "crypto/ed25519"}, 0},
		{"provider imports the store", "providers/qemu", []string{m("controlplane/store")}, 1},
		{"provider imports its interface", "providers/qemu", []string{m("providers")}, 0},
		{"store contract imports a service", "controlplane/store", []string{m("controlplane/events")}, 1},
		{"lifecycle imports anything of Tether's", "controlplane/lifecycle", []string{m("internal/clock")}, 1},
		{"backend imports the SQL layer", "controlplane/store/sqlite", []string{m("controlplane/store"), m("controlplane/store/sqlstore")}, 0},
		{"backend imports a service", "controlplane/store/postgres", []string{m("controlplane/events")}, 1},
		{"service imports the API", "controlplane/pool", []string{m("controlplane/api")}, 1},
		{"daemon imports the API", "controlplane/daemon", []string{m("controlplane/api")}, 0},
		{"service imports the daemon", "controlplane/api", []string{m("controlplane/daemon")}, 1},
		{"service builds the services", "controlplane/pool", []string{m("controlplane/daemon/wire")}, 1},
		{"daemon builds the services", "controlplane/daemon", []string{m("controlplane/daemon/wire")}, 0},
		{"the wiring imports the API", "controlplane/daemon/wire", []string{m("controlplane/api")}, 1},
		{"the wiring imports the daemon", "controlplane/daemon/wire", []string{m("controlplane/daemon")}, 1},
		{"the wiring picks a backend", "controlplane/daemon/wire", []string{m("controlplane/store/sqlite")}, 1},
		{"service picks a backend", "controlplane/instances", []string{m("controlplane/store/sqlite")}, 1},
		{"daemon picks a backend", "controlplane/daemon", []string{m("controlplane/store/sqlite"), m("controlplane/store/postgres")}, 0},
		{"service imports the SQL layer", "controlplane/pool", []string{m("controlplane/store/sqlstore")}, 1},
		{"CLI imports a service", "internal/tetherctl", []string{m("controlplane/instances")}, 1},
		{"anything imports a main", "internal/tools/bench", []string{m("cmd/tetherd")}, 1},
		{"a service imports a test harness", "controlplane/pool", []string{m("internal/testkit/testcp")}, 1},
		{"the CLI imports a test harness", "internal/tetherctl", []string{m("internal/testkit/logbuf")}, 1},
		{"a tool imports a test harness", "internal/tools/bench", []string{m("internal/testkit/testcp")}, 1},
		{"tether-bench imports a test harness", "cmd/tether-bench", []string{m("internal/testkit/pgtest")}, 1},
		{"a test harness imports another", "internal/testkit/pgtest", []string{m("internal/testkit/logbuf")}, 0},
		{"the e2e suite imports a test harness", "e2e", []string{m("internal/testkit/testcp")}, 0},
		{"tetherd imports the tooling", "cmd/tetherd", []string{m("internal/tools/bench")}, 1},
		{"a service imports the tooling", "controlplane/api", []string{m("internal/tools/tinymodule")}, 1},
		{"tether-bench imports the tooling", "cmd/tether-bench", []string{m("internal/tools/chaos"), m("internal/tools/plot")}, 0},
		{"a test harness imports the tooling", "internal/testkit/testcp", []string{m("internal/tools/tinymodule")}, 0},
		{"two rules at once", "agent", []string{m("controlplane/api"), m("cmd/tetherctl")}, 2},
		{"outside the module", "github.com/other/x", []string{m("controlplane/api")}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckImports("f.go", m(tc.pkg), tc.imports, DepRules)
			if len(got) != tc.want {
				t.Fatalf("CheckImports(%s, %v) = %v, want %d findings", tc.pkg, tc.imports, got, tc.want)
			}
			for _, f := range got {
				if !strings.Contains(f.Why, "docs/architecture.md") {
					t.Errorf("finding %v does not point at docs/architecture.md", f)
				}
			}
		})
	}
}

func TestTestHelper(t *testing.T) {
	for pkg, want := range map[string]bool{
		Module + "/internal/testkit/instancestest": true,
		Module + "/internal/testkit/pgtest":        true,
		Module + "/internal/testkit/testcp":        true,
		Module + "/controlplane/store/storetest":   true,
		Module + "/controlplane/instances":         false,
		Module + "/internal/tools/bench":           false,
		Module + "/internal/testkit":               true,
	} {
		if got := TestHelper(pkg); got != want {
			t.Errorf("TestHelper(%s) = %v, want %v", pkg, got, want)
		}
	}
}

func TestFileImports(t *testing.T) {
	src := "package x\n\nimport (\n\t\"fmt\"\n\tv1 \"" + Module + "/proto/tether/v1\"\n)\n\nfunc f() { fmt.Println(v1.File_tether_v1_types_proto) }\n"
	got, err := FileImports("x.go", []byte(src))
	if err != nil || len(got) != 2 || got[0] != "fmt" || got[1] != Module+"/proto/tether/v1" {
		t.Fatalf("FileImports = %v, %v; want fmt and the proto package", got, err)
	}
	if _, err := FileImports("bad.go", []byte("package x\nimport (")); err == nil {
		t.Error("FileImports of a broken file: want an error")
	}
}

// TestDependencyDirection checks every non-test Go file against DepRules.
func TestDependencyDirection(t *testing.T) {
	names, _, contents := repoFiles(t)
	checked := 0
	for _, name := range names {
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || strings.Contains(name, "/testdata/") {
			continue
		}
		imports, err := FileImports(name, contents[name])
		if err != nil {
			t.Error(err)
			continue
		}
		pkg := Module
		if d := path.Dir(name); d != "." {
			pkg += "/" + d
		}
		if TestHelper(pkg) {
			continue
		}
		for _, f := range CheckImports(name, pkg, imports, DepRules) {
			t.Error(f)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no Go files checked")
	}
}

func TestTestCode(t *testing.T) {
	m := func(rel string) string { return Module + "/" + rel }
	got := TestCode([]string{"fmt", "testing", "testing/fstest", m("internal/testkit/testcp"), m("internal/tools/pgserver"), m("controlplane/store/storetest")})
	want := []string{"testing", m("internal/testkit/testcp"), m("controlplane/store/storetest")}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("TestCode = %v, want %v", got, want)
	}
}

// Nothing shipped links testing code: every main under cmd/ is built with
// the tags the Makefile uses and its dependencies listed.
func TestShippedBinariesLinkNoTestCode(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("SKIPPING: the go tool is not on PATH: %v", err)
	}
	mains, err := filepath.Glob(filepath.Join("..", "..", "..", "cmd", "*"))
	if err != nil || len(mains) == 0 {
		t.Fatalf("no mains under cmd/ (%v)", err)
	}
	for _, dir := range mains {
		cmd := exec.Command(gobin, "list", "-tags", "nobadger,nobbolt,nomysql,grpcnotrace", "-deps", "./"+filepath.ToSlash(dir))
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", dir, err)
		}
		if bad := TestCode(strings.Fields(string(out))); len(bad) > 0 {
			t.Errorf("%s links testing code: %v (move what it needs out of the test helper)", filepath.Base(dir), bad)
		}
	}
}
