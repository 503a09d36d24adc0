package pool_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/audit"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/pool"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/testkit/instancestest"
	"github.com/tetherfleet/tether/providers/fake"
)

func intp(i int) *int { return &i }

func TestCreateValidation(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	ok := func(mod func(*pool.CreateParams)) pool.CreateParams {
		p := pool.CreateParams{Name: "ci", Template: "tpl", Provider: fake.Name, TargetSize: 3}
		if mod != nil {
			mod(&p)
		}
		return p
	}
	tests := []struct {
		name  string
		p     pool.CreateParams
		code  codes.Code
		field string // named in the message
	}{
		{"blank name", ok(func(p *pool.CreateParams) { p.Name = "" }), codes.InvalidArgument, "name"},
		{"bad name", ok(func(p *pool.CreateParams) { p.Name = "CI Pool" }), codes.InvalidArgument, "name"},
		{"name too long for member nodes", ok(func(p *pool.CreateParams) { p.Name = strings.Repeat("a", 53) }), codes.InvalidArgument, "name"},
		{"no template", ok(func(p *pool.CreateParams) { p.Template = "" }), codes.InvalidArgument, "template"},
		{"unknown template", ok(func(p *pool.CreateParams) { p.Template = "nope" }), codes.InvalidArgument, "template"},
		{"no provider", ok(func(p *pool.CreateParams) { p.Provider = "" }), codes.InvalidArgument, "provider"},
		{"provider not configured", ok(func(p *pool.CreateParams) { p.Provider = "qemu" }), codes.InvalidArgument, "provider"},
		{"external provider", ok(func(p *pool.CreateParams) { p.Provider = "external" }), codes.InvalidArgument, "provider"},
		{"long region", ok(func(p *pool.CreateParams) { p.Region = strings.Repeat("r", 129) }), codes.InvalidArgument, "region"},
		{"long instance type", ok(func(p *pool.CreateParams) { p.InstanceType = strings.Repeat("r", 129) }), codes.InvalidArgument, "instance_type"},
		{"unknown class", ok(func(p *pool.CreateParams) { p.LifecycleClass = "reserved" }), codes.InvalidArgument, "lifecycle_class"},
		{"negative target", ok(func(p *pool.CreateParams) { p.TargetSize = -1 }), codes.InvalidArgument, "target_size"},
		{"huge target", ok(func(p *pool.CreateParams) { p.TargetSize = pool.MaxPoolSize + 1 }), codes.InvalidArgument, "target_size"},
		{"negative min", ok(func(p *pool.CreateParams) { p.MinSize = -1 }), codes.InvalidArgument, "min_size"},
		{"min above target", ok(func(p *pool.CreateParams) { p.MinSize = 4 }), codes.InvalidArgument, "min_size"},
		{"max below target", ok(func(p *pool.CreateParams) { p.MaxSize = intp(2) }), codes.InvalidArgument, "max_size"},
		{"negative max", ok(func(p *pool.CreateParams) { p.MaxSize = intp(-1) }), codes.InvalidArgument, "max_size"},
		{"negative warming timeout", ok(func(p *pool.CreateParams) { p.Metadata.WarmingTimeoutSeconds = -1 }), codes.InvalidArgument, "metadata.warming_timeout_seconds"},
		{"absurd ready ttl", ok(func(p *pool.CreateParams) { p.Metadata.ReadyTTLSeconds = 1 << 30 }), codes.InvalidArgument, "metadata.ready_ttl_seconds"},
		{"negative claimed ttl", ok(func(p *pool.CreateParams) { p.Metadata.ClaimedTTLSeconds = -5 }), codes.InvalidArgument, "metadata.claimed_ttl_seconds"},
		{"negative retention", ok(func(p *pool.CreateParams) { p.Metadata.RecordRetentionDays = intp(-1) }), codes.InvalidArgument, "metadata.record_retention_days"},
		{"negative attempts", ok(func(p *pool.CreateParams) { p.Metadata.ErroredTerminateMaxAttempts = -1 }), codes.InvalidArgument, "metadata.errored_terminate_max_attempts"},
		{"target zero is a pool", ok(func(p *pool.CreateParams) { p.Name = "zero"; p.TargetSize = 0 }), codes.OK, ""},
		{"min = target = max", ok(func(p *pool.CreateParams) { p.Name = "tight"; p.MinSize = 3; p.MaxSize = intp(3) }), codes.OK, ""},
		{"retention 0 disables pruning", ok(func(p *pool.CreateParams) { p.Name = "keep"; p.Metadata.RecordRetentionDays = intp(0) }), codes.OK, ""},
		{"valid", ok(nil), codes.OK, ""},
		{"duplicate", ok(nil), codes.AlreadyExists, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.Create(e.ctx, tc.p)
			wantCode(t, err, tc.code)
			if tc.field != "" && !strings.HasPrefix(errMsg(err), tc.field+":") {
				t.Fatalf("the message does not name %s: %v", tc.field, err)
			}
		})
	}
}

