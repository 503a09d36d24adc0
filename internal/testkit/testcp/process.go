package testcp

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// process is a tetherd binary run as a child process.
type process struct {
	binary string
	args   []string
	log    string
	cmd    *exec.Cmd
	exited chan error
}

// StartProcess runs tetherd as its own process: `binary init` into a temp
// data dir, then `binary serve --data-dir DIR --listen 127.0.0.1:PORT
// args...`, and connects as its admin once its health check answers. It
// is for what an in-process control plane cannot show: a kill -9 (Kill),
// after which nothing of the old run closes a stream, a lease or a
// transaction. Restart serves the same data dir on the same address;
// Stop sends SIGTERM. The process's output goes to LogPath.
func StartProcess(t testing.TB, binary string, args ...string) *ControlPlane {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if out, err := exec.Command(binary, "init", "--data-dir", data).CombinedOutput(); err != nil {
		t.Fatalf("tetherd init: %v\n%s", err, out)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	cp := &ControlPlane{DataDir: data, Addr: addr, t: t,
		proc: &process{binary: binary, args: args, log: filepath.Join(dir, "tetherd.log")}}
	cp.serve()
	t.Cleanup(cp.Stop)
	return cp
}

// LogPath is the file a process control plane writes its output to; ""
// for an in-process one.
func (cp *ControlPlane) LogPath() string {
	if cp.proc == nil {
		return ""
	}
	return cp.proc.log
}

// Kill ends a process control plane with SIGKILL and waits for it to be
// gone. Its children (QEMU VMs) are not signalled: they outlive it, as
// they outlive a crashed tetherd. Restart serves again.
func (cp *ControlPlane) Kill() {
	if cp.proc == nil {
		cp.t.Fatal("testcp: Kill needs a control plane from StartProcess")
	}
	cp.closeAdmin()
	cp.proc.stop(cp.t, syscall.SIGKILL)
}

func (p *process) start(cp *ControlPlane) {
	t := cp.t
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"serve", "--data-dir", cp.DataDir, "--listen", cp.Addr}, p.args...)
	fmt.Fprintf(logf, "== %s %s\n", p.binary, strings.Join(args, " "))
	cmd := exec.Command(p.binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start tetherd: %v", err)
	}
	p.cmd, p.exited = cmd, make(chan error, 1)
	go func() { p.exited <- cmd.Wait() }()
	cp.connect()
	health := healthpb.NewHealthClient(cp.adminConn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			b, _ := os.ReadFile(p.log)
			t.Fatalf("tetherd exited while starting (%v):\n%s", err, b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tetherd did not answer its health check within 30 s (last: %v)", err)
		}
		time.Sleep(100 * time.Millisecond) // a deadline poll: a starting server announces nothing
	}
}

// stop signals the process and waits for it (SIGKILL after 30 s).
// Idempotent.
func (p *process) stop(t testing.TB, sig syscall.Signal) {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("tetherd did not end within 30 s of %v; killing it", sig)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}
