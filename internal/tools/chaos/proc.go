package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"gopkg.in/yaml.v3"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// daemon is one tetherd process over a data dir that outlives it. Replicas
// share the data dir (one CA, one blob store), the store and the fake's
// machine file (fakeState), and differ in listen address and log.
type daemon struct {
	bin, dataDir, listen, store, logPath, fakeState string
	extra                                           []string
	cmd                                             *exec.Cmd
	exited                                          chan struct{}
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (d *daemon) init(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, d.bin, "init", "--data-dir", d.dataDir, "--endpoint", d.listen).CombinedOutput()
	if err != nil {
		return fmt.Errorf("tetherd init: %w: %s", err, out)
	}
	return nil
}

func (d *daemon) start() error {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("tetherd log: %w", err)
	}
	args := append([]string{"serve", "--data-dir", d.dataDir, "--listen", d.listen, "--provider-fake",
		"--provider-fake-state", d.fakeState, "--provider-sync-every", "2s", "--log-level", "warn"}, d.extra...)
	if d.store != "" {
		args = append(args, "--store", d.store)
	}
	cmd := exec.Command(d.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start tetherd: %w", err)
	}
	d.cmd, d.exited = cmd, make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) {
		_ = c.Wait() // a kill -9 is the expected way out
		logf.Close()
		close(done)
	}(cmd, d.exited)
	return nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d.cmd = nil
}

// stop ends tetherd gracefully (SIGTERM), then by force after a while.
func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.exited
	}
	d.cmd = nil
}

// waitOneReady dials d as its admin and waits until it answers.
func waitOneReady(ctx context.Context, d *daemon) error {
	dl, err := newDialer(d.dataDir, []string{d.listen})
	if err != nil {
		return err
	}
	conns, err := dl.dialAll(&dl.admin)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	return waitReady(ctx, v1.NewAdminServiceClient(conns[0]))
}

// waitReady polls the admin API until tetherd answers (an external
// process: polling with a deadline is the only way to know).
func waitReady(ctx context.Context, admin v1.AdminServiceClient) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := admin.ListPools(cctx, &v1.ListPoolsRequest{PageSize: 1})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("tetherd did not come up: %w", err)
		}
		time.Sleep(200 * time.Millisecond) // an external process: poll with a deadline
	}
}

type clientConfig struct {
	Endpoint string `yaml:"endpoint"`
	CA       string `yaml:"ca"`
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
}

// dialer builds connections to the tetherd replicas with the CA and admin
// identity of the admin client config that `tetherd init` writes
// (DATA/admin/tetherconfig.yaml). Its endpoint names one address; the
// replicas' are the harness's to give.
type dialer struct {
	endpoints []string
	pool      *x509.CertPool
	admin     tls.Certificate
}

func newDialer(dataDir string, endpoints []string) (*dialer, error) {
	path := filepath.Join(dataDir, "admin", "tetherconfig.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("admin config: %w", err)
	}
	var cfg clientConfig
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("admin config %s: %w", path, err)
	}
	rel := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	caPEM, err := os.ReadFile(rel(cfg.CA))
	if err != nil {
		return nil, fmt.Errorf("admin config CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(rel(cfg.Cert), rel(cfg.Key))
	if err != nil {
		return nil, fmt.Errorf("admin config key pair: %w", err)
	}
	return &dialer{endpoints: endpoints, pool: pool, admin: cert}, nil
}

// dial connects to replica i (lazily: no connection is made before the
// first call), presenting c when it is set.
func (d *dialer) dial(i int, c *tls.Certificate) (*grpc.ClientConn, error) {
	endpoint := d.endpoints[i]
	host, _, _ := net.SplitHostPort(endpoint)
	t := &tls.Config{RootCAs: d.pool, ServerName: host, MinVersion: tls.VersionTLS13}
	if c != nil {
		t.Certificates = []tls.Certificate{*c}
	}
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(credentials.NewTLS(t)),
		grpc.WithUnaryInterceptor(nameFailures(endpoint)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", endpoint, err)
	}
	return conn, nil
}

// nameFailures puts the method and the replica in a failed call's message,
// keeping its code: a broken invariant then says which call failed where.
func nameFailures(endpoint string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil {
			return nil
		}
		st := status.Convert(err)
		return status.Errorf(st.Code(), "%s on %s: %s", method, endpoint, st.Message())
	}
}

// dialAll connects to every replica, presenting c when it is set. On an
// error it closes what it opened.
func (d *dialer) dialAll(c *tls.Certificate) ([]*grpc.ClientConn, error) {
	conns := make([]*grpc.ClientConn, 0, len(d.endpoints))
	for i := range d.endpoints {
		conn, err := d.dial(i, c)
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, conn)
	}
	return conns, nil
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		_ = c.Close()
	}
}
