package redfish_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/redfish"
	"github.com/tetherfleet/tether/providers/redfish/redfishtest"
)

const (
	user     = "tether-bmc"
	password = "s3cret-Pa55word-never-shown"
)

// resolver is a static Resolver over a map of node names.
type resolver struct {
	mu      sync.Mutex
	targets map[string]redfish.Target
	fail    error
}

func (r *resolver) Target(_ context.Context, node string) (redfish.Target, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return redfish.Target{}, r.fail
	}
	t, ok := r.targets[node]
	if !ok {
		return redfish.Target{}, fmt.Errorf("node %s: %w", node, redfish.ErrNoBMC)
	}
	return t, nil
}

func (r *resolver) Targets(context.Context) ([]redfish.Target, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []redfish.Target
	for _, t := range r.targets {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b redfish.Target) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

type env struct {
	bmc  *redfishtest.BMC
	res  *resolver
	p    *redfish.Provider
	clk  *clock.Fake
	logs *bytes.Buffer
	warn []string
}

// newEnv is a test BMC with one system per machine (named "1", "2", ...)
// and a node per system ("n1", ...), verified against the BMC's CA.
func newEnv(t *testing.T, opts redfishtest.Options, machines ...redfishtest.Machine) *env {
	t.Helper()
	return newEnvOpts(t, opts, machines...)
}

func newEnvTB(b testing.TB, machines ...redfishtest.Machine) *env {
	return newEnvOpts(b, redfishtest.Options{}, machines...)
}

func newEnvOpts(t testing.TB, opts redfishtest.Options, machines ...redfishtest.Machine) *env {
	t.Helper()
	if opts.Username == "" {
		opts.Username, opts.Password = user, password
	}
	e := &env{bmc: redfishtest.New(t, opts), res: &resolver{targets: map[string]redfish.Target{}},
		clk: clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), logs: &bytes.Buffer{}}
	for i, m := range machines {
		id := fmt.Sprint(i + 1)
		e.bmc.AddSystem(id, m)
		e.res.targets["n"+id] = redfish.Target{Node: "n" + id, Address: e.bmc.Address(id), Username: user, Password: password,
			TLS: redfish.TLS{CAPEM: e.bmc.CAPEM()}, BootMode: redfish.ModeLegacy, InstanceID: "inst-" + id}
	}
	var mu sync.Mutex
	p, err := redfish.New(redfish.Config{Resolver: e.res, Clock: e.clk, Logger: slog.New(slog.NewTextHandler(syncWriter{&mu, e.logs}, nil)),
		GracefulTimeout: 30 * time.Second, PowerTimeout: 20 * time.Second, PollInterval: time.Second, RequestTimeout: 2 * time.Second,
		Warn: func(_ context.Context, node, msg string) {
			mu.Lock()
			e.warn = append(e.warn, node+": "+msg)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	e.p = p
	// Waits for PowerState poll on the fake clock: move it whenever the
	// provider waits, so a wait ends by the clock, not by sleeping.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e.clk.BlockUntil(ctx, 1) == nil {
			e.clk.Advance(time.Second)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(e.logs.String(), password) {
			t.Errorf("the provider logged the BMC password:\n%s", e.logs)
		}
	})
	return e
}

type syncWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (e *env) target(node string, f func(*redfish.Target)) {
	e.res.mu.Lock()
	defer e.res.mu.Unlock()
	t := e.res.targets[node]
	f(&t)
	e.res.targets[node] = t
}

func noPassword(t *testing.T, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), password) {
		t.Errorf("the error names the password: %v", err)
	}
}

