package repocheck

import (
	"fmt"
	"go/parser"
	"go/token"
	"path"
	"strconv"
	"strings"
)

// Module is the module path; rules name packages relative to it.
const Module = "github.com/tetherfleet/tether"

// DepRule forbids packages under From (a path relative to the module;
// "x/..." means x and everything below it), apart from those under Exempt,
// to import packages under Deny, apart from those under AllowImports. Why
// is the direction of dependencies it keeps, as docs/architecture.md
// states it.
type DepRule struct {
	From, Exempt       []string
	Deny, AllowImports []string
	Why                string
}

// DepRules are the directions docs/architecture.md promises. They apply
// to non-test code: tests (e2e above all) and test-helper packages (whose
// name ends in "test", such as instancestest) may reach across layers.
var DepRules = []DepRule{
	{From: []string{"agent/..."}, Deny: []string{"controlplane/...", "providers/...", "internal/tetherctl"},
		Why: "the agent shares only proto, pki and small internal helpers with the control plane"},
	{From: []string{"providers/..."}, Deny: []string{"controlplane/...", "agent/..."},
		Why: "a provider knows nothing of the control plane; it is used through its interface"},
	// The injected clock is a leaf every side may use.
	{From: []string{"pki/..."}, Deny: []string{"controlplane/...", "agent/...", "providers/...", "internal/..."},
		AllowImports: []string{"internal/clock"},
		Why:          "pki is shared by both sides and depends on neither"},
	{From: []string{"proto/...", "controlplane/lifecycle"}, Deny: []string{"..."},
		Why: "the API and the pure state machine depend on nothing of Tether's"},
	// The store speaks the lifecycle's own state types (docs/adr/0009).
	{From: []string{"controlplane/store"}, Deny: []string{"..."}, AllowImports: []string{"controlplane/lifecycle"},
		Why: "the persistence contract depends on nothing of Tether's but the state types"},
	{From: []string{"controlplane/store/..."}, Exempt: []string{"controlplane/store"}, Deny: []string{"controlplane/...", "agent/...", "providers/..."},
		AllowImports: []string{"controlplane/store/...", "controlplane/lifecycle"},
		Why:          "backends know the store contract and nothing above it"},
	{From: []string{"controlplane/..."}, Deny: []string{"agent/...", "internal/tetherctl"},
		Why: "the control plane and the agent meet only over the API"},
	{From: []string{"controlplane/..."}, Exempt: []string{"controlplane/daemon"}, Deny: []string{"controlplane/api"},
		Why: "services sit below the API; only the composition root (daemon) wires it"},
	{From: []string{"controlplane/..."}, Deny: []string{"controlplane/daemon"},
		Why: "daemon is the composition root; nothing in the control plane imports it"},
	// The test fixtures that build the services (instancestest) are test
	// helpers, which the rules leave free.
	{From: []string{"controlplane/..."}, Exempt: []string{"controlplane/daemon", "controlplane/daemon/wire"}, Deny: []string{"controlplane/daemon/wire"},
		Why: "the services are built in one place (wire.NewServices) for the composition root; no service builds the others"},
	{From: []string{"controlplane/..."}, Exempt: []string{"controlplane/store/...", "controlplane/daemon"},
		Deny: []string{"controlplane/store/sqlite", "controlplane/store/postgres"},
		Why:  "nothing above the store knows which backend it runs on; daemon picks one"},
	{From: []string{"controlplane/..."}, Exempt: []string{"controlplane/store/..."},
		Deny: []string{"controlplane/store/sqlstore"},
		Why:  "the SQL layer is the backends' own; services use the store contract"},
	{From: []string{"internal/tetherctl"}, Deny: []string{"controlplane/...", "agent/...", "providers/..."},
		Why: "the CLI speaks only the admin API"},
	{From: []string{"..."}, Deny: []string{"cmd/..."},
		Why: "mains are thin and nothing imports them"},
	// docs/adr/0046: what ships, what tests and what measures live apart.
	{From: []string{"..."}, Exempt: []string{"internal/testkit/...", "e2e"}, Deny: []string{"internal/testkit/..."},
		Why: "test harnesses (internal/testkit) are for tests; shipped code and the tools never link them"},
	{From: []string{"..."}, Exempt: []string{"internal/tools/...", "internal/testkit/...", "e2e", "cmd/tether-bench"}, Deny: []string{"internal/tools/..."},
		Why: "the load, chaos and plot tooling (internal/tools) sits apart from the product; only tether-bench and tests use it"},
}

// under reports whether pkg (module-relative) is matched by pattern.
func under(pkg, pattern string) bool {
	if pattern == "..." {
		return true
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return pkg == base || strings.HasPrefix(pkg, base+"/")
	}
	return pkg == pattern
}

// TestHelper reports whether pkg (an import path or a module-relative
// one) is a test-helper package: anything under internal/testkit, or a
// package whose name ends in "test" (storetest, servertest), which the
// rules treat as test code.
func TestHelper(pkg string) bool {
	if rel, ok := relative(pkg); ok {
		pkg = rel
	}
	return under(pkg, "internal/testkit/...") || strings.HasSuffix(path.Base(pkg), "test")
}

// CheckImports returns the rules pkg breaks by importing imports. Both
// are import paths; paths outside the module are ignored.
func CheckImports(file, pkg string, imports []string, rules []DepRule) []Finding {
	rel, ok := relative(pkg)
	if !ok {
		return nil
	}
	var out []Finding
	for _, imp := range imports {
		irel, ok := relative(imp)
		if !ok || irel == rel {
			continue
		}
		for _, r := range rules {
			if !anyUnder(rel, r.From) || anyUnder(rel, r.Exempt) || !anyUnder(irel, r.Deny) || anyUnder(irel, r.AllowImports) {
				continue
			}
			out = append(out, Finding{File: file, Match: imp,
				Why: fmt.Sprintf("%s may not import %s: %s (docs/architecture.md)", rel, irel, r.Why)})
		}
	}
	return out
}

func anyUnder(pkg string, patterns []string) bool {
	for _, p := range patterns {
		if under(pkg, p) {
			return true
		}
	}
	return false
}

// relative turns an import path of this module into a module-relative
// path ("" for the module root).
func relative(imp string) (string, bool) {
	if imp == Module {
		return "", true
	}
	rel, ok := strings.CutPrefix(imp, Module+"/")
	return rel, ok
}

// FileImports returns the import paths of one Go source file.
func FileImports(name string, src []byte) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
	if err != nil {
		return nil, fmt.Errorf("parse imports of %s: %w", name, err)
	}
	out := make([]string, 0, len(f.Imports))
	for _, spec := range f.Imports {
		p, err := strconv.Unquote(spec.Path.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: import %s: %w", name, spec.Path.Value, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// TestCode reports which of deps (the import paths a shipped binary
// links, as `go list -deps` prints them) are testing code: the standard
// testing package or one of this module's test helpers. A shipped binary
// that links them carries test flags and harnesses into production.
func TestCode(deps []string) []string {
	var out []string
	for _, d := range deps {
		if rel, ok := relative(d); d == "testing" || ok && TestHelper(rel) {
			out = append(out, d)
		}
	}
	return out
}
