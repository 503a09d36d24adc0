package api_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// ekHash is a well-formed EK hash whose digits are all d.
func ekHash(d string) string { return "sha256:" + strings.Repeat(d, 64) }

func TestNodeEKHashesValidated(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	for _, c := range []struct {
		name string
		eks  []string
		want string // in the message, beside "ek_hashes"
	}{
		{"empty", []string{""}, `"" is not sha256:HEX`},
		{"no prefix", []string{strings.Repeat("a", 64)}, "is not sha256:HEX"},
		{"other algorithm", []string{"sha1:" + strings.Repeat("a", 40)}, `"sha1:`},
		{"upper-case prefix", []string{"SHA256:" + strings.Repeat("a", 64)}, "is not sha256:HEX"},
		{"short", []string{"sha256:abcd"}, `"sha256:abcd" has 4 hex digits, want 64`},
		{"long", []string{"sha256:" + strings.Repeat("a", 66)}, "has 66 hex digits"},
		{"not hex", []string{ekHash("g")}, "is not hex"},
		{"space", []string{" " + ekHash("a")}, "is not sha256:HEX"},
		{"twice", []string{ekHash("a"), ekHash("a")}, "is given twice"},
		// Upper case names the same key as lower case, so it is a repeat.
		{"twice by case", []string{ekHash("a"), ekHash("A")}, "is given twice"},
		{"too many", []string{ekHash("1"), ekHash("2"), ekHash("3"), ekHash("4"), ekHash("5"), ekHash("6"), ekHash("7"), ekHash("8"), ekHash("9")}, "9 endorsement keys is more than 8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "bad", Template: fleet.Template, EkHashes: c.eks})
			wantMsg(t, err, codes.InvalidArgument, "ek_hashes", c.want)
			_, err = cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}, EkHashes: c.eks})
			wantMsg(t, err, codes.InvalidArgument, "ek_hashes", c.want)
		})
	}
	// A value far too long is named, but cut to a hash's length.
	_, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "bad", Template: fleet.Template, EkHashes: []string{"sha256:" + strings.Repeat("f", 5000)}})
	wantMsg(t, err, codes.InvalidArgument, "ek_hashes", "...")
	if msg := grpcstatus.Convert(err).Message(); len(msg) > 300 {
		t.Fatalf("the refusal repeats the whole value: %d bytes", len(msg))
	}
	if _, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: "bad"}); grpcstatus.Code(err) != codes.NotFound {
		t.Fatalf("a refused node exists: %v", err)
	}
	n, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: fleet.Node})
	if err != nil || len(n.EkHashes) != 0 {
		t.Fatalf("node after refused updates = %v, %v", n, err)
	}
}

func TestNodeEKHashesRoundTrip(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	// Upper-case hex is stored lower-case: a tool printing upper case
	// names the same key.
	n, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "tpm", Template: fleet.Template,
		EkHashes: []string{ekHash("B"), ekHash("a")}, RequireAttestation: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{ekHash("b"), ekHash("a")}
	if strings.Join(n.EkHashes, ",") != strings.Join(want, ",") || !n.RequireAttestation {
		t.Fatalf("created node = %v, want eks %v and require_attestation", n, want)
	}
	got, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: "tpm"})
	if err != nil || strings.Join(got.EkHashes, ",") != strings.Join(want, ",") || !got.RequireAttestation {
		t.Fatalf("get = %v, %v", got, err)
	}
	ls, err := cp.Admin.ListNodes(ctx, &v1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range ls.Nodes {
		if ln.Name == "tpm" && strings.Join(ln.EkHashes, ",") != strings.Join(want, ",") {
			t.Fatalf("listed node = %v", ln)
		}
	}
	// An update replaces the whole set; another field's update keeps it.
	if n, err = cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: "tpm", UpdateMask: []string{"ek_hashes"}, EkHashes: []string{ekHash("c")}}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(n.EkHashes, ",") != ekHash("c") || !n.RequireAttestation {
		t.Fatalf("after replacing the set: %v", n)
	}
	if n, err = cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: "tpm", UpdateMask: []string{"public_address"}, PublicAddress: "10.0.0.9"}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(n.EkHashes, ",") != ekHash("c") {
		t.Fatalf("an update of another field changed the eks: %v", n)
	}
	// Empty under the mask clears; require_attestation turns off.
	if n, err = cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: "tpm", UpdateMask: []string{"ek_hashes", "require_attestation"}}); err != nil {
		t.Fatal(err)
	}
	if len(n.EkHashes) != 0 || n.RequireAttestation {
		t.Fatalf("after clearing: %v", n)
	}
	// A cleared hash is free for another node.
	if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}, EkHashes: []string{ekHash("c")}}); err != nil {
		t.Fatalf("binding a released hash: %v", err)
	}

	// Templates carry require_attestation too.
	tpl, err := cp.Admin.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: fleet.Template, UpdateMask: []string{"require_attestation"}, RequireAttestation: true})
	if err != nil || !tpl.RequireAttestation {
		t.Fatalf("template update = %v, %v", tpl, err)
	}
	if tpl, err = cp.Admin.GetTemplate(ctx, &v1.GetTemplateRequest{Name: fleet.Template}); err != nil || !tpl.RequireAttestation {
		t.Fatalf("template get = %v, %v", tpl, err)
	}
	tpl, err = cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "strict", RequireAttestation: true,
		RootModules: []*v1.ModuleRef{{Name: "edge-base", Version: "1"}}})
	if err != nil || !tpl.RequireAttestation {
		t.Fatalf("template create = %v, %v", tpl, err)
	}
}