func TestProvisionSetsPXEOnceAndPowersOn(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      redfishtest.Options
		initial   redfish.PowerState
		wantReset string
	}{
		{"off machine is powered on", redfishtest.Options{}, redfish.PowerOff, "reset On 1"},
		{"on machine is force-restarted", redfishtest.Options{}, redfish.PowerOn, "reset ForceRestart 1"},
		{"reset types in an ActionInfo", redfishtest.Options{ActionInfo: true}, redfish.PowerOff, "reset On 1"},
		{"If-Match required", redfishtest.Options{RequireIfMatch: true}, redfish.PowerOff, "reset On 1"},
		{"writes through @Redfish.Settings", redfishtest.Options{Settings: true, SystemsPath: "/redfish/v1/Systems/"}, redfish.PowerOff, "reset On 1"},
		{"vendor systems path", redfishtest.Options{SystemsPath: "/redfish/v1/Chassis/1/Systems"}, redfish.PowerOff, "reset On 1"},
		{"only PushPowerButton", redfishtest.Options{ResetTypes: []redfish.ResetType{redfish.ResetPushPowerButton, redfish.ResetForceOff}}, redfish.PowerOff, "reset PushPowerButton 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts, redfishtest.NewFakeMachine(tc.initial))
			m, err := e.p.Provision(context.Background(), providers.Spec{InstanceID: "inst-1", Node: "n1", MAC: "52:54:00:00:00:01"})
			if err != nil {
				t.Fatal(err)
			}
			if m.ID != "redfish:n1" || m.InstanceID != "inst-1" || m.State != providers.StateRunning {
				t.Errorf("machine %+v", m)
			}
			want := []string{"patch 1 Once/Pxe/Legacy", tc.wantReset}
			if got := e.bmc.Calls(); !slices.Equal(got, want) {
				t.Errorf("BMC calls %q, want %q", got, want)
			}
			if got := e.bmc.Boots("1"); !slices.Equal(got, []string{"Pxe"}) {
				t.Errorf("boots %q, want one from Pxe", got)
			}
			if b := e.bmc.Boot("1"); b.BootSourceOverrideEnabled != redfish.OverrideDisabled {
				t.Errorf("the one-time override was not spent by the boot: %+v", b)
			}
		})
	}
}

func TestStop(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    redfishtest.Options
		ignore  bool
		initial redfish.PowerState
		want    []string
	}{
		{"graceful", redfishtest.Options{}, false, redfish.PowerOn, []string{"reset GracefulShutdown 1"}},
		{"graceful ignored, then forced after the timeout", redfishtest.Options{}, true, redfish.PowerOn, []string{"reset GracefulShutdown 1", "reset ForceOff 1"}},
		{"no graceful shutdown offered", redfishtest.Options{ResetTypes: []redfish.ResetType{redfish.ResetOn, redfish.ResetForceOff}}, false, redfish.PowerOn, []string{"reset ForceOff 1"}},
		{"already off", redfishtest.Options{}, false, redfish.PowerOff, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fm := redfishtest.NewFakeMachine(tc.initial)
			fm.IgnoreGraceful = tc.ignore
			e := newEnv(t, tc.opts, fm)
			start := e.clk.Now()
			m, err := e.p.Stop(context.Background(), "redfish:n1")
			if err != nil {
				t.Fatal(err)
			}
			if m.State != providers.StateStopped {
				t.Errorf("state %s, want stopped", m.State)
			}
			if got := e.bmc.Calls(); !slices.Equal(got, tc.want) {
				t.Errorf("BMC calls %q, want %q", got, tc.want)
			}
			if waited := e.clk.Now().Sub(start); tc.ignore && waited < 30*time.Second {
				t.Errorf("forced off after %s of the 30 s graceful timeout", waited)
			}
		})
	}
}

func TestReboot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    redfishtest.Options
		initial redfish.PowerState
		want    string
	}{
		{"graceful restart", redfishtest.Options{}, redfish.PowerOn, "reset GracefulRestart 1"},
		{"forced when graceful is not offered", redfishtest.Options{ResetTypes: []redfish.ResetType{redfish.ResetOn, redfish.ResetForceOff, redfish.ResetForceRestart}}, redfish.PowerOn, "reset ForceRestart 1"},
		{"a machine found off is powered on", redfishtest.Options{}, redfish.PowerOff, "reset On 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts, redfishtest.NewFakeMachine(tc.initial))
			m, err := e.p.Reboot(context.Background(), "redfish:n1", providers.Boot{})
			if err != nil {
				t.Fatal(err)
			}
			if m.State != providers.StateRunning {
				t.Errorf("state %s", m.State)
			}
			if got, want := e.bmc.Calls(), []string{"patch 1 Once/Pxe/Legacy", tc.want}; !slices.Equal(got, want) {
				t.Errorf("BMC calls %q, want %q", got, want)
			}
			if got := e.bmc.Boots("1"); !slices.Equal(got, []string{"Pxe"}) {
				t.Errorf("boots %q", got)
			}
		})
	}
}

