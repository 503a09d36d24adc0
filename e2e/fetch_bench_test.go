package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/tetherfleet/tether/agent/enroll"
	"github.com/tetherfleet/tether/agent/modules"
	"github.com/tetherfleet/tether/agent/modules/fetchbench"
	"github.com/tetherfleet/tether/agent/rootfs"
	"github.com/tetherfleet/tether/controlplane/daemon"
	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// BenchmarkFetchVerifyTetherd is modules.BenchmarkFetchVerify against the
// real tetherd (in-process, real TLS on loopback, the real FetchModule):
// an enrolled agent fetches and verifies a 64 MiB module, reported against
// in-memory SHA-256 of the same bytes (see fetchbench.Run).
//
//	go test -tags nobadger,nobbolt,nomysql -run '^$' -bench FetchVerifyTetherd -benchtime 10x ./e2e/
func BenchmarkFetchVerifyTetherd(b *testing.B) {
	payload := make([]byte, 64<<20)
	if _, err := rand.Read(payload); err != nil {
		b.Fatal(err)
	}
	benchFetch(b, testcp.BuildErofs(fstest.MapFS{"payload": {Data: payload}}), "")
}

// BenchmarkFetchVerifyMountTetherd is the same for a real compressed root
// module, fetched, verified and then mounted as the agent mounts a layer
// (loop device, erofs, read-only), its /sbin/init looked up, and
// unmounted: all three are timed. The module is TETHER_BENCH_MODULE, or the
// Debian root the Debian e2e caches (.cache/debian-root.erofs, lz4hc,
// about 107 MiB). Mounting needs root.
//
//	TETHER_BENCH_MODULE=.cache/debian-root.erofs go test -tags nobadger,nobbolt,nomysql -run '^$' -bench FetchVerifyMountTetherd -benchtime 5x ./e2e/
func BenchmarkFetchVerifyMountTetherd(b *testing.B) {
	path := os.Getenv("TETHER_BENCH_MODULE")
	if path == "" {
		path = filepath.Join("..", ".cache", "debian-root.erofs")
	}
	img, err := os.ReadFile(path)
	if err != nil {
		b.Skipf("SKIP: no module to fetch (%v): set TETHER_BENCH_MODULE, or run the Debian e2e once to cache .cache/debian-root.erofs", err)
	}
	if os.Geteuid() != 0 {
		b.Skip("SKIP: mounting the module needs root")
	}
	benchFetch(b, img, b.TempDir())
}