// One TPM is one machine: a hash bound to one node is refused for any
// other, the write changes nothing, and a high-severity event names the
// hash and both nodes.
func TestNodeEKConflict(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	ek := ekHash("d")
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "first", Template: fleet.Template, EkHashes: []string{ek}}); err != nil {
		t.Fatal(err)
	}
	// Create: the node is not made. Upper case names the same key.
	_, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "second", Template: fleet.Template, EkHashes: []string{ekHash("e"), ekHash("D")}})
	wantMsg(t, err, codes.AlreadyExists, "ek_hashes", ek, `"first"`)
	if _, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: "second"}); grpcstatus.Code(err) != codes.NotFound {
		t.Fatalf("the refused node exists: %v", err)
	}
	// Update: nothing of the update is written, not even its other fields.
	_, err = cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes", "public_address"},
		EkHashes: []string{ekHash("e"), ek}, PublicAddress: "10.9.9.9"})
	wantMsg(t, err, codes.AlreadyExists, "ek_hashes", ek, `"first"`)
	n, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: fleet.Node})
	if err != nil || len(n.EkHashes) != 0 || n.PublicAddress != "" {
		t.Fatalf("node after the refused update = %v, %v", n, err)
	}
	// The unbound hash of the refused writes is still free.
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "third", Template: fleet.Template, EkHashes: []string{ekHash("e")}}); err != nil {
		t.Fatalf("the refused writes bound %s: %v", ekHash("e"), err)
	}
	// Rewriting a node with its own hash is no conflict.
	if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: "first", UpdateMask: []string{"ek_hashes"}, EkHashes: []string{ek}}); err != nil {
		t.Fatalf("rewriting first's own hash: %v", err)
	}

	evs, err := cp.Admin.ListEvents(ctx, &v1.ListEventsRequest{Kind: "node.ek_conflict"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Events) != 2 {
		t.Fatalf("%d conflict events, want one per refused write: %v", len(evs.Events), evs.Events)
	}
	for i, asked := range []string{fleet.Node, "second"} { // newest first
		e := evs.Events[i]
		p := e.Payload.AsMap()
		if e.Severity != v1.Severity_SEVERITY_HIGH || p["ek_hash"] != ek || p["bound_node"] != "first" || p["node"] != asked {
			t.Errorf("event %d = %v, want high severity naming %s, first and %s", i, e, ek, asked)
		}
		if !strings.Contains(e.Message, ek) || !strings.Contains(e.Message, `"first"`) || !strings.Contains(e.Message, `"`+asked+`"`) {
			t.Errorf("event message %q does not name the hash and both nodes", e.Message)
		}
	}
}