func errMsg(err error) string {
	if err == nil {
		return ""
	}
	msg := err.Error()
	if i := strings.Index(msg, "desc = "); i >= 0 {
		return msg[i+len("desc = "):]
	}
	return msg
}

func TestCreateDefaults(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 4, store.PoolMetadata{})
	if p.MaxSize != 14 || p.MinSize != 0 || p.LifecycleClass != store.ClassEphemeral || p.Status != store.PoolActive {
		t.Fatalf("defaults: max %d min %d class %s status %s", p.MaxSize, p.MinSize, p.LifecycleClass, p.Status)
	}
	m := pool.Effective(p)
	if m.WarmingTimeoutSeconds != 600 || m.ReadyTTLSeconds != 3600 || m.ClaimedTTLSeconds != 86400 || *m.RecordRetentionDays != 7 ||
		m.ReuseWithoutReset || m.ErroredTerminateMaxAttempts != 5 {
		t.Fatalf("effective metadata: %+v", m)
	}
	zero := 0
	p.Metadata.RecordRetentionDays = &zero
	if pool.PolicyOf(p).Retention != 0 {
		t.Fatal("retention 0 must disable pruning")
	}
}

func TestUpdate(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	e.create("ci", 4, store.PoolMetadata{ReadyTTLSeconds: 100, ClaimedTTLSeconds: 50})
	tests := []struct {
		name  string
		p     pool.UpdateParams
		code  codes.Code
		field string
		check func(*store.Pool) bool
	}{
		{"empty mask", pool.UpdateParams{Name: "ci"}, codes.InvalidArgument, "update_mask", nil},
		{"no name", pool.UpdateParams{Mask: map[string]bool{"target_size": true}}, codes.InvalidArgument, "name", nil},
		{"unknown pool", pool.UpdateParams{Name: "nope", Mask: map[string]bool{"target_size": true}}, codes.NotFound, "", nil},
		{"target above max", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"target_size": true}, TargetSize: 15}, codes.InvalidArgument, "max_size", nil},
		{"min above target", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"min_size": true}, MinSize: 5}, codes.InvalidArgument, "min_size", nil},
		{"negative target", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"target_size": true}, TargetSize: -1}, codes.InvalidArgument, "target_size", nil},
		{"class named but blank", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"lifecycle_class": true}}, codes.InvalidArgument, "lifecycle_class", nil},
		{"unknown class", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"lifecycle_class": true}, LifecycleClass: "x"}, codes.InvalidArgument, "lifecycle_class", nil},
		{"bad metadata", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"metadata.ready_ttl_seconds": true}, Metadata: store.PoolMetadata{ReadyTTLSeconds: -1}},
			codes.InvalidArgument, "metadata.ready_ttl_seconds", nil},
		{"target and max together", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"target_size": true, "max_size": true}, TargetSize: 20, MaxSize: 30},
			codes.OK, "", func(p *store.Pool) bool { return p.TargetSize == 20 && p.MaxSize == 30 }},
		{"one metadata field keeps the others", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"metadata.claimed_ttl_seconds": true},
			Metadata: store.PoolMetadata{ClaimedTTLSeconds: 70}}, codes.OK, "",
			func(p *store.Pool) bool {
				return p.Metadata.ClaimedTTLSeconds == 70 && p.Metadata.ReadyTTLSeconds == 100
			}},
		{"reuse can be turned off again", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"metadata.reuse_without_reset": true}}, codes.OK, "",
			func(p *store.Pool) bool { return !p.Metadata.ReuseWithoutReset && p.Metadata.ReadyTTLSeconds == 100 }},
		{"class", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"lifecycle_class": true}, LifecycleClass: store.ClassSpot}, codes.OK, "",
			func(p *store.Pool) bool { return p.LifecycleClass == store.ClassSpot }},
		{"whole metadata", pool.UpdateParams{Name: "ci", Mask: map[string]bool{"metadata": true}, Metadata: store.PoolMetadata{WarmingTimeoutSeconds: 30}}, codes.OK, "",
			func(p *store.Pool) bool {
				return p.Metadata.WarmingTimeoutSeconds == 30 && p.Metadata.ReadyTTLSeconds == 0
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := e.svc.Update(e.ctx, tc.p)
			wantCode(t, err, tc.code)
			if tc.field != "" && !strings.HasPrefix(errMsg(err), tc.field+":") {
				t.Fatalf("the message does not name %s: %v", tc.field, err)
			}
			if tc.check != nil && !tc.check(v.Pool) {
				t.Fatalf("update not applied: %+v", v.Pool)
			}
		})
	}
	if p := e.pool("ci"); p.TargetSize != 20 || p.MaxSize != 30 || p.MinSize != 0 {
		t.Fatalf("a refused update changed the pool: %+v", p)
	}
}

