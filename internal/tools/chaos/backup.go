package chaos

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// backupRun is a `tetherd backup` taken half-way through the load, while
// tetherd serves, writes and is killed (Config.Backup), and what the load
// had acknowledged before it began.
type backupRun struct {
	mu         sync.Mutex
	path       string
	start, end time.Time
	err        error
	// agents are certificates of agents whose enrollment was acknowledged
	// before the backup began: the restored control plane must take them.
	agents []enrolledAgent
}

type enrolledAgent struct {
	instanceID string
	cert       tls.Certificate
	at         time.Time
}

// enrolled notes an agent's certificate, as its enrollment is acknowledged.
func (b *backupRun) enrolled(instanceID string, cert tls.Certificate) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.start.IsZero() && len(b.agents) < 16 {
		b.agents = append(b.agents, enrolledAgent{instanceID: instanceID, cert: cert, at: time.Now()})
	}
}

// take runs `tetherd backup` against the live data dir.
func (b *backupRun) take(ctx context.Context, bin, dataDir, out string) {
	b.mu.Lock()
	b.start, b.path = time.Now(), out
	b.mu.Unlock()
	raw, err := exec.CommandContext(ctx, bin, "backup", "--data-dir", dataDir, "--out", out).CombinedOutput()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.end = time.Now()
	if err != nil {
		b.err = fmt.Errorf("tetherd backup: %w: %s", err, raw)
	}
}

// checkBackup is the invariant of Config.Backup: the backup restores
// into a new data dir, a tetherd serves it on another port, every claim
// acknowledged before the backup began is in its event log, the first
// start reports what was lost (controlplane.restored), and an agent
// enrolled before the backup opens its stream there with the certificate
// it holds (the CA came back with the backup).
func (h *harness) checkBackup(ctx context.Context, template *daemon) Result {
	r := Result{Name: "a backup taken under load restores"}
	b := h.backup
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.start.IsZero() {
		r.Violations = append(r.Violations, "no backup was taken (the run ended first)")
		return r
	}
	if b.err != nil {
		r.Violations = append(r.Violations, b.err.Error())
		return r
	}
	dir := filepath.Join(h.cfg.WorkDir, "restored")
	if raw, err := exec.CommandContext(ctx, template.bin, "restore", "--in", b.path, "--data-dir", dir).CombinedOutput(); err != nil {
		r.Violations = append(r.Violations, fmt.Sprintf("tetherd restore: %v: %s", err, raw))
		return r
	}
	addr, err := freeAddr()
	if err != nil {
		r.Violations = append(r.Violations, err.Error())
		return r
	}
	// Its own copy of the machine list: the restored control plane must
	// not act on the machines of the run.
	fakeState := filepath.Join(h.cfg.WorkDir, "fake-machines-restored.json")
	if raw, err := os.ReadFile(template.fakeState); err == nil {
		if err := os.WriteFile(fakeState, raw, 0o600); err != nil {
			r.Violations = append(r.Violations, err.Error())
			return r
		}
	}
	d := &daemon{bin: template.bin, dataDir: dir, listen: addr, extra: template.extra,
		logPath: filepath.Join(h.cfg.WorkDir, "tetherd-restored.log"), fakeState: fakeState}
	if err := d.start(); err != nil {
		r.Violations = append(r.Violations, err.Error())
		return r
	}
	defer d.stop()
	dl, err := newDialer(dir, []string{addr})
	if err != nil {
		r.Violations = append(r.Violations, err.Error())
		return r
	}
	conns, err := dl.dialAll(&dl.admin)
	if err != nil {
		r.Violations = append(r.Violations, err.Error())
		return r
	}
	defer closeAll(conns)
	admin := v1.NewAdminServiceClient(conns[0])
	if err := waitReady(ctx, admin); err != nil {
		r.Violations = append(r.Violations, "the restored control plane: "+err.Error())
		return r
	}
	o, err := observe(ctx, admin, fakeState)
	if err != nil {
		r.Violations = append(r.Violations, "read the restored control plane: "+err.Error())
		return r
	}
	claimed, restored := map[string]bool{}, 0
	for _, e := range o.Events {
		switch e.Kind {
		case kindClaimed:
			claimed[e.CorrelationID] = true
		case "controlplane.restored":
			restored++
		}
	}
	r.Checked++
	if restored != 1 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d controlplane.restored events, want 1 saying what was lost", restored))
	}
	for _, c := range h.ledger.claims() {
		if c.Acked.IsZero() || !c.Acked.Before(b.start) {
			continue
		}
		r.Checked++
		if !claimed[c.ClaimID] {
			r.Violations = append(r.Violations, fmt.Sprintf("claim %s, acknowledged before the backup began, is not in the restored event log", c.ClaimID))
		}
	}
	var refused []string
	took := false
	for _, a := range b.agents {
		r.Checked++
		if err := h.connectOnce(ctx, dl, a.cert); err != nil {
			refused = append(refused, fmt.Sprintf("%s: %v", a.instanceID, err))
			continue
		}
		took = true
		break
	}
	switch {
	case len(b.agents) == 0:
		r.Violations = append(r.Violations, "no agent had enrolled before the backup began: nothing to reconnect")
	case !took:
		r.Violations = append(r.Violations, fmt.Sprintf("no agent enrolled before the backup opened its stream on the restored control plane: %v", refused))
	}
	return r
}

// connectOnce opens an agent stream with cert and waits for the settings
// the control plane sends every stream it accepts.
func (h *harness) connectOnce(ctx context.Context, dl *dialer, cert tls.Certificate) error {
	conn, err := dl.dial(0, &cert)
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := v1.NewAgentServiceClient(conn).Connect(cctx)
	if err != nil {
		return err
	}
	if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: v1.AgentPhase_AGENT_PHASE_READY, AgentVersion: "chaos", BootId: "chaos-restored"}}}); err != nil {
		return err
	}
	m, err := s.Recv()
	if err != nil {
		return err
	}
	if m.GetSettings() == nil {
		return fmt.Errorf("first message is not the settings: %v", m)
	}
	return nil
}