func TestTerminatePowersOffAndClearsTheOverride(t *testing.T) {
	e := newEnv(t, redfishtest.Options{}, redfishtest.NewFakeMachine(redfish.PowerOff))
	ctx := context.Background()
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	// An override left set (say a reboot whose boot never came).
	if _, err := e.p.Reboot(ctx, "redfish:n1", providers.Boot{}); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Terminate(ctx, "redfish:n1"); err != nil {
		t.Fatal(err)
	}
	calls := e.bmc.Calls()
	if got := calls[len(calls)-2:]; !slices.Equal(got, []string{"reset ForceOff 1", "patch 1 Disabled/Pxe/Legacy"}) {
		t.Errorf("terminate did %q", got)
	}
	st, err := e.p.Status(ctx, "redfish:n1")
	if err != nil || st.State != providers.StateStopped {
		t.Errorf("after terminate: %+v, %v", st, err)
	}
	// Terminating again, or a node with no BMC, succeeds.
	if err := e.p.Terminate(ctx, "redfish:n1"); err != nil {
		t.Errorf("second terminate: %v", err)
	}
	if err := e.p.Terminate(ctx, "redfish:gone"); err != nil {
		t.Errorf("terminate of a node without a BMC: %v", err)
	}
}

func TestStatusAndList(t *testing.T) {
	e := newEnv(t, redfishtest.Options{}, redfishtest.NewFakeMachine(redfish.PowerOn), redfishtest.NewFakeMachine(redfish.PowerOff), redfishtest.NewFakeMachine(redfish.PowerOn))
	e.target("n3", func(t *redfish.Target) { t.Password = "wrong" })
	ctx := context.Background()
	for id, want := range map[string]providers.MachineState{"redfish:n1": providers.StateRunning, "redfish:n2": providers.StateStopped,
		"redfish:nope": providers.StateGone, "qemu-id": providers.StateGone} {
		m, err := e.p.Status(ctx, id)
		if err != nil || m.State != want {
			t.Errorf("Status(%s) = %+v, %v; want %s", id, m, err, want)
		}
	}
	ms, err := e.p.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]providers.MachineState{}
	for _, m := range ms {
		got[m.ID+" "+m.InstanceID] = m.State
	}
	want := map[string]providers.MachineState{"redfish:n1 inst-1": providers.StateRunning, "redfish:n2 inst-2": providers.StateStopped,
		"redfish:n3 inst-3": providers.StateUnknown}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("List = %v, want %v (a BMC that refuses is unknown, never left out)", got, want)
	}
	e.res.mu.Lock()
	e.res.fail = errors.New("database unavailable")
	e.res.mu.Unlock()
	if _, err := e.p.List(ctx); providers.KindOf(err) != providers.KindTransient {
		t.Errorf("List with the store down = %v, want transient", err)
	}
	if _, err := e.p.Status(ctx, "redfish:n1"); providers.KindOf(err) != providers.KindTransient {
		t.Errorf("Status with the store down = %v, want transient (not gone)", err)
	}
}

