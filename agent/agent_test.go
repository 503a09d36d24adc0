package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	"github.com/tetherfleet/tether/agent/identity"
	"github.com/tetherfleet/tether/agent/modules"
	"github.com/tetherfleet/tether/agent/session"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/testkit/logbuf"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// syncBuffer is a console the test can read while the agent writes.
type syncBuffer = logbuf.Buffer

// controlPlane is the fake control plane plus a record of every stream.
type controlPlane struct {
	*enrolltest.Server
	ca      *enrolltest.CA
	mu      sync.Mutex
	streams []*stream
	opened  chan *stream
}

type stream struct {
	mu       sync.Mutex
	msgs     []*tetherv1.AgentMessage
	arrived  chan struct{}
	send     chan *tetherv1.ControlMessage
	instance string
	// ended is closed when the agent's side ends; endErr is how (io.EOF:
	// the agent half-closed it cleanly).
	ended  chan struct{}
	endErr error
}

func (s *stream) all() []*tetherv1.AgentMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*tetherv1.AgentMessage(nil), s.msgs...)
}

// phases lists the phases of the heartbeats received, collapsing repeats.
func (s *stream) phases() []tetherv1.AgentPhase {
	var out []tetherv1.AgentPhase
	for _, m := range s.all() {
		if hb := m.GetHeartbeat(); hb != nil && (len(out) == 0 || out[len(out)-1] != hb.Phase) {
			out = append(out, hb.Phase)
		}
	}
	return out
}

// waitFor returns the first message satisfying ok.
func (s *stream) waitFor(t *testing.T, what string, ok func(*tetherv1.AgentMessage) bool) *tetherv1.AgentMessage {
	t.Helper()
	deadline := time.After(20 * time.Second)
	seen := 0
	for {
		msgs := s.all()
		for _, m := range msgs[seen:] {
			if ok(m) {
				return m
			}
		}
		seen = len(msgs)
		select {
		case <-s.arrived:
		case <-deadline:
			t.Fatalf("the control plane never received %s; got %v", what, msgs)
		}
	}
}

func (s *stream) update(t *testing.T, task string, st tetherv1.TaskStatus) *tetherv1.TaskUpdate {
	t.Helper()
	m := s.waitFor(t, fmt.Sprintf("update %s %v", task, st), func(m *tetherv1.AgentMessage) bool {
		u := m.GetTaskUpdate()
		return u != nil && u.TaskId == task && u.Status == st
	})
	return m.GetTaskUpdate()
}

func newControlPlane(t *testing.T) *controlPlane {
	ca := enrolltest.NewCA(t, "tether CA")
	cp := &controlPlane{Server: enrolltest.Start(t, ca), ca: ca, opened: make(chan *stream, 16)}
	cp.ConnectHandler = func(inst string, st tetherv1.AgentService_ConnectServer) error {
		s := &stream{arrived: make(chan struct{}, 1), send: make(chan *tetherv1.ControlMessage, 16), instance: inst, ended: make(chan struct{})}
		cp.mu.Lock()
		cp.streams = append(cp.streams, s)
		cp.mu.Unlock()
		cp.opened <- s
		go func() {
			for m := range s.send {
				if st.Send(m) != nil {
					return
				}
			}
		}()
		for {
			m, err := st.Recv()
			if err != nil {
				s.mu.Lock()
				s.endErr = err
				s.mu.Unlock()
				close(s.ended)
				return nil
			}
			s.mu.Lock()
			s.msgs = append(s.msgs, m)
			s.mu.Unlock()
			select {
			case s.arrived <- struct{}{}:
			default:
			}
		}
	}
	return cp
}

func (cp *controlPlane) stream(t *testing.T) *stream {
	t.Helper()
	select {
	case s := <-cp.opened:
		return s
	case <-time.After(20 * time.Second):
		t.Fatal("the agent opened no stream")
		return nil
	}
}