// Asking for the state a pool is in succeeds and changes nothing; a move
// that is not allowed names the current and the allowed states.
func TestStatusTransitions(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 1, store.PoolMetadata{})
	steps := []struct {
		name string
		do   func(string) error
		code codes.Code
		want string
	}{
		{"pause", func(n string) error { _, err := e.svc.Pause(e.ctx, n); return err }, codes.OK, store.PoolPaused},
		{"pause again", func(n string) error { _, err := e.svc.Pause(e.ctx, n); return err }, codes.OK, store.PoolPaused},
		{"activate", func(n string) error { _, err := e.svc.Activate(e.ctx, n); return err }, codes.OK, store.PoolActive},
		{"activate again", func(n string) error { _, err := e.svc.Activate(e.ctx, n); return err }, codes.OK, store.PoolActive},
		{"drain", func(n string) error { _, err := e.svc.Drain(e.ctx, n); return err }, codes.OK, store.PoolDraining},
		{"drain again", func(n string) error { _, err := e.svc.Drain(e.ctx, n); return err }, codes.OK, store.PoolDraining},
		{"pause a draining pool", func(n string) error { _, err := e.svc.Pause(e.ctx, n); return err }, codes.FailedPrecondition, store.PoolDraining},
		{"replenish a draining pool", func(n string) error { _, _, err := e.svc.Replenish(e.ctx, n); return err }, codes.FailedPrecondition, store.PoolDraining},
		{"acquire from a draining pool", func(n string) error { _, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: n}); return err },
			codes.FailedPrecondition, store.PoolDraining},
		{"activate a drained pool", func(n string) error { _, err := e.svc.Activate(e.ctx, n); return err }, codes.OK, store.PoolActive},
		{"unknown pool", func(string) error { _, err := e.svc.Pause(e.ctx, "nope"); return err }, codes.NotFound, store.PoolActive},
		{"blank name", func(string) error { _, err := e.svc.Activate(e.ctx, ""); return err }, codes.InvalidArgument, store.PoolActive},
	}
	for _, s := range steps {
		err := s.do(p.Name)
		wantCode(t, err, s.code)
		if s.code == codes.FailedPrecondition && (!strings.Contains(err.Error(), "draining") || !strings.Contains(err.Error(), "allowed")) {
			t.Fatalf("%s: the refusal does not name the current and allowed states: %v", s.name, err)
		}
		if got := e.pool(p.Name).Status; got != s.want {
			t.Fatalf("%s: status %s, want %s", s.name, got, s.want)
		}
	}
	if got := e.pool(p.Name).TargetSize; got != 1 {
		t.Fatalf("drain changed the target to %d", got)
	}
}

func TestDeleteOnlyWithoutLiveMembers(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 2, store.PoolMetadata{})
		ready := e.warm(p)
		wantCode(t, e.svc.Delete(e.ctx, p.Name), codes.FailedPrecondition)
		if _, err := e.svc.Drain(e.ctx, p.Name); err != nil {
			t.Fatal(err)
		}
		// Only dead records are left: delete takes them and their nodes.
		must(t, e.svc.Delete(e.ctx, p.Name))
		if _, err := e.st.GetPool(e.ctx, p.Name); fail.Code(err) != codes.NotFound {
			t.Fatalf("pool still there: %v", err)
		}
		for _, in := range ready {
			if _, err := e.st.GetInstance(e.ctx, in.ID); fail.Code(err) != codes.NotFound {
				t.Fatalf("dead member record %s kept: %v", in.ID, err)
			}
			if _, err := e.st.GetNodeByID(e.ctx, in.NodeID); fail.Code(err) != codes.NotFound {
				t.Fatalf("member node kept: %v", err)
			}
		}
		wantCode(t, e.svc.Delete(e.ctx, p.Name), codes.NotFound)
	})
}

