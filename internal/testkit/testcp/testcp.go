// Package testcp starts a real tetherd in-process for tests: a temp data
// dir made by `init`, the whole `serve` wiring, real TLS on loopback.
package testcp

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/tools/tinymodule"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// ControlPlane is a running tetherd.
type ControlPlane struct {
	DataDir string
	Addr    string
	CA      *x509.Certificate
	CAPool  *x509.CertPool
	Admin   v1.AdminServiceClient
	// AdminCert is the admin client identity from init.
	AdminCert tls.Certificate

	t         testing.TB
	adminConn *grpc.ClientConn
	cancel    context.CancelFunc
	done      chan error
	opts      daemon.ServeOptions
	// proc is set for a tetherd run as its own process (StartProcess).
	proc *process
}

// Option adjusts the serve options.
type Option func(*daemon.ServeOptions)

// WithClock injects a clock.
func WithClock(c clock.Clock) Option { return func(o *daemon.ServeOptions) { o.Clock = c } }

// WithStore selects a store ("" is SQLite in the data dir).
func WithStore(spec string) Option { return func(o *daemon.ServeOptions) { o.Store = spec } }

// WithDataDir reuses a data dir (to restart a control plane on the same state).
func WithDataDir(dir string) Option { return func(o *daemon.ServeOptions) { o.DataDir = dir } }

// WithLog sets the logger (default: discard, to keep test output readable).
func WithLog(l *slog.Logger) Option { return func(o *daemon.ServeOptions) { o.Log = l } }

// With applies any change to the serve options.
func With(f func(*daemon.ServeOptions)) Option { return Option(f) }

// Start inits a data dir (unless one is given) and serves it.
func Start(t testing.TB, opts ...Option) *ControlPlane {
	t.Helper()
	// Every test client and benchmark enrolls from loopback: the
	// per-source limit on unauthenticated requests is off unless a test
	// sets it.
	o := daemon.ServeOptions{Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Liveness: daemon.LivenessOptions{HeartbeatFlush: 50 * time.Millisecond}, Loops: daemon.LoopOptions{Every: 200 * time.Millisecond},
		Limits: daemon.LimitOptions{UnauthenticatedRate: -1}}
	for _, f := range opts {
		f(&o)
	}
	if o.DataDir == "" {
		o.DataDir = filepath.Join(t.TempDir(), "data")
		if err := daemon.Init(daemon.InitOptions{DataDir: o.DataDir, Clock: o.Clock}); err != nil {
			t.Fatalf("tetherd init: %v", err)
		}
	}
	cp := &ControlPlane{DataDir: o.DataDir, t: t, opts: o}
	cp.serve()
	t.Cleanup(cp.Stop)
	return cp
}

func (cp *ControlPlane) serve() {
	if cp.proc != nil {
		cp.proc.start(cp)
		return
	}
	t := cp.t
	// A restart comes back on the same address: agents were told it.
	addr := "127.0.0.1:0"
	if cp.opts.Listeners.GRPC != "" {
		// A test inside its own network namespace listens where its
		// machines reach it.
		addr = cp.opts.Listeners.GRPC
	}
	if cp.Addr != "" {
		addr = cp.Addr
	}
	var lis net.Listener
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // a deadline poll: the port is freed by the kernel, which does not signal it
	}
	if err != nil {
		t.Fatal(err)
	}
	o := cp.opts
	o.Test.Listener = lis
	ready := make(chan string, 1)
	o.Test.Ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	cp.cancel, cp.done = cancel, make(chan error, 1)
	go func() { cp.done <- daemon.Serve(ctx, o) }()
	select {
	case cp.Addr = <-ready:
	case err := <-cp.done:
		t.Fatalf("tetherd serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("tetherd did not start within 30s")
	}
	cp.connect()
}

// connect reads the data dir's CA and admin identity and opens the admin
// connection to cp.Addr.
func (cp *ControlPlane) connect() {
	t := cp.t
	caPEM, err := os.ReadFile(filepath.Join(cp.DataDir, daemon.AdminDir, daemon.AdminCAFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	if cp.CA, err = x509.ParseCertificate(block.Bytes); err != nil {
		t.Fatal(err)
	}
	cp.CAPool = x509.NewCertPool()
	cp.CAPool.AddCert(cp.CA)
	if cp.AdminCert, err = tls.LoadX509KeyPair(filepath.Join(cp.DataDir, daemon.AdminDir, daemon.AdminCertFile),
		filepath.Join(cp.DataDir, daemon.AdminDir, daemon.AdminKeyFile)); err != nil {
		t.Fatal(err)
	}
	// The admin connection lives exactly as long as this serve: its close
	// is not left to t.Cleanup, which would run it before cleanups
	// registered earlier (a test's own tear-down still needs it).
	conn, err := grpc.NewClient(cp.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cp.TLS(&cp.AdminCert))))
	if err != nil {
		t.Fatal(err)
	}
	cp.adminConn, cp.Admin = conn, v1.NewAdminServiceClient(conn)
}