// assign serves modules named root-N and ext-N and assigns them.
func (cp *controlPlane) assign(t *testing.T, roots, exts int) *tetherv1.Assignment {
	a := &tetherv1.Assignment{}
	for i := 0; i < roots+exts; i++ {
		blob := make([]byte, 300<<10+i)
		rand.Read(blob)
		m := &tetherv1.Module{Version: "1", Digest: enrolltest.Digest(blob), Size: int64(len(blob))}
		if i < roots {
			m.Name = fmt.Sprintf("root-%d", i)
			a.RootModules = append(a.RootModules, m)
		} else {
			m.Name = fmt.Sprintf("ext-%d", i-roots)
			a.ExtensionModules = append(a.ExtensionModules, m)
		}
		cp.Lock()
		cp.Blobs[m.Digest] = blob
		cp.Unlock()
	}
	cp.Lock()
	cp.Assignment = a
	cp.Unlock()
	return a
}

// cmdline writes a kernel command line handing over url, token and ca.
func cmdline(t *testing.T, url, token, ca string) identity.Source {
	p := filepath.Join(t.TempDir(), "cmdline")
	line := fmt.Sprintf("console=ttyS0 tether.url=%s tether.token=%s tether.ca=%s\n", url, token, ca)
	if err := os.WriteFile(p, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return identity.CmdlineSource{Path: p}
}

type phaseLog struct {
	mu     sync.Mutex
	phases []tetherv1.AgentPhase
	ch     chan tetherv1.AgentPhase
}

func (p *phaseLog) add(ph tetherv1.AgentPhase) {
	p.mu.Lock()
	if len(p.phases) == 0 || p.phases[len(p.phases)-1] != ph {
		p.phases = append(p.phases, ph)
	}
	p.mu.Unlock()
	p.ch <- ph
}

func (p *phaseLog) wait(t *testing.T, want tetherv1.AgentPhase) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case ph := <-p.ch:
			if ph == want {
				return
			}
		case <-deadline:
			t.Fatalf("agent never reached %v (phases %v)", want, p.list())
		}
	}
}

func (p *phaseLog) list() []tetherv1.AgentPhase {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]tetherv1.AgentPhase(nil), p.phases...)
}

type run struct {
	console *syncBuffer
	phases  *phaseLog
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
}

// start runs an agent in-process; mod adjusts its configuration.
func start(t *testing.T, cfg Config) *run {
	t.Helper()
	r := &run{console: &syncBuffer{}, phases: &phaseLog{ch: make(chan tetherv1.AgentPhase, 64)}, done: make(chan struct{})}
	cfg.Console = r.console
	cfg.OnPhase = r.phases.add
	if cfg.Version == "" {
		cfg.Version = "v0.0.1-test"
	}
	if cfg.BootID == "" {
		cfg.BootID = "boot-A"
	}
	if cfg.Addresses == nil {
		cfg.Addresses = func() []string { return []string{"192.0.2.10"} }
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.err = Run(ctx, cfg); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
			t.Error("agent did not stop")
		}
		if t.Failed() {
			t.Logf("console:\n%s", r.console.String())
		}
	})
	return r
}

func (r *run) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not return")
		return nil
	}
}

