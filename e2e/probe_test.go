package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"pack.ag/tftp"

	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/netnstest"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// TestProbe replays issue 26's attack classes against a real tetherd
// process (bin/tetherd, so that a panic ends the process as it would in
// production) and checks after each that it still serves: one-packet
// TFTP crashes and malformed DHCP, certificate-less connections that
// finish the handshake, idle keep-alives on the netboot port, random-MAC
// floods of the boot route. Every count and wait is bounded (about a
// minute in all). As root it runs tetherd in a network namespace it
// creates and removes, with DHCP and TFTP on a veth; otherwise on
// loopback without them, saying so. `make probe` builds and runs it.
func TestProbe(t *testing.T) {
	skip := func(format string, args ...any) {
		msg := "SKIP (probe): " + fmt.Sprintf(format, args...)
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	if os.Getenv("TETHER_PROBE") == "" {
		skip("runs under `make probe` (TETHER_PROBE=1), which builds bin/tetherd first")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tetherd := filepath.Join(root, "bin", "tetherd")
	if _, err := os.Stat(tetherd); err != nil {
		skip("%s is missing; run `make build` (make probe does)", tetherd)
	}
	p := startProbe(t, tetherd)

	t.Run("one-packet TFTP crashes", func(t *testing.T) {
		if p.tftp == "" {
			fmt.Fprintln(os.Stderr, "SKIP (probe): TFTP and DHCP need root for their network namespace")
			t.Skip("no namespace: TFTP is off")
		}
		if err := p.in(func() error {
			c, err := net.Dial("udp4", p.tftp)
			if err != nil {
				return err
			}
			defer c.Close()
			for _, d := range [][]byte{{0, 1}, {0, 2}, {0, 1, 'x'}, {0, 2, 'x'}, {0, 1, 0}, {0}, {0, 3}, {0, 4, 0, 1}, {0, 5}} {
				for range 50 {
					if _, err := c.Write(d); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		p.alive(t)
		// And it still serves a loader, over the same port.
		var got []byte
		if err := p.in(func() error {
			c, err := tftp.NewClient(tftp.ClientTimeout(2), tftp.ClientBlocksize(1432))
			if err != nil {
				return err
			}
			resp, err := c.Get("tftp://" + p.tftp + "/undionly.kpxe")
			if err != nil {
				return err
			}
			got, err = io.ReadAll(resp)
			return err
		}); err != nil || len(got) != len(probeLoader) {
			t.Fatalf("TFTP after the crash datagrams: %d bytes, %v", len(got), err)
		}
	})

	t.Run("malformed DHCP", func(t *testing.T) {
		if p.ns == nil {
			t.Skip("no namespace: DHCP is off")
		}
		if err := p.ns.DoClient(func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(probeServerIP), Port: 67})
			if err != nil {
				return err
			}
			defer c.Close()
			for i := range 500 {
				b := make([]byte, i%600)
				for j := range b {
					b[j] = byte(i * (j + 7))
				}
				if len(b) > 0 {
					b[0] = 1 // BOOTREQUEST
				}
				if _, err := c.Write(b); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		p.alive(t)
	})

	t.Run("certificate-less connections after the handshake", func(t *testing.T) {
		const flood = 300 // past --max-unauthenticated-per-source 128
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := range flood {
			c, err := p.certless()
			if err != nil {
				t.Fatalf("certificate-less connection %d: %v", i, err)
			}
			conns = append(conns, c)
		}
		// The admin, from the same address, still gets in: a new
		// connection, not one opened before the flood.
		p.alive(t)
		start := time.Now()
		held := 0
		for _, c := range conns {
			_ = c.SetReadDeadline(start.Add(probeAge + 5*time.Second))
			if _, err := io.Copy(io.Discard, c); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					held++
				}
			}
		}
		if held > 0 {
			t.Fatalf("%d of %d certificate-less connections held past their age limit %v", held, flood, probeAge)
		}
	})

	t.Run("idle keep-alives on the netboot port", func(t *testing.T) {
		const flood = 300 // past the netboot port's 64 per source
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := range flood {
			c, err := p.dial("tcp", p.netboot)
			if err != nil {
				t.Fatalf("keep-alive %d: %v", i, err)
			}
			if _, err := io.WriteString(c, "GET /artifacts/x HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		// A machine behind the same address still gets an answer.
		if code := p.httpGet(t, "/ipxe/boot?mac=52:54:00:00:00:01"); code != http.StatusOK {
			t.Fatalf("boot route during the flood: %d", code)
		}
		deadline := time.Now().Add(45 * time.Second) // idle timeout 30 s
		held := 0
		for _, c := range conns {
			_ = c.SetReadDeadline(deadline)
			r := bufio.NewReader(c)
			if resp, err := http.ReadResponse(r, nil); err == nil {
				resp.Body.Close()
			}
			if _, err := io.Copy(io.Discard, r); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					held++
				}
			}
		}
		if held > 0 {
			t.Fatalf("%d of %d idle keep-alive connections still held 45 s on (idle timeout 30 s)", held, flood)
		}
		p.alive(t)
	})

	t.Run("random-MAC flood", func(t *testing.T) {
		const flood = 1000
		before := p.refusals(t)
		for i := range flood {
			if code := p.httpGet(t, fmt.Sprintf("/ipxe/boot?mac=02:00:00:%02x:%02x:%02x", i>>16, (i>>8)&0xff, i&0xff)); code != http.StatusOK {
				t.Fatalf("refusal %d: status %d", i, code)
			}
		}
		// Per window: 16 events for one source and one summary; the flood
		// may straddle two windows.
		if n := p.refusals(t) - before; n > 34 {
			t.Fatalf("%d netboot.refused events for %d made-up MACs from one source, want at most 34", n, flood)
		}
		p.alive(t)
	})
	if n := p.panics(t); n != "" {
		t.Logf("recovered panics (each a bug to fix, none took tetherd down): %s", n)
	}
}

const (
	probeServerIP = "10.213.7.1"
	probeAge      = 3 * time.Second
)

var probeLoader = []byte(strings.Repeat("probe loader ", 700))

type probe struct {
	ns                     *netnstest.NS
	grpc, netboot, metrics string
	tftp                   string
	cmd                    *exec.Cmd
	exited                 chan error
	adminTLS, certlessTLS  *tls.Config
}

// in runs f where tetherd listens (its namespace, or here).
func (p *probe) in(f func() error) error {
	if p.ns == nil {
		return f()
	}
	return p.ns.Do(f)
}

func (p *probe) dial(network, addr string) (net.Conn, error) {
	var c net.Conn
	err := p.in(func() error {
		var err error
		c, err = net.DialTimeout(network, addr, 5*time.Second)
		return err
	})
	return c, err
}

func freePort(t *testing.T, p *probe, host string) string {
	t.Helper()
	var addr string
	if err := p.in(func() error {
		l, err := net.Listen("tcp", host+":0")
		if err != nil {
			return err
		}
		addr = l.Addr().String()
		return l.Close()
	}); err != nil {
		t.Fatal(err)
	}
	return addr
}

func startProbe(t *testing.T, tetherd string) *probe {
	dir := t.TempDir()
	data, ipxe := filepath.Join(dir, "data"), filepath.Join(dir, "ipxe")
	if err := os.MkdirAll(ipxe, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ipxe, "undionly.kpxe"), probeLoader, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tetherd, "init", "--data-dir", data).CombinedOutput(); err != nil {
		t.Fatalf("tetherd init: %v\n%s", err, out)
	}
	p := &probe{exited: make(chan error, 1)}
	var prefix []string
	if _, err := exec.LookPath("ip"); err == nil && os.Geteuid() == 0 {
		p.ns = netnstest.New(t, probeServerIP+"/24")
		p.ns.AddClientAddr(t, "10.213.7.2/24")
		prefix = []string{"ip", "netns", "exec", p.ns.Name}
	} else {
		fmt.Fprintln(os.Stderr, "SKIP (probe, part): not root or no iproute2: tetherd runs on loopback, without DHCP and TFTP")
	}
	p.grpc, p.metrics = freePort(t, p, "127.0.0.1"), freePort(t, p, "127.0.0.1")
	args := []string{tetherd, "serve", "--data-dir", data, "--listen", p.grpc, "--metrics-listen", p.metrics,
		"--qemu-mode", "disabled", "--unauthenticated-rate", "-1", "--unauthenticated-age", probeAge.String()}
	if p.ns != nil {
		p.netboot = freePort(t, p, probeServerIP)
		p.tftp = net.JoinHostPort(probeServerIP, "6969")
		args = append(args, "--netboot-listen", p.netboot, "--dhcp-interface", p.ns.Server, "--dhcp-mode", "proxy",
			"--ipxe-dir", ipxe, "--tftp-listen", p.tftp)
	} else {
		p.netboot = freePort(t, p, "127.0.0.1")
		args = append(args, "--netboot-listen", p.netboot)
	}
	args = append(prefix, args...)
	p.cmd = exec.Command(args[0], args[1:]...)
	logf, err := os.Create(filepath.Join(dir, "tetherd.log"))
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("tetherd log (last 4 KB):\n%s", lastBytes(b, 4096))
		}
	})
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(data, daemon.AdminDir, daemon.AdminCAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(filepath.Join(data, daemon.AdminDir, daemon.AdminCertFile), filepath.Join(data, daemon.AdminDir, daemon.AdminKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	p.adminTLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	p.certlessTLS = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13}
	deadline := time.Now().Add(30 * time.Second)
	for !p.healthy() {
		select {
		case err := <-p.exited:
			t.Fatalf("tetherd exited at start-up: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("tetherd did not answer its health check within 30 s")
		}
		time.Sleep(200 * time.Millisecond) // a start-up poll: tetherd signals readiness only in its log
	}
	return p
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// admin opens a new admin connection (after a flood, not before it).
func (p *probe) admin() (*grpc.ClientConn, error) {
	return grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(p.adminTLS)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return p.dial("tcp", addr) }))
}

func (p *probe) healthy() bool {
	conn, err := p.admin()
	if err != nil {
		return false
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
}

// alive fails the test if tetherd exited or stopped answering an admin.
func (p *probe) alive(t *testing.T) {
	t.Helper()
	select {
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("tetherd exited: %v", err)
	default:
	}
	if !p.healthy() {
		t.Fatal("tetherd is running but a new admin connection gets no healthy answer")
	}
}

// certless finishes TLS without a client certificate and HTTP/2's
// preface, then idles.
func (p *probe) certless() (net.Conn, error) {
	raw, err := p.dial("tcp", p.grpc)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, p.certlessTLS)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, err
	}
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := io.ReadFull(c, make([]byte, 9)); err != nil {
		c.Close()
		return nil, fmt.Errorf("no HTTP/2 SETTINGS: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

func (p *probe) httpGet(t *testing.T, path string) int {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return p.dial(network, addr) }}}
	resp, err := c.Get("http://" + p.netboot + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func (p *probe) refusals(t *testing.T) int {
	t.Helper()
	conn, err := p.admin()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := v1.NewAdminServiceClient(conn).ListEvents(ctx, &v1.ListEventsRequest{Kind: "netboot.refused", PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Events)
}

// panics is the recovered-panic counter's lines from /metrics.
func (p *probe) panics(t *testing.T) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return p.dial(network, addr) }}}
	resp, err := c.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "tether_panics_recovered_total{") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "; ")
}