// Stop shuts the control plane down (idempotent).
func (cp *ControlPlane) Stop() {
	if cp.proc != nil {
		cp.closeAdmin()
		cp.proc.stop(cp.t, syscall.SIGTERM)
		return
	}
	if cp.cancel == nil {
		return
	}
	cp.cancel()
	cp.cancel = nil
	cp.closeAdmin()
	select {
	case err := <-cp.done:
		if err != nil {
			cp.t.Errorf("tetherd serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		cp.t.Error("tetherd did not stop within 30s")
	}
}

func (cp *ControlPlane) closeAdmin() {
	if cp.adminConn != nil {
		cp.adminConn.Close()
		cp.adminConn = nil
	}
}

// Restart stops and serves the same data dir again, on the same address.
func (cp *ControlPlane) Restart() {
	cp.Stop()
	cp.serve()
}

// Fingerprint is the CA pin agents get.
func (cp *ControlPlane) Fingerprint() string { return pki.Fingerprint(cp.CA.Raw) }

// TLS returns a client TLS config with an optional client certificate.
// It verifies tetherd against the data dir's CA and, after a CA
// rotation's activate, the roots a presented cross certificate chains to
// it (pki.ServerRoots), as tetherctl does.
func (cp *ControlPlane) TLS(cert *tls.Certificate) *tls.Config {
	c := &tls.Config{RootCAs: cp.CAPool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS13,
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			certs := cs.PeerCertificates
			if len(certs) == 0 {
				return errors.New("tetherd presented no certificate")
			}
			now := time.Now()
			if cp.opts.Clock != nil { // a test's own time, which tetherd signs by
				now = cp.opts.Clock.Now()
			}
			roots, inter := x509.NewCertPool(), x509.NewCertPool()
			for _, r := range pki.ServerRoots(certs, map[string]bool{pki.Fingerprint(cp.CA.Raw): true}, []*x509.Certificate{cp.CA}, now) {
				roots.AddCert(r)
			}
			for _, c := range certs[1:] {
				inter.AddCert(c)
			}
			_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: "127.0.0.1", CurrentTime: now,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		}}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// Dial opens a client connection (cert may be nil).
func (cp *ControlPlane) Dial(cert *tls.Certificate, opts ...grpc.DialOption) *grpc.ClientConn {
	conn, err := grpc.NewClient(cp.Addr, append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cp.TLS(cert)))}, opts...)...)
	if err != nil {
		cp.t.Fatal(err)
	}
	cp.t.Cleanup(func() { conn.Close() })
	return conn
}

// NodeKey is an agent-side Ed25519 key and its CSR.
type NodeKey struct {
	Key    ed25519.PrivateKey
	CSRPEM string
}

// NewNodeKey makes a key and a bare CSR, as the agent does.
func NewNodeKey(t testing.TB) NodeKey {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return NodeKey{Key: key, CSRPEM: CSR(t, key, &x509.CertificateRequest{})}
}

// CSR signs a CSR template with key.
func CSR(t testing.TB, key crypto.Signer, tpl *x509.CertificateRequest) string {
	der, err := x509.CreateCertificateRequest(rand.Reader, tpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// Certificate pairs an enrollment response with its key.
func (k NodeKey) Certificate(t testing.TB, certPEM string) tls.Certificate {
	block, _ := pem.Decode([]byte(certPEM))
	if block == nil {
		t.Fatal("no certificate PEM in the response")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{block.Bytes}, PrivateKey: k.Key, Leaf: leaf}
}

// Fleet is a template + node ready for instances.
type Fleet struct {
	Template, Node string
}

// SeedFleet pushes a tiny erofs module and creates a template and a node.
func (cp *ControlPlane) SeedFleet(ctx context.Context, name string) Fleet {
	cp.t.Helper()
	img := TinyErofs()
	cp.PushModule(ctx, name+"-base", "1", img)
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: name + "-tpl",
		RootModules: []*v1.ModuleRef{{Name: name + "-base", Version: "1"}}}); err != nil {
		cp.t.Fatal(err)
	}
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: name, Template: name + "-tpl"}); err != nil {
		cp.t.Fatal(err)
	}
	return Fleet{Template: name + "-tpl", Node: name}
}

// PushModule uploads data as name:version.
func (cp *ControlPlane) PushModule(ctx context.Context, name, version string, data []byte) *v1.Module {
	cp.t.Helper()
	m, err := PushModule(ctx, cp.Admin, name, version, data)
	if err != nil {
		cp.t.Fatalf("push %s:%s: %v", name, version, err)
	}
	return m
}

// PushModule streams data as module name:version (tinymodule.Push).
func PushModule(ctx context.Context, c v1.AdminServiceClient, name, version string, data []byte) (*v1.Module, error) {
	return tinymodule.Push(ctx, c, name, version, data)
}

// TinyErofs is a small valid erofs image (tinymodule.Image).
func TinyErofs() []byte { return tinymodule.Image() }

// BuildErofs packs a file tree into an uncompressed erofs image.
func BuildErofs(files fstest.MapFS) []byte { return tinymodule.Build(files) }

// Digest is sha256:<hex> of data.
func Digest(data []byte) string { return tinymodule.Digest(data) }

// Provision creates an external instance and returns it with its token.
func (cp *ControlPlane) Provision(ctx context.Context, node string) (*v1.Instance, string) {
	cp.t.Helper()
	resp, err := cp.Admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: node, Provider: "external"})
	if err != nil {
		cp.t.Fatalf("provision %s: %v", node, err)
	}
	return resp.Instance, resp.BootstrapToken
}
