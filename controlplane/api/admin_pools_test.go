package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tetherctl"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/fake"
)

// bootMember plays a pool member's agent: it enrolls with the token the
// provider was handed and reports ready with an address.
func bootMember(t *testing.T, ctx context.Context, cp *testcp.ControlPlane, fp *fake.Provider, in *v1.Instance, addr string) {
	t.Helper()
	enr, ok := fp.Enrollment(in.CloudInstanceId)
	if !ok {
		t.Fatalf("member %s was handed no enrollment data", in.Id)
	}
	key := testcp.NewNodeKey(t)
	resp, err := v1.NewEnrollmentServiceClient(cp.Dial(nil)).Enroll(ctx, &v1.EnrollRequest{Token: enr.Token, CsrPem: key.CSRPEM})
	if err != nil {
		t.Fatalf("enroll member: %v", err)
	}
	cert := key.Certificate(t, resp.CertificatePem)
	stream, err := v1.NewAgentServiceClient(cp.Dial(&cert)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "test", Addresses: []string{addr}}}}); err != nil {
		t.Fatal(err)
	}
	waitInstance(t, cp, in.Id, func(in *v1.Instance) bool {
		return in.PoolState == v1.PoolState_POOL_STATE_READY && len(in.Addresses) == 1
	})
}

func waitPool(t *testing.T, cp *testcp.ControlPlane, name string, ok func(*v1.Pool) bool) *v1.Pool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p, err := cp.Admin.GetPool(context.Background(), &v1.GetPoolRequest{Name: name})
		if err == nil && ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: %v (%v)", name, p, err)
		}
		time.Sleep(20 * time.Millisecond) // polls a running tetherd over its API
	}
}

func ctl(t *testing.T, cp *testcp.ControlPlane, args ...string) string {
	t.Helper()
	cfg := filepath.Join(cp.DataDir, daemon.AdminDir, daemon.ClientConfig)
	var out, errb bytes.Buffer
	if code := tetherctl.Main(append([]string{"--config", cfg, "--endpoint", cp.Addr}, args...), &out, &errb); code != 0 {
		t.Fatalf("tetherctl %v: exit %d\n%s%s", args, code, out.String(), errb.String())
	}
	return out.String()
}

