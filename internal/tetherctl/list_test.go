package tetherctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A fleet bigger than one page (the API's largest is 1,000) lists whole.
func TestListsPageThroughTheWholeFleet(t *testing.T) {
	const nodes = 1500
	cp := testcp.Start(t)
	base := []string{"--config", filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig), "--endpoint", cp.Addr}
	ctx := context.Background()
	if out, errOut, code := run(t, append(base, "module", "build", t.TempDir(), "base:1")...); code != 0 {
		t.Fatalf("module build: %s %s", out, errOut)
	}
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "web", RootModules: []*v1.ModuleRef{{Name: "base", Version: "1"}}}); err != nil {
		t.Fatal(err)
	}
	for i := range nodes {
		if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: fmt.Sprintf("n-%04d", i), Template: "web"}); err != nil {
			t.Fatal(err)
		}
	}
	nodeRow := regexp.MustCompile(`(?m)^n-\d{4} `)

	out, errOut, code := run(t, append(base, "node", "list")...)
	if code != 0 || errOut != "" {
		t.Fatalf("node list: exit %d: %s", code, errOut)
	}
	if got := len(nodeRow.FindAllString(out, -1)); got != nodes {
		t.Fatalf("node list printed %d rows, want %d", got, nodes)
	}

	out, _, code = run(t, append(base, "node", "list", "-o", "json")...)
	var all struct {
		Nodes []struct {
			Name string `json:"name"`
		} `json:"nodes"`
		Next string `json:"next_page_token"`
	}
	if err := json.Unmarshal([]byte(out), &all); code != 0 || err != nil {
		t.Fatalf("node list -o json: exit %d, %v", code, err)
	}
	if len(all.Nodes) != nodes || all.Next != "" {
		t.Fatalf("-o json holds %d nodes (next %q), want all %d", len(all.Nodes), all.Next, nodes)
	}

	// --limit cuts, says so on stderr, and the printed token continues.
	out, errOut, code = run(t, append(base, "node", "list", "--limit", "1200")...)
	if got := len(nodeRow.FindAllString(out, -1)); code != 0 || got != 1200 {
		t.Fatalf("--limit 1200: exit %d, %d rows", code, got)
	}
	m := regexp.MustCompile(`showing the first 1200 nodes; more remain\. --limit 0 lists them all; --page-token (\S+)`).FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("a cut list must say so on stderr: %q", errOut)
	}
	rest, errOut, code := run(t, append(base, "node", "list", "--page-token", m[1])...)
	if got := len(nodeRow.FindAllString(rest, -1)); code != 0 || got != nodes-1200 || errOut != "" {
		t.Fatalf("--page-token: exit %d, %d rows, stderr %q", code, got, errOut)
	}
	seen := map[string]bool{}
	for _, r := range nodeRow.FindAllString(out+rest, -1) {
		seen[strings.TrimSpace(r)] = true
	}
	if len(seen) != nodes {
		t.Fatalf("the two parts hold %d distinct nodes, want %d", len(seen), nodes)
	}

	if _, errOut, code = run(t, append(base, "node", "list", "--limit", "-1")...); code == 0 || !strings.Contains(errOut, "--limit") {
		t.Fatalf("--limit -1: exit %d, %q", code, errOut)
	}
}