// Binding a TPM decides which machine may become a node without a token,
// and clearing require_attestation makes a stolen token good again: both
// need role admin, like a node's BMC (ADR 0024, following ADR 0017).
func TestNodeEKFieldsNeedAdmin(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes", "require_attestation"},
		EkHashes: []string{ekHash("a")}, RequireAttestation: true}); err != nil {
		t.Fatal(err)
	}
	otto := identity(t, cp, "otto", "operator")
	op := v1.NewAdminServiceClient(cp.Dial(&otto))
	for _, c := range []struct {
		name string
		call func() error
		want string
	}{
		{"create with eks", func() error {
			_, err := op.CreateNode(ctx, &v1.CreateNodeRequest{Name: "mine", Template: fleet.Template, EkHashes: []string{ekHash("b")}})
			return err
		}, "a node's ek_hashes needs role admin"},
		{"create requiring attestation", func() error {
			_, err := op.CreateNode(ctx, &v1.CreateNodeRequest{Name: "mine", Template: fleet.Template, RequireAttestation: true})
			return err
		}, "a node's require_attestation needs role admin"},
		{"update eks", func() error {
			_, err := op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}, EkHashes: []string{ekHash("b")}})
			return err
		}, "a node's ek_hashes needs role admin"},
		// Clearing is a change too: it unbinds the machine.
		{"clear eks", func() error {
			_, err := op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}})
			return err
		}, "a node's ek_hashes needs role admin"},
		{"drop node requirement", func() error {
			_, err := op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"require_attestation"}})
			return err
		}, "a node's require_attestation needs role admin"},
		{"create template requiring attestation", func() error {
			_, err := op.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "strict", RequireAttestation: true, RootModules: []*v1.ModuleRef{{Name: "edge-base", Version: "1"}}})
			return err
		}, "a template's require_attestation needs role admin"},
		{"update template requirement", func() error {
			_, err := op.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: fleet.Template, UpdateMask: []string{"require_attestation"}, RequireAttestation: true})
			return err
		}, "a template's require_attestation needs role admin"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantMsg(t, c.call(), codes.PermissionDenied, c.want, "otto", "operator")
		})
	}
	n, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: fleet.Node})
	if err != nil || strings.Join(n.EkHashes, ",") != ekHash("a") || !n.RequireAttestation {
		t.Fatalf("node after the refused calls = %v, %v", n, err)
	}
	if _, err := cp.Admin.GetNode(ctx, &v1.GetNodeRequest{Name: "mine"}); grpcstatus.Code(err) != codes.NotFound {
		t.Fatalf("a refused node exists: %v", err)
	}
	tpl, err := cp.Admin.GetTemplate(ctx, &v1.GetTemplateRequest{Name: fleet.Template})
	if err != nil || tpl.RequireAttestation {
		t.Fatalf("template after the refused calls = %v, %v", tpl, err)
	}
	// Operators still drive nodes: every other field is theirs, and an
	// update of them keeps the node's EKs and requirement.
	if n, err = op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"public_address"}, PublicAddress: "10.0.0.1"}); err != nil {
		t.Fatalf("operator updating public_address: %v", err)
	}
	if strings.Join(n.EkHashes, ",") != ekHash("a") || !n.RequireAttestation {
		t.Fatalf("an operator's update changed the attestation fields: %v", n)
	}
	// Operators and viewers see the hashes: they are no secret.
	if got, err := op.GetNode(ctx, &v1.GetNodeRequest{Name: fleet.Node}); err != nil || len(got.EkHashes) != 1 {
		t.Fatalf("operator get = %v, %v", got, err)
	}
}

// Every change is audited: the admin's binding, the refused conflict and
// the operator's refused attempt each leave a record with its code.
func TestNodeEKChangesAudited(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "first", Template: fleet.Template, EkHashes: []string{ekHash("a")}}); err != nil {
		t.Fatal(err)
	}
	_, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}, EkHashes: []string{ekHash("a")}})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := cp.Admin.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}, EkHashes: []string{ekHash("b")}}); err != nil {
		t.Fatal(err)
	}
	otto := identity(t, cp, "otto", "operator")
	op := v1.NewAdminServiceClient(cp.Dial(&otto))
	_, err = op.UpdateNode(ctx, &v1.UpdateNodeRequest{Name: fleet.Node, UpdateMask: []string{"ek_hashes"}})
	wantCode(t, err, codes.PermissionDenied)

	var got []string
	for _, who := range []string{"admin", "otto"} {
		recs, err := cp.Admin.ListAudit(ctx, &v1.ListAuditRequest{Identity: who, PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs.Records {
			if r.Method == "CreateNode" || r.Method == "UpdateNode" {
				got = append(got, r.Identity+" "+r.Method+" "+r.Target+" "+r.Code)
			}
		}
	}
	want := []string{
		"admin CreateNode name=edge template=edge-tpl OK", // SeedFleet's
		"admin CreateNode name=first template=edge-tpl OK",
		"admin UpdateNode name=edge AlreadyExists",
		"admin UpdateNode name=edge OK",
		"otto UpdateNode name=edge PermissionDenied",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("audit records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