func TestListAndGet(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("ci", 3, store.PoolMetadata{})
	e.create("gpu", 0, store.PoolMetadata{})
	e.warm(p)
	if _, err := e.svc.Acquire(e.ctx, pool.AcquireParams{PoolName: "ci"}); err != nil {
		t.Fatal(err)
	}
	v, err := e.svc.Get(e.ctx, "ci")
	must(t, err)
	if v.Counts.Ready != 2 || v.Counts.Claimed != 1 || v.Deficit != 1 || v.TemplateName != "tpl" || len(v.Members) != 3 ||
		v.Pool.LastReplenishedAt == nil {
		t.Fatalf("get: counts %+v deficit %d template %q members %d replenished %v", v.Counts, v.Deficit, v.TemplateName, len(v.Members), v.Pool.LastReplenishedAt)
	}
	// Ordered by pool state (ready before claimed), each with its node.
	if v.Members[0].Instance.PoolState != lifecycle.PoolReady || v.Members[2].Instance.PoolState != lifecycle.PoolClaimed ||
		!strings.HasPrefix(v.Members[0].NodeName, "ci-") {
		t.Fatalf("roster order: %s %s %q", v.Members[0].Instance.PoolState, v.Members[2].Instance.PoolState, v.Members[0].NodeName)
	}
	vs, err := e.svc.List(e.ctx, store.Page{})
	must(t, err)
	if len(vs) != 2 || vs[0].Pool.Name != "ci" || vs[0].Counts.Ready != 2 || vs[1].Deficit != 0 {
		t.Fatalf("list: %d pools", len(vs))
	}
	wantCode(t, func() error { _, err := e.svc.Get(e.ctx, ""); return err }(), codes.InvalidArgument)
	wantCode(t, func() error { _, err := e.svc.Get(e.ctx, "nope"); return err }(), codes.NotFound)
}

// The roster is capped; the counts beside it are not.
func TestRosterCapped(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	p := e.create("big", 0, store.PoolMetadata{})
	seedReady(t, e.ctx, e.st, p, 60)
	v, err := e.svc.Get(e.ctx, "big")
	must(t, err)
	if len(v.Members) != pool.RosterCap || v.Counts.Ready != 60 {
		t.Fatalf("roster %d, ready %d", len(v.Members), v.Counts.Ready)
	}
}

// Each member gets its own node named after the pool and an operation id;
// the instance is created warming, with its warm-up clock started.
func TestReplenishMembers(t *testing.T) {
	eachBackend(t, func(t *testing.T, open func(testing.TB) store.Store) {
		e := newEnv(t, open)
		p := e.create("ci", 3, store.PoolMetadata{})
		_, r, err := e.svc.Replenish(e.ctx, "ci")
		must(t, err)
		if r.Provisioned != 3 || r.Failed != 0 {
			t.Fatalf("replenish: %+v", r)
		}
		nodes := map[store.NodeID]bool{}
		for _, in := range e.members(p) {
			n, err := e.st.GetNodeByID(e.ctx, in.NodeID)
			must(t, err)
			if !strings.HasPrefix(n.Name, "ci-") || n.TemplateID != p.TemplateID || nodes[n.ID] {
				t.Fatalf("member node %q (template %s)", n.Name, n.TemplateID)
			}
			nodes[n.ID] = true
			if in.PoolState != lifecycle.PoolWarming || in.PoolWarmingStartedAt == nil || !in.PoolWarmingStartedAt.Equal(t0) ||
				in.OperationID != "pool/"+p.ID.String()+"/"+n.Name || in.Status != lifecycle.Pending {
				t.Fatalf("member: state %s warming %v op %q status %s", in.PoolState, in.PoolWarmingStartedAt, in.OperationID, in.Status)
			}
		}
		// Nothing more to do: a second replenish provisions none.
		_, r, err = e.svc.Replenish(e.ctx, "ci")
		must(t, err)
		if r.Provisioned != 0 {
			t.Fatalf("second replenish provisioned %d", r.Provisioned)
		}
	})
}

// A pool and the audit record of the call that made it commit together:
// the record is there before the call ends, not written after it.
func TestCreateCommitsItsAuditRecord(t *testing.T) {
	e := newEnv(t, instancestest.SQLite)
	svc := &pool.Service{Store: audit.Wrap(e.st), Clock: e.clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Instances: e.inst}
	entry := audit.NewEntry(store.AuditRecord{At: e.clk.Now(), Identity: "otto", Role: "operator", Method: "CreatePool", Target: "name=ci"})
	if _, err := svc.Create(audit.With(e.ctx, entry), pool.CreateParams{Name: "ci", Template: e.tpl.Name, Provider: fake.Name, TargetSize: 1}); err != nil {
		t.Fatal(err)
	}
	rs, err := e.st.ListAudit(e.ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Method != "CreatePool" || rs[0].Code != "OK" {
		t.Fatalf("audit records after Create = %+v, want the call's, committed with the pool", rs)
	}
}