func TestFaults(t *testing.T) {
	type call func(p *redfish.Provider) (providers.Machine, error)
	provision := func(p *redfish.Provider) (providers.Machine, error) {
		return p.Provision(context.Background(), providers.Spec{InstanceID: "inst-1", Node: "n1"})
	}
	stop := func(p *redfish.Provider) (providers.Machine, error) {
		return p.Stop(context.Background(), "redfish:n1")
	}
	start := func(p *redfish.Provider) (providers.Machine, error) {
		return p.Start(context.Background(), "redfish:n1", providers.Boot{})
	}
	for _, tc := range []struct {
		name    string
		initial redfish.PowerState
		fault   redfishtest.Fault
		target  func(*redfish.Target)
		op      call
		kind    providers.Kind // "" means success
		msg     string
		state   providers.MachineState
	}{
		{name: "refused reset carries the BMC's message", initial: redfish.PowerOff, op: provision, kind: providers.KindPermanent,
			fault: redfishtest.Fault{Op: "reset", Kind: redfishtest.Refuse, Status: 400, Message: "The server is in a maintenance lock."},
			msg:   "The server is in a maintenance lock."},
		{name: "refused patch", initial: redfish.PowerOff, op: provision, kind: providers.KindPermanent,
			fault: redfishtest.Fault{Op: "patch", Kind: redfishtest.Refuse, Status: 409, Message: "A BIOS job is pending."}, msg: "A BIOS job is pending."},
		{name: "BMC busy is transient", initial: redfish.PowerOff, op: provision, kind: providers.KindTransient,
			fault: redfishtest.Fault{Op: "reset", Kind: redfishtest.Refuse, Status: 503, Message: "Service busy."}, msg: "Service busy."},
		{name: "wrong credentials", initial: redfish.PowerOff, op: provision, kind: providers.KindPermanent,
			target: func(t *redfish.Target) { t.Password = "not-" + password }, msg: "BMC credentials refused for node n1"},
		{name: "forbidden", initial: redfish.PowerOff, op: stop, kind: providers.KindPermanent,
			fault: redfishtest.Fault{Op: "systems", Kind: redfishtest.Refuse, Status: 403, Message: "Operator privilege required."},
			msg:   "BMC credentials refused for node n1"},
		{name: "system not on the BMC", initial: redfish.PowerOff, op: stop, kind: providers.KindNotFound,
			target: func(t *redfish.Target) { t.Address = strings.TrimSuffix(t.Address, "/1") + "/9" }, msg: "no system"},
		{name: "hang is transient", initial: redfish.PowerOff, op: provision, kind: providers.KindTransient,
			fault: redfishtest.Fault{Op: "reset", Kind: redfishtest.Hang}, msg: "no answer from the BMC"},
		{name: "power on whose answer was lost is judged by PowerState", initial: redfish.PowerOff, op: start,
			fault: redfishtest.Fault{Op: "reset:On", Kind: redfishtest.DropAfterAct}, state: providers.StateRunning},
		{name: "lost answer of a reset that did not act", initial: redfish.PowerOff, op: start, kind: providers.KindTransient,
			fault: redfishtest.Fault{Op: "reset:On", Kind: redfishtest.Hang}, msg: "PowerState is Off"},
		{name: "restart whose answer was lost cannot be told", initial: redfish.PowerOn, op: start, kind: providers.KindTransient,
			fault: redfishtest.Fault{Op: "reset:ForceRestart", Kind: redfishtest.DropAfterAct}, msg: "cannot be told"},
		{name: "patch whose answer was lost is read back", initial: redfish.PowerOff, op: provision,
			fault: redfishtest.Fault{Op: "patch", Kind: redfishtest.DropAfterAct}, state: providers.StateRunning},
		{name: "stale PowerState is waited out", initial: redfish.PowerOn, op: stop,
			fault: redfishtest.Fault{Op: "stale", Kind: redfishtest.Stale, Count: 3}, state: providers.StateStopped},
		{name: "machine that never powers on", initial: redfish.PowerOff, op: start, kind: providers.KindTransient,
			fault: redfishtest.Fault{Op: "stale", Kind: redfishtest.Stale, Count: 1000}, msg: "PowerState is Off"},
		{name: "untrusted certificate", initial: redfish.PowerOff, op: provision, kind: providers.KindPermanent,
			target: func(t *redfish.Target) { t.TLS = redfish.TLS{} }, msg: "TLS certificate is not trusted"},
		{name: "wrong pin", initial: redfish.PowerOff, op: provision, kind: providers.KindPermanent,
			target: func(t *redfish.Target) { t.TLS = redfish.TLS{Fingerprint: "sha256:" + strings.Repeat("00", 32)} }, msg: "not the pinned"},
		{name: "bad BMC address", initial: redfish.PowerOff, op: provision, kind: providers.KindPermanent,
			target: func(t *redfish.Target) { t.Address = "http://x" }, msg: "scheme must be redfish://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, redfishtest.Options{}, redfishtest.NewFakeMachine(tc.initial))
			if tc.target != nil {
				e.target("n1", tc.target)
			}
			if tc.fault.Op != "" {
				e.bmc.Inject(tc.fault)
			}
			m, err := tc.op(e.p)
			noPassword(t, err)
			if tc.kind == "" {
				if err != nil || m.State != tc.state {
					t.Fatalf("got %+v, %v; want %s", m, err, tc.state)
				}
				return
			}
			if err == nil || providers.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v (kind %s); want %s saying %q", err, providers.KindOf(err), tc.kind, tc.msg)
			}
		})
	}
}