// The whole pool path over real TLS: create, warm (the fake provider's
// machines enroll and report ready), acquire and release through tetherctl,
// read the attribution back from the event log, drain and delete.
func TestPoolsOverTheAPI(t *testing.T) {
	logs := &logBuffer{}
	fp := fake.New()
	cp := lifecycleCP(t, logs, nil, fp)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "ci")
	p, err := cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: "runners", Template: fleet.Template, Provider: fake.Name, TargetSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p.MaxSize != 12 || p.LifecycleClass != v1.LifecycleClass_LIFECYCLE_CLASS_EPHEMERAL || p.Status != v1.PoolStatus_POOL_STATUS_ACTIVE ||
		p.Metadata.GetWarmingTimeoutSeconds() != 600 || p.Metadata.GetRecordRetentionDays() != 7 || p.TemplateName != fleet.Template {
		t.Fatalf("created pool: %v", p)
	}
	// Creating the pool nudged a replenish; the worker makes the machines.
	p = waitPool(t, cp, "runners", func(p *v1.Pool) bool { return p.Counts.Warming == 2 })
	for i, m := range p.Members {
		in := waitInstance(t, cp, m.InstanceId, func(in *v1.Instance) bool { return in.CloudInstanceId != "" })
		bootMember(t, ctx, cp, fp, in, fmt.Sprintf("10.0.0.%d", i+1))
	}
	p = waitPool(t, cp, "runners", func(p *v1.Pool) bool { return p.Counts.Ready == 2 })
	if p.Counts.Deficit != 0 || p.LastReplenishedAt == nil || len(p.Members) != 2 || !strings.HasPrefix(p.Members[0].NodeName, "runners-") {
		t.Fatalf("warm pool: %v", p)
	}
	if out := ctl(t, cp, "pool", "get", "runners"); !strings.Contains(out, "runners") || !strings.Contains(out, "READY") {
		t.Fatalf("pool get:\n%s", out)
	}

	// tetherctl pool acquire prints the claim and the addresses.
	out := ctl(t, cp, "pool", "acquire", "runners", "--by", "alice", "--for", "build-42")
	if !strings.Contains(out, "claim:") || !strings.Contains(out, "10.0.0.") {
		t.Fatalf("pool acquire:\n%s", out)
	}
	var acq struct {
		ClaimID  string `json:"claim_id"`
		Instance struct {
			ID        string   `json:"id"`
			Addresses []string `json:"addresses"`
		} `json:"instance"`
	}
	if err := json.Unmarshal([]byte(ctl(t, cp, "pool", "acquire", "runners", "--by", "bob", "-o", "json")), &acq); err != nil ||
		acq.ClaimID == "" || len(acq.Instance.Addresses) != 1 {
		t.Fatalf("pool acquire -o json: %+v %v", acq, err)
	}
	_, err = cp.Admin.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: "runners"})
	wantCode(t, err, codes.ResourceExhausted)

	// Release recycles (terminates) the member; the attribution comes back
	// from the event log.
	if out := ctl(t, cp, "pool", "release", acq.Instance.ID); !strings.Contains(out, "recycled") {
		t.Fatalf("pool release:\n%s", out)
	}
	var evs struct {
		Events []struct {
			CorrelationID string         `json:"correlation_id"`
			Payload       map[string]any `json:"payload"`
		} `json:"events"`
	}
	if err := json.Unmarshal([]byte(ctl(t, cp, "events", "--kind", "pool.released", "-o", "json")), &evs); err != nil || len(evs.Events) != 1 {
		t.Fatalf("events --kind pool.released: %+v %v", evs, err)
	}
	if pl := evs.Events[0].Payload; evs.Events[0].CorrelationID != acq.ClaimID || pl["acquired_by"] != "bob" || pl["disposition"] != "recycled" ||
		pl["claim_id"] != acq.ClaimID || pl["pool_name"] != "runners" {
		t.Fatalf("release record: %+v", evs.Events[0])
	}
	got, err := cp.Admin.GetInstance(ctx, &v1.GetInstanceRequest{Id: acq.Instance.ID})
	if err != nil || got.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		t.Fatalf("released member: %v %v", got, err)
	}

	// Pause, then drain: the pool keeps its target; delete waits for the
	// claimed member.
	if _, err := cp.Admin.PausePool(ctx, &v1.PoolActionRequest{Name: "runners"}); err != nil {
		t.Fatal(err)
	}
	_, err = cp.Admin.ReplenishPool(ctx, &v1.PoolActionRequest{Name: "runners"})
	wantCode(t, err, codes.FailedPrecondition)
	dr, err := cp.Admin.DrainPool(ctx, &v1.PoolActionRequest{Name: "runners"})
	if err != nil || dr.Drained != 0 || dr.ClaimedRemaining != 1 || dr.Pool.Status != v1.PoolStatus_POOL_STATUS_DRAINING || dr.Pool.TargetSize != 2 {
		t.Fatalf("drain: %v %v", dr, err)
	}
	_, err = cp.Admin.DeletePool(ctx, &v1.PoolActionRequest{Name: "runners"})
	wantCode(t, err, codes.FailedPrecondition)
	// The refused acquire above nudged a replenish: those members are
	// warming, and the recycle below terminates them (the pool is draining).
	var claimed string
	for _, m := range waitPool(t, cp, "runners", func(*v1.Pool) bool { return true }).Members {
		if m.PoolState == v1.PoolState_POOL_STATE_CLAIMED {
			claimed = m.InstanceId
		}
	}
	rel, err := cp.Admin.ReleasePoolMember(ctx, &v1.ReleasePoolMemberRequest{InstanceId: claimed})
	if err != nil || rel.Disposition != "recycled" || rel.ClaimId == "" {
		t.Fatalf("release: %v %v", rel, err)
	}
	rc, err := cp.Admin.RecyclePool(ctx, &v1.PoolActionRequest{Name: "runners"})
	if err != nil || rc.TerminateFailed != 0 {
		t.Fatalf("recycle: %v %v", rc, err)
	}
	if _, err := cp.Admin.DeletePool(ctx, &v1.PoolActionRequest{Name: "runners"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	ls, err := cp.Admin.ListPools(ctx, &v1.ListPoolsRequest{})
	if err != nil || len(ls.Pools) != 0 {
		t.Fatalf("pools after delete: %v %v", ls, err)
	}
	noTokenLogged(t, logs)
}

// Every pool RPC refuses what it does not understand, naming the field,
// and answers with a code from the table (never Unknown).
func TestPoolRPCValidation(t *testing.T) {
	logs := &logBuffer{}
	cp := lifecycleCP(t, logs, nil, fake.New())
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "v")
	if _, err := cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: "p", Template: fleet.Template, Provider: fake.Name}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.CreatePool(ctx, &v1.CreatePoolRequest{Name: "paused", Template: fleet.Template, Provider: fake.Name}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Admin.PausePool(ctx, &v1.PoolActionRequest{Name: "paused"}); err != nil {
		t.Fatal(err)
	}
	loner, _ := cp.Provision(ctx, fleet.Node)
	a := cp.Admin
	i32 := func(v int32) *int32 { return &v }
	create := func(mod func(*v1.CreatePoolRequest)) func() error {
		return func() error {
			r := &v1.CreatePoolRequest{Name: "new", Template: fleet.Template, Provider: fake.Name, TargetSize: 2}
			mod(r)
			_, err := a.CreatePool(ctx, r)
			return err
		}
	}
	update := func(r *v1.UpdatePoolRequest) func() error {
		return func() error { _, err := a.UpdatePool(ctx, r); return err }
	}
	action := func(f func(context.Context, *v1.PoolActionRequest) error, name string) func() error {
		return func() error { return f(ctx, &v1.PoolActionRequest{Name: name}) }
	}
	actions := map[string]func(context.Context, *v1.PoolActionRequest) error{
		"PausePool":     func(c context.Context, r *v1.PoolActionRequest) error { _, err := a.PausePool(c, r); return err },
		"ActivatePool":  func(c context.Context, r *v1.PoolActionRequest) error { _, err := a.ActivatePool(c, r); return err },
		"DrainPool":     func(c context.Context, r *v1.PoolActionRequest) error { _, err := a.DrainPool(c, r); return err },
		"DeletePool":    func(c context.Context, r *v1.PoolActionRequest) error { _, err := a.DeletePool(c, r); return err },
		"ReplenishPool": func(c context.Context, r *v1.PoolActionRequest) error { _, err := a.ReplenishPool(c, r); return err },
		"RecyclePool":   func(c context.Context, r *v1.PoolActionRequest) error { _, err := a.RecyclePool(c, r); return err },
	}
	acquire := func(r *v1.AcquirePoolMemberRequest) func() error {
		return func() error { _, err := a.AcquirePoolMember(ctx, r); return err }
	}
	release := func(id string) func() error {
		return func() error {
			_, err := a.ReleasePoolMember(ctx, &v1.ReleasePoolMemberRequest{InstanceId: id})
			return err
		}
	}
	type tc struct {
		name  string
		call  func() error
		code  codes.Code
		field string
	}
	tests := []tc{
		{"CreatePool blank name", create(func(r *v1.CreatePoolRequest) { r.Name = "" }), codes.InvalidArgument, "name"},
		{"CreatePool bad name", create(func(r *v1.CreatePoolRequest) { r.Name = "Big Pool" }), codes.InvalidArgument, "name"},
		{"CreatePool unknown template", create(func(r *v1.CreatePoolRequest) { r.Template = "nope" }), codes.InvalidArgument, "template"},
		{"CreatePool unknown provider", create(func(r *v1.CreatePoolRequest) { r.Provider = "cloud9" }), codes.InvalidArgument, "provider"},
		{"CreatePool external provider", create(func(r *v1.CreatePoolRequest) { r.Provider = "external" }), codes.InvalidArgument, "provider"},
		{"CreatePool negative target", create(func(r *v1.CreatePoolRequest) { r.TargetSize = -1 }), codes.InvalidArgument, "target_size"},
		{"CreatePool min above target", create(func(r *v1.CreatePoolRequest) { r.MinSize = 3 }), codes.InvalidArgument, "min_size"},
		{"CreatePool max below target", create(func(r *v1.CreatePoolRequest) { r.MaxSize = i32(1) }), codes.InvalidArgument, "max_size"},
		{"CreatePool unknown class", create(func(r *v1.CreatePoolRequest) { r.LifecycleClass = 9 }), codes.InvalidArgument, "CreatePoolRequest.lifecycle_class"},
		{"CreatePool bad metadata", create(func(r *v1.CreatePoolRequest) { r.Metadata = &v1.PoolMetadata{ReadyTtlSeconds: -1} }),
			codes.InvalidArgument, "metadata.ready_ttl_seconds"},
		{"CreatePool negative retention", create(func(r *v1.CreatePoolRequest) { r.Metadata = &v1.PoolMetadata{RecordRetentionDays: i32(-2)} }),
			codes.InvalidArgument, "metadata.record_retention_days"},
		{"CreatePool duplicate", create(func(r *v1.CreatePoolRequest) { r.Name = "p" }), codes.AlreadyExists, ""},
		{"GetPool blank", func() error { _, err := a.GetPool(ctx, &v1.GetPoolRequest{}); return err }, codes.InvalidArgument, "name"},
		{"GetPool unknown", func() error { _, err := a.GetPool(ctx, &v1.GetPoolRequest{Name: "nope"}); return err }, codes.NotFound, ""},
		{"ListPools negative page", func() error { _, err := a.ListPools(ctx, &v1.ListPoolsRequest{PageSize: -1}); return err }, codes.InvalidArgument, "page_size"},
		{"ListPools huge page", func() error { _, err := a.ListPools(ctx, &v1.ListPoolsRequest{PageSize: 5000}); return err }, codes.InvalidArgument, "page_size"},
		{"UpdatePool blank name", update(&v1.UpdatePoolRequest{UpdateMask: []string{"target_size"}}), codes.InvalidArgument, "name"},
		{"UpdatePool empty mask", update(&v1.UpdatePoolRequest{Name: "p"}), codes.InvalidArgument, "update_mask"},
		{"UpdatePool unknown mask field", update(&v1.UpdatePoolRequest{Name: "p", UpdateMask: []string{"status"}}), codes.InvalidArgument, "update_mask"},
		{"UpdatePool target above max", update(&v1.UpdatePoolRequest{Name: "p", UpdateMask: []string{"target_size"}, TargetSize: 11}),
			codes.InvalidArgument, "max_size"},
		{"UpdatePool bad metadata field", update(&v1.UpdatePoolRequest{Name: "p", UpdateMask: []string{"metadata.claimed_ttl_seconds"},
			Metadata: &v1.PoolMetadata{ClaimedTtlSeconds: -1}}), codes.InvalidArgument, "metadata.claimed_ttl_seconds"},
		{"UpdatePool class without value", update(&v1.UpdatePoolRequest{Name: "p", UpdateMask: []string{"lifecycle_class"}}),
			codes.InvalidArgument, "lifecycle_class"},
		{"UpdatePool unknown", update(&v1.UpdatePoolRequest{Name: "nope", UpdateMask: []string{"target_size"}}), codes.NotFound, ""},
		{"ReplenishPool paused", action(actions["ReplenishPool"], "paused"), codes.FailedPrecondition, ""},
		{"AcquirePoolMember paused", acquire(&v1.AcquirePoolMemberRequest{PoolName: "paused"}), codes.FailedPrecondition, ""},
		{"AcquirePoolMember unknown class", acquire(&v1.AcquirePoolMemberRequest{LifecycleClass: 7}), codes.InvalidArgument,
			"AcquirePoolMemberRequest.lifecycle_class"},
		{"AcquirePoolMember class mismatch", acquire(&v1.AcquirePoolMemberRequest{PoolName: "p", LifecycleClass: v1.LifecycleClass_LIFECYCLE_CLASS_SPOT}),
			codes.InvalidArgument, "lifecycle_class"},
		{"AcquirePoolMember long acquired_by", acquire(&v1.AcquirePoolMemberRequest{AcquiredBy: strings.Repeat("x", 300)}), codes.InvalidArgument, "acquired_by"},
		{"AcquirePoolMember unknown pool id", acquire(&v1.AcquirePoolMemberRequest{PoolId: "nope"}), codes.NotFound, ""},
		{"AcquirePoolMember unknown pool", acquire(&v1.AcquirePoolMemberRequest{PoolName: "nope"}), codes.NotFound, ""},
		{"AcquirePoolMember no ready member", acquire(&v1.AcquirePoolMemberRequest{PoolName: "p"}), codes.ResourceExhausted, ""},
		{"ReleasePoolMember blank", release(""), codes.InvalidArgument, "instance_id"},
		{"ReleasePoolMember unknown", release("nope"), codes.NotFound, ""},
		{"ReleasePoolMember not a member", release(loner.Id), codes.FailedPrecondition, ""},
	}
	for name, f := range actions {
		tests = append(tests, tc{name + " blank name", action(f, ""), codes.InvalidArgument, "name"},
			tc{name + " unknown pool", action(f, "nope"), codes.NotFound, ""})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			wantCode(t, err, tc.code)
			if tc.field != "" && !strings.HasPrefix(status.Convert(err).Message(), tc.field+":") {
				t.Fatalf("the message does not name %s: %v", tc.field, err)
			}
		})
	}
}