var consoleLine = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z tether-agent: \S`)

func TestRunRootModeNone(t *testing.T) {
	cp := newControlPlane(t)
	asg := cp.assign(t, 2, 1)
	state := t.TempDir()
	r := start(t, Config{StateDir: state, Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-42"), cp.ca.Fingerprint)}})
	r.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)

	want := []tetherv1.AgentPhase{
		tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING, tetherv1.AgentPhase_AGENT_PHASE_ENROLLING,
		tetherv1.AgentPhase_AGENT_PHASE_PULLING, tetherv1.AgentPhase_AGENT_PHASE_READY,
	}
	if got := r.phases.list(); !slices.Equal(got, want) {
		t.Fatalf("phases = %v, want %v", got, want)
	}
	// The stream opens right after enrollment: the control plane watches
	// pulling and ready live.
	s := cp.stream(t)
	if s.instance != "i-42" {
		t.Fatalf("stream from %q", s.instance)
	}
	hb := s.waitFor(t, "a ready heartbeat", func(m *tetherv1.AgentMessage) bool {
		return m.GetHeartbeat().GetPhase() == tetherv1.AgentPhase_AGENT_PHASE_READY
	}).GetHeartbeat()
	if got := s.phases(); !slices.Contains(got, tetherv1.AgentPhase_AGENT_PHASE_PULLING) {
		t.Errorf("control plane saw phases %v, want pulling among them", got)
	}
	wantDigests := []string{asg.RootModules[0].Digest, asg.RootModules[1].Digest, asg.ExtensionModules[0].Digest}
	if !slices.Equal(hb.RunningModuleDigests, wantDigests) || hb.BootId != "boot-A" || hb.AgentVersion != "v0.0.1-test" || hb.Addresses[0] != "192.0.2.10" {
		t.Fatalf("ready heartbeat = %v", hb)
	}
	for _, d := range wantDigests {
		if _, err := os.Stat(filepath.Join(state, "modules", strings.TrimPrefix(d, "sha256:"))); err != nil {
			t.Errorf("module %s not in the cache: %v", d, err)
		}
	}
	out := r.console.String()
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !consoleLine.MatchString(line) {
			t.Errorf("console line %q lacks the timestamp prefix", line)
		}
	}
	for _, want := range []string{"phase enrolling", "enrolled as instance i-42 (certificate valid until ", "pulling root-0:1", "pulled root-1:1", "ready: instance i-42"} {
		if !strings.Contains(out, want) {
			t.Errorf("console lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "tbt_") {
		t.Error("the console shows the bootstrap token")
	}
}

// fakeRoot records Compose and simulates the exec of the new init: like
// exec, Switch does not return (until the test ends).
type fakeRoot struct {
	mu       sync.Mutex
	layers   []Layer
	workDir  string
	target   string
	switched chan struct{}
	noInit   bool
	release  chan struct{}
}

func (f *fakeRoot) Compose(_ context.Context, layers []Layer, workDir, target string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.layers, f.workDir, f.target = layers, workDir, target
	return nil
}

func (f *fakeRoot) Switch(target string, beforeExec func()) error {
	if f.noInit {
		return fmt.Errorf("%w (/sbin/init: not found)", ErrNoInit)
	}
	beforeExec()
	close(f.switched)
	<-f.release
	return errors.New("test over")
}

func TestRunSwitchThenSuccessor(t *testing.T) {
	cp := newControlPlane(t)
	asg := cp.assign(t, 2, 0)
	state := t.TempDir()
	src := cmdline(t, cp.URL, cp.AddToken("i-7"), cp.ca.Fingerprint)
	root := &fakeRoot{switched: make(chan struct{}), release: make(chan struct{})}
	first := start(t, Config{StateDir: state, Sources: []identity.Source{src}, RootMode: RootModeSwitch, Root: root, RootTarget: "/newroot"})
	// At the end the "exec'd" agent is stopped before its Switch returns.
	t.Cleanup(func() { first.cancel(); close(root.release) })
	s1 := cp.stream(t)
	select {
	case <-root.switched:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never switched root")
	}
	wantPhases := []tetherv1.AgentPhase{
		tetherv1.AgentPhase_AGENT_PHASE_DISCOVERING, tetherv1.AgentPhase_AGENT_PHASE_ENROLLING,
		tetherv1.AgentPhase_AGENT_PHASE_PULLING, tetherv1.AgentPhase_AGENT_PHASE_MOUNTING, tetherv1.AgentPhase_AGENT_PHASE_SWITCHING,
	}
	if got := first.phases.list(); !slices.Equal(got, wantPhases) {
		t.Fatalf("phases = %v, want %v", got, wantPhases)
	}
	if got := s1.phases(); got[len(got)-1] != tetherv1.AgentPhase_AGENT_PHASE_SWITCHING {
		t.Fatalf("the control plane did not see switching before the switch: %v", got)
	}
	if len(root.layers) != 2 || root.layers[0].Name != "root-0:1" || root.workDir != filepath.Join(state, "rootfs") || root.target != "/newroot" {
		t.Fatalf("compose got %+v %s %s", root.layers, root.workDir, root.target)
	}
	for i, l := range root.layers {
		if err := modules.VerifyFile(l.Path, asg.RootModules[i].Digest); err != nil {
			t.Fatalf("layer %d handed to compose unverified: %v", i, err)
		}
	}

	// The root's init starts the next agent: no token needed, no pulling.
	cp.Lock()
	fetches := len(cp.FetchOffsets)
	cp.Unlock()
	next := start(t, Config{StateDir: state, Sources: []identity.Source{src}, RootMode: RootModeNone})
	next.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
	s2 := cp.stream(t)
	hb := s2.waitFor(t, "ready", func(m *tetherv1.AgentMessage) bool {
		return m.GetHeartbeat().GetPhase() == tetherv1.AgentPhase_AGENT_PHASE_READY
	}).GetHeartbeat()
	if hb.BootId != "boot-A" || len(hb.RunningModuleDigests) != 2 || hb.RunningModuleDigests[1] != asg.RootModules[1].Digest {
		t.Fatalf("successor heartbeat = %v", hb)
	}
	cp.Lock()
	defer cp.Unlock()
	if cp.Enrollments != 1 {
		t.Fatalf("enrollments = %d; the successor must reuse the saved identity", cp.Enrollments)
	}
	if len(cp.FetchOffsets) != fetches {
		t.Fatal("the successor downloaded modules again")
	}
	if out := next.console.String(); !strings.Contains(out, "reusing the saved identity: instance i-7") {
		t.Fatalf("successor console:\n%s", out)
	}
}

func TestRunSwitchWithoutInitStaysAsSupervisor(t *testing.T) {
	cp := newControlPlane(t)
	cp.assign(t, 1, 0)
	root := &fakeRoot{noInit: true}
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)}, RootMode: RootModeSwitch, Root: root})
	r.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
	if out := r.console.String(); !strings.Contains(out, "stays on as the root's supervisor") {
		t.Fatalf("console:\n%s", out)
	}
}

func TestRunDigestMismatchIsReported(t *testing.T) {
	cp := newControlPlane(t)
	asg := cp.assign(t, 1, 0)
	cp.Lock()
	cp.Blobs[asg.RootModules[0].Digest][1000] ^= 0xff
	cp.Unlock()
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)}})
	err := r.wait(t)
	var dm *modules.DigestMismatchError
	if !errors.As(err, &dm) || dm.Module != "root-0:1" {
		t.Fatalf("Run = %v, want a digest mismatch for root-0:1", err)
	}
	s := cp.stream(t)
	s.waitFor(t, "a heartbeat carrying the error", func(m *tetherv1.AgentMessage) bool {
		return strings.Contains(m.GetHeartbeat().GetError(), "module root-0:1 digest mismatch: want "+asg.RootModules[0].Digest)
	})
}

func TestRunWrongCAFingerprint(t *testing.T) {
	cp := newControlPlane(t)
	other := enrolltest.NewCA(t, "someone else")
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), other.Fingerprint)}})
	err := r.wait(t)
	if err == nil {
		t.Fatal("enrolled against the wrong CA")
	}
	for _, want := range []string{"CA fingerprint mismatch", "expected " + other.Fingerprint, cp.ca.Fingerprint, "re-provision"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestRunRefusedToken(t *testing.T) {
	cp := newControlPlane(t)
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, "tbt_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", cp.ca.Fingerprint)}})
	err := r.wait(t)
	if err == nil || !strings.Contains(err.Error(), "refused the bootstrap token") || !strings.Contains(err.Error(), "tetherctl token create") {
		t.Fatalf("Run = %v", err)
	}
}

func TestRunMissingMaterialSaysWhereItLooked(t *testing.T) {
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{identity.FwCfgSource{Dir: filepath.Join(t.TempDir(), "none")}}})
	err := r.wait(t)
	if !errors.Is(err, identity.ErrIncomplete) || !strings.Contains(err.Error(), "QEMU fw_cfg: not present") {
		t.Fatalf("Run = %v", err)
	}
}

func TestRunTasks(t *testing.T) {
	cp := newControlPlane(t)
	cp.assign(t, 1, 0)
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-3"), cp.ca.Fingerprint)}})
	r.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
	s := cp.stream(t)
	send := func(id string, kind tetherv1.TaskKind, exec *tetherv1.ExecPayload) {
		s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Task{Task: &tetherv1.TaskAssignment{TaskId: id, Kind: kind, Exec: exec}}}
	}
	send("e1", tetherv1.TaskKind_TASK_KIND_EXEC, &tetherv1.ExecPayload{Argv: []string{"sh", "-c", "echo hello"}})
	s.update(t, "e1", tetherv1.TaskStatus_TASK_STATUS_RUNNING)
	if u := s.update(t, "e1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED); string(u.Result.GetOutput()) != "hello\n" {
		t.Fatalf("exec result = %v", u)
	}
	send("r1", tetherv1.TaskKind_TASK_KIND_REBOOT, nil)
	if u := s.update(t, "r1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED); !strings.Contains(string(u.Result.GetOutput()), "would reboot") {
		t.Fatalf("reboot in root mode none = %v", u)
	}
	send("m1", tetherv1.TaskKind_TASK_KIND_MODULE_SYNC, nil)
	if u := s.update(t, "m1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED); !strings.Contains(string(u.Result.GetOutput()), "drift: none") {
		t.Fatalf("module_sync = %v", u)
	}
	send("c1", tetherv1.TaskKind_TASK_KIND_RENEW_CERTIFICATE, nil)
	// The renewal makes the agent reconnect with the new certificate; the
	// task's result arrives on the old stream or the new one.
	s2 := cp.stream(t)
	s2.waitFor(t, "a heartbeat on the new stream", func(m *tetherv1.AgentMessage) bool { return m.GetHeartbeat() != nil })
	var u *tetherv1.TaskUpdate
	for _, st := range []*stream{s, s2} {
		for _, m := range st.all() {
			if x := m.GetTaskUpdate(); x.GetTaskId() == "c1" && x.GetStatus() == tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				u = x
			}
		}
	}
	if u == nil {
		u = s2.update(t, "c1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	}
	if !strings.Contains(string(u.Result.GetOutput()), "renewed") {
		t.Fatalf("renew = %v", u)
	}
	cp.Lock()
	defer cp.Unlock()
	if cp.Renewals != 1 {
		t.Fatalf("renewals = %d", cp.Renewals)
	}
	if !strings.Contains(r.console.String(), "would reboot now") {
		t.Fatal("the dry-run reboot was not announced on the console")
	}
}

// TestStopSaysGoodbye: a stopped agent (systemd's SIGTERM at poweroff)
// sends the result of a task that finished just before, then half-closes
// its stream, so the control plane reads all of it and sees an orderly end
// rather than a cut connection.
func TestStopSaysGoodbye(t *testing.T) {
	cp := newControlPlane(t)
	cp.assign(t, 1, 0)
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-4"), cp.ca.Fingerprint)}})
	r.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
	s := cp.stream(t)
	s.send <- &tetherv1.ControlMessage{Msg: &tetherv1.ControlMessage_Task{Task: &tetherv1.TaskAssignment{TaskId: "e1", Kind: tetherv1.TaskKind_TASK_KIND_EXEC,
		Exec: &tetherv1.ExecPayload{Argv: []string{"sh", "-c", "echo bye"}}}}}
	s.update(t, "e1", tetherv1.TaskStatus_TASK_STATUS_SUCCEEDED)
	r.cancel()
	if err := r.wait(t); err != nil {
		t.Fatalf("a stopped agent returned %v", err)
	}
	select {
	case <-s.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the stream did not end")
	}
	s.mu.Lock()
	endErr := s.endErr
	s.mu.Unlock()
	if !errors.Is(endErr, io.EOF) {
		t.Fatalf("the stream ended with %v, want the agent's half-close (EOF)", endErr)
	}
	if !strings.Contains(r.console.String(), "stopping: the last heartbeat was read by the control plane") {
		t.Fatalf("the console does not say the goodbye was read:\n%s", r.console.String())
	}
}

// offsetClock runs ahead of the wall clock, so certificates issued now
// look expired.
type offsetClock struct {
	clock.Real
	d time.Duration
}

func (c offsetClock) Now() time.Time                         { return time.Now().Add(c.d) }
func (c offsetClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func waitConsole(t *testing.T, r *run, want string, times int) {
	t.Helper()
	if !r.console.Await(20*time.Second, func(s string) bool { return strings.Count(s, want) >= times }) {
		t.Fatalf("console never showed %q %d times", want, times)
	}
}

func TestRunExpiredCertificate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fresh bool // the node was handed an unused token meanwhile
	}{{"unused token re-enrolls", true}, {"spent token keeps retrying", false}} {
		t.Run(tc.name, func(t *testing.T) {
			cp := newControlPlane(t)
			cp.assign(t, 1, 0)
			state := t.TempDir()
			spent := cp.AddToken("i-5")
			first := start(t, Config{StateDir: state, Sources: []identity.Source{cmdline(t, cp.URL, spent, cp.ca.Fingerprint)}})
			first.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
			first.cancel()
			first.wait(t)

			// A day and more later: the certificate has lapsed.
			later := offsetClock{d: 25 * time.Hour}
			cp.Lock()
			cp.Now = later.Now
			cp.Unlock()
			tok := spent
			if tc.fresh {
				tok = cp.AddToken("i-5")
			}
			r := start(t, Config{StateDir: state, Clock: later, Sources: []identity.Source{cmdline(t, cp.URL, tok, cp.ca.Fingerprint)}})
			waitConsole(t, r, "expired at", 1)
			if tc.fresh {
				r.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
				waitConsole(t, r, "re-enrolled as instance i-5 with an unused bootstrap token", 1)
				return
			}
			waitConsole(t, r, "the only bootstrap token it holds was spent when it enrolled", 2)
			waitConsole(t, r, "tetherctl token create --instance i-5", 2)
			if slices.Contains(r.phases.list(), tetherv1.AgentPhase_AGENT_PHASE_READY) {
				t.Fatal("ready with an expired certificate")
			}
		})
	}
}

func TestSuperviseNeverGivesUp(t *testing.T) {
	con := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	// The supervisor's back-offs pass at once.
	clk := clock.NewFake(time.Now())
	go clk.AutoAdvance(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Supervise(ctx, Config{
			StateDir: t.TempDir(), Console: con, Clock: clk, BootID: "b",
			CmdlinePath: filepath.Join(t.TempDir(), "no-cmdline"),
			Sources:     []identity.Source{identity.FwCfgSource{Dir: filepath.Join(t.TempDir(), "none")}},
		})
	}()
	if !con.Await(20*time.Second, func(s string) bool { return strings.Count(s, "retrying the boot") >= 3 }) {
		t.Fatalf("console:\n%s", con.String())
	}
	cancel()
	<-done
	out := con.String()
	if !strings.Contains(out, "FAILED: enrollment material incomplete") || !strings.Contains(out, "tether.debug=1") {
		t.Fatalf("console:\n%s", out)
	}
}

type fakeNotifier struct {
	mu    sync.Mutex
	sent  []string
	every time.Duration
	// news gets a token after every notification.
	news chan struct{}
}

func (n *fakeNotifier) Notify(s string) error {
	n.mu.Lock()
	n.sent = append(n.sent, s)
	n.mu.Unlock()
	select {
	case n.news <- struct{}{}:
	default: // the test has a token to read already
	}
	return nil
}

func (n *fakeNotifier) WatchdogInterval() time.Duration { return n.every }

func (n *fakeNotifier) count(s string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, x := range n.sent {
		if x == s {
			c++
		}
	}
	return c
}

func TestRunNotifiesSystemd(t *testing.T) {
	cp := newControlPlane(t)
	cp.assign(t, 1, 0)
	n := &fakeNotifier{every: 20 * time.Millisecond, news: make(chan struct{}, 1)}
	r := start(t, Config{StateDir: t.TempDir(), Notifier: n, Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)}})
	r.phases.wait(t, tetherv1.AgentPhase_AGENT_PHASE_READY)
	timeout := time.After(10 * time.Second)
	for n.count("READY=1") != 1 || n.count("WATCHDOG=1") < 2 {
		select {
		case <-n.news:
		case <-timeout:
			n.mu.Lock()
			defer n.mu.Unlock()
			t.Fatalf("notifications: %v", n.sent)
		}
	}
}

type failingRoot struct{ fakeRoot }

func (*failingRoot) Switch(string, func()) error { return errors.New("move /run: device busy") }

func TestRunSwitchFailureIsReported(t *testing.T) {
	cp := newControlPlane(t)
	cp.assign(t, 1, 0)
	r := start(t, Config{StateDir: t.TempDir(), Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)}, RootMode: RootModeSwitch, Root: &failingRoot{}})
	err := r.wait(t)
	if err == nil || !strings.Contains(err.Error(), "device busy") {
		t.Fatalf("Run = %v", err)
	}
	// The first stream was closed for the switch; the error goes out on a
	// new one.
	cp.stream(t)
	s := cp.stream(t)
	s.waitFor(t, "the switch error", func(m *tetherv1.AgentMessage) bool {
		return strings.Contains(m.GetHeartbeat().GetError(), "device busy")
	})
}

// stateBlockingRoot fails its switch after putting a non-empty directory
// where the agent state file goes, so recording the failed switch fails.
type stateBlockingRoot struct {
	fakeRoot
	stateDir string
}

func (r *stateBlockingRoot) Switch(string, func()) error {
	p := filepath.Join(r.stateDir, stateFile)
	if err := os.Remove(p); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(p, "in-the-way"), 0o700); err != nil {
		return err
	}
	return errors.New("move /run: device busy")
}

// Recording a failed switch used to be dropped (`_ = saveState`): the
// saved state kept saying switched without a word. Now the run's error
// says so.
func TestRunSwitchFailureThatCannotBeRecordedSaysSo(t *testing.T) {
	cp := newControlPlane(t)
	cp.assign(t, 1, 0)
	dir := t.TempDir()
	r := start(t, Config{StateDir: dir, Sources: []identity.Source{cmdline(t, cp.URL, cp.AddToken("i-1"), cp.ca.Fingerprint)},
		RootMode: RootModeSwitch, Root: &stateBlockingRoot{stateDir: dir}})
	err := r.wait(t)
	if err == nil || !strings.Contains(err.Error(), "device busy") || !strings.Contains(err.Error(), "record the failed switch") {
		t.Fatalf("Run = %v", err)
	}
}

// A background part of the agent that stops early says so on the console
// and in the heartbeat's error; a stop because the agent is ending does
// not.
func TestReportEnd(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		ctxDone  bool
		reported bool
	}{
		{"a failure", errors.New("maintain: not enrolled"), false, true},
		{"a clean end", nil, false, false},
		{"the agent stopping", context.Canceled, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			buf := &syncBuffer{}
			a := &agent{con: &console{w: buf, now: time.Now}, status: session.NewStatus()}
			ctx, cancel := context.WithCancel(context.Background())
			if tc.ctxDone {
				cancel()
			}
			defer cancel()
			a.reportEnd(ctx, "certificate maintenance", tc.err)
			got := strings.Contains(buf.String(), "certificate maintenance stopped: maintain: not enrolled")
			if got != tc.reported {
				t.Fatalf("reported %v, want %v; console: %q", got, tc.reported, buf.String())
			}
		})
	}
}

// TestAnnounceModeNeedsBootIF: tether.announce= puts the agent in announce
// mode, which needs the boot interface to name the machine by.
func TestAnnounceModeNeedsBootIF(t *testing.T) {
	line := filepath.Join(t.TempDir(), "cmdline")
	if err := os.WriteFile(line, []byte("ip=dhcp tether.announce=http://127.0.0.1:1/netboot/announce\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Run(context.Background(), Config{StateDir: t.TempDir(), Console: &syncBuffer{}, BootID: "b", CmdlinePath: line})
	if err == nil || !strings.Contains(err.Error(), "needs BOOTIF=01-<mac>") {
		t.Fatalf("Run = %v, want announce mode asking for BOOTIF", err)
	}
}