func TestPinnedAndInsecureTLS(t *testing.T) {
	e := newEnv(t, redfishtest.Options{}, redfishtest.NewFakeMachine(redfish.PowerOn))
	ctx := context.Background()
	e.target("n1", func(t *redfish.Target) { t.TLS = redfish.TLS{Fingerprint: e.bmc.Fingerprint()} })
	if m, err := e.p.Status(ctx, "redfish:n1"); err != nil || m.State != providers.StateRunning {
		t.Fatalf("pinned: %+v, %v", m, err)
	}
	e.target("n1", func(t *redfish.Target) { t.TLS = redfish.TLS{Fingerprint: e.bmc.Fingerprint(), CAPEM: e.bmc.CAPEM()} })
	if _, err := e.p.Status(ctx, "redfish:n1"); err != nil {
		t.Fatalf("pinned and CA: %v", err)
	}
	if len(e.warn) != 0 {
		t.Errorf("verified uses warned: %q", e.warn)
	}
	e.target("n1", func(t *redfish.Target) { t.TLS = redfish.TLS{InsecureSkipVerify: true} })
	for range 2 {
		if _, err := e.p.Status(ctx, "redfish:n1"); err != nil {
			t.Fatal(err)
		}
	}
	if len(e.warn) != 2 || !strings.Contains(e.warn[0], "TLS verification off") {
		t.Errorf("want one warning per unverified use, got %q", e.warn)
	}
}

func TestNoPxeOverride(t *testing.T) {
	// A BMC whose allowable targets leave out Pxe cannot netboot the
	// machine: refuse before powering anything.
	e := newEnv(t, redfishtest.Options{}, redfishtest.NewFakeMachine(redfish.PowerOff))
	e.bmc.SetAllowableTargets("1", []string{"None", "Hdd"})
	_, err := e.p.Provision(context.Background(), providers.Spec{InstanceID: "inst-1", Node: "n1"})
	if providers.KindOf(err) != providers.KindPermanent || !strings.Contains(err.Error(), "no Pxe boot override") {
		t.Fatalf("got %v", err)
	}
	if calls := e.bmc.Calls(); len(calls) != 0 {
		t.Errorf("BMC was changed: %q", calls)
	}
}

func TestProvisionNeedsANode(t *testing.T) {
	e := newEnv(t, redfishtest.Options{})
	for _, spec := range []providers.Spec{{Node: "n1"}, {InstanceID: "i"}} {
		if _, err := e.p.Provision(context.Background(), spec); providers.KindOf(err) != providers.KindPermanent {
			t.Errorf("Provision(%+v) = %v, want permanent", spec, err)
		}
	}
	if _, err := e.p.Provision(context.Background(), providers.Spec{InstanceID: "i", Node: "unknown"}); !providers.IsNotFound(err) {
		t.Errorf("a node without a BMC: %v, want not found", err)
	}
}

func TestCredentialsReachOnlyTheBMC(t *testing.T) {
	e := newEnv(t, redfishtest.Options{}, redfishtest.NewFakeMachine(redfish.PowerOff))
	if _, err := e.p.Provision(context.Background(), providers.Spec{InstanceID: "inst-1", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	for _, u := range e.bmc.Users() {
		if u != user {
			t.Errorf("the BMC saw user %q", u)
		}
	}
	if n := len(e.bmc.Users()); n == 0 {
		t.Error("no request authenticated")
	}
}