// benchFetch enrolls an agent against an in-process tetherd serving img as
// a root module and runs fetchbench over it; with mountDir, each fetch is
// followed by a mount of the module there, a look-up of /sbin/init and an
// unmount, all timed.
func benchFetch(b *testing.B, img []byte, mountDir string) {
	// The same bytes are the control plane's default kernel, so its netboot
	// HTTP server serves them (over TLS here, with tetherd's own
	// certificate) for curl to fetch beside the agent.
	imgPath := filepath.Join(b.TempDir(), "module.erofs")
	if err := os.WriteFile(imgPath, img, 0o600); err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var serverCert tls.Certificate // loaded once tetherd init has made it
	netLis := tls.NewListener(lis, &tls.Config{MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &serverCert, nil }})
	cp := testcp.Start(b, testcp.With(func(o *daemon.ServeOptions) { o.Kernel, o.Test.NetbootListener = imgPath, netLis }))
	if serverCert, err = tls.LoadX509KeyPair(filepath.Join(cp.DataDir, daemon.ServerCertFile), filepath.Join(cp.DataDir, daemon.ServerKeyFile)); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	cp.PushModule(ctx, "bench", "1", img)
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "bench", RootModules: []*v1.ModuleRef{{Name: "bench", Version: "1"}}}); err != nil {
		b.Fatal(err)
	}
	if _, err := cp.Admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "bench", Template: "bench"}); err != nil {
		b.Fatal(err)
	}
	_, token := cp.Provision(ctx, "bench")

	// Enroll and dial as the agent does.
	m, err := enroll.New(enroll.Config{StateDir: b.TempDir(), URL: "https://" + cp.Addr, CAFingerprint: cp.Fingerprint()})
	if err != nil {
		b.Fatal(err)
	}
	ec, err := m.Dial(false)
	if err != nil {
		b.Fatal(err)
	}
	defer ec.Close()
	if _, err := m.Enroll(ctx, v1.NewEnrollmentServiceClient(ec), token); err != nil {
		b.Fatal(err)
	}
	conn, err := m.Dial(true)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := v1.NewAgentServiceClient(conn)
	as, err := client.GetAssignment(ctx, &v1.GetAssignmentRequest{})
	if err != nil || len(as.RootModules) != 1 {
		b.Fatalf("assignment: %v %v", as, err)
	}
	mod := as.RootModules[0]
	f, err := modules.New(modules.Config{Dir: fetchbench.Dir(b), Client: func() v1.AgentServiceClient { return client }})
	if err != nil {
		b.Fatal(err)
	}
	path, err := f.Path(mod.Digest)
	if err != nil {
		b.Fatal(err)
	}
	fetchbench.Run(b, img,
		func() error {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				return err
			}
			return nil
		},
		func() error {
			if _, err := f.Fetch(ctx, mod); err != nil {
				return err
			}
			if mountDir == "" {
				return nil
			}
			sys := rootfs.RealSys()
			if err := rootfs.MountErofs(sys, path, mountDir); err != nil {
				return err
			}
			_, serr := os.Lstat(filepath.Join(mountDir, "sbin", "init"))
			if err := sys.Unmount(mountDir, 0); err != nil {
				return fmt.Errorf("unmount %s: %w", mountDir, err)
			}
			return serr
		},
		curlPeers(b, "https://"+lis.Addr().String()+"/artifacts/"+mod.Digest, filepath.Join(cp.DataDir, daemon.AdminDir, daemon.AdminCAFile), filepath.Dir(path), mod.Digest)...)
}

// curlPeers fetch the module's bytes with curl from the netboot HTTP
// server over TLS: into a file in the same cache directory ("curl"), and
// through sha256sum without a file ("curl-sha256sum"), which is the
// agent's fetch + verify without its cache write. Each curl is a new
// process with a full TLS handshake; the agent's fetcher reuses its
// connection. Without curl there are no peers (the benchmark says so).
func curlPeers(b *testing.B, url, caFile, dir, digest string) []fetchbench.Peer {
	if _, err := exec.LookPath("curl"); err != nil {
		b.Log("curl is not installed (apt-get install curl): no curl peer")
		return nil
	}
	out := filepath.Join(dir, "curl.out")
	curl := []string{"-sS", "--fail", "--cacert", caFile}
	want := strings.TrimPrefix(digest, "sha256:")
	return []fetchbench.Peer{
		{Name: "curl", Fetch: func() error {
			os.Remove(out)
			if msg, err := exec.Command("curl", append(curl, "-o", out, url)...).CombinedOutput(); err != nil {
				return fmt.Errorf("curl %s: %v: %s", url, err, msg)
			}
			return os.Remove(out)
		}},
		{Name: "curl-sha256sum", Fetch: func() error {
			cmd := exec.Command("sh", "-c", `curl "$@" | sha256sum`, "sh")
			cmd.Args = append(cmd.Args, append(curl, url)...)
			msg, err := cmd.CombinedOutput()
			if err != nil {
				return fmt.Errorf("curl %s | sha256sum: %v: %s", url, err, msg)
			}
			if got, _, _ := strings.Cut(string(msg), " "); got != want {
				return fmt.Errorf("curl %s | sha256sum: got %q, want %s", url, msg, want)
			}
			return nil
		}},
	}
}
