// Command tether-bench drives load against a running tetherd and prints
// the results as Markdown table rows for docs/benchmarks.md.
//
//	tether-bench enroll     --config DIR/admin/tetherconfig.yaml --server-pid PID --clients 1,16,64 --n 2000
//	tether-bench push       --config ... --agents 1000 --tasks 1000
//	tether-bench heartbeats --config ... --server-pid PID --metrics http://ADDR/metrics --agents 1000 --interval 1s --duration 30s
//	tether-bench fleet      --config ... --server-pid PID --metrics http://ADDR/metrics --agents 10000 --enroll-rate 200 \
//	                        --heartbeat 30s --hold 3m --sources 16 --procs 2 [--identities DIR] [--push-tasks 400]
//	                        [--storm term|kill --series storm.json] [-o json]
//	tether-bench plot       --series storm.json --out storm.png
//	tether-bench chaos      --tetherd bin/tetherd --duration 2m --store sqlite|postgres   (make chaos)
//	tether-bench peers      --step-ca .cache/peers/bin/step-ca --tetherd bin/tetherd [--anyway] [-o json]   (make bench-peers)
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"gopkg.in/yaml.v3"

	"github.com/tetherfleet/tether/internal/tools/bench"
	"github.com/tetherfleet/tether/internal/tools/tinymodule"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func main() {
	cmds := map[string]func([]string) error{"enroll": enroll, "push": push, "heartbeats": heartbeats, "fleet": fleet, "chaos": chaosCmd, "plot": plotCmd, "peers": peers}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: tether-bench enroll|push|heartbeats|fleet|chaos|plot|peers [flags] (see the package comment)")
		os.Exit(2)
	}
	if err := cmds[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "tether-bench:", err)
		os.Exit(1)
	}
}

type config struct {
	Endpoint string `yaml:"endpoint"`
	CA       string `yaml:"ca"`
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
}

// target is a running tetherd reached with the admin config.
type target struct {
	admin v1.AdminServiceClient
	dial  func(*tls.Certificate) (*grpc.ClientConn, error)
}

func connectTarget(cfgPath string) (*target, error) {
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		return nil, err
	}
	var cfg config
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, err
	}
	rel := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(cfgPath), p)
	}
	caPEM, err := os.ReadFile(rel(cfg.CA))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(rel(cfg.Cert), rel(cfg.Key))
	if err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(cfg.Endpoint)
	dial := func(c *tls.Certificate) (*grpc.ClientConn, error) {
		t := &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS13}
		if c != nil {
			t.Certificates = []tls.Certificate{*c}
		}
		return grpc.NewClient(cfg.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(t)))
	}
	adminConn, err := dial(&cert)
	if err != nil {
		return nil, err
	}
	return &target{admin: v1.NewAdminServiceClient(adminConn), dial: dial}, nil
}

// seedNode makes a fresh module, template and node for a run.
func (t *target) seedNode(ctx context.Context) (string, error) {
	tag := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := tinymodule.Push(ctx, t.admin, tag, "1", tinymodule.Image()); err != nil {
		return "", err
	}
	if _, err := t.admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: tag, RootModules: []*v1.ModuleRef{{Name: tag, Version: "1"}}}); err != nil {
		return "", err
	}
	if _, err := t.admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: tag, Template: tag}); err != nil {
		return "", err
	}
	return tag, nil
}

func enroll(args []string) error {
	fs := flag.NewFlagSet("enroll", flag.ExitOnError)
	cfgPath := fs.String("config", "", "tetherctl config written by tetherd init")
	pid := fs.Int("server-pid", 0, "tetherd's pid, to report its CPU per enrollment")
	clients := fs.String("clients", "1,16,64", "concurrency levels")
	n := fs.Int("n", 2000, "enrollments per level")
	handshake := fs.Bool("handshake", false, "open a new TLS connection per enrollment")
	_ = fs.Parse(args)

	tg, err := connectTarget(*cfgPath)
	if err != nil {
		return err
	}
	ctx := context.Background()
	node, err := tg.seedNode(ctx)
	if err != nil {
		return err
	}
	admin, dial := tg.admin, tg.dial
	mode := "kept-alive"
	if *handshake {
		mode = "handshake per enrollment"
	}
	fmt.Println("| clients | connections | enrollments | enroll/s | p50 | p99 | server CPU/enrollment | load-gen CPU/enrollment |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, s := range strings.Split(*clients, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--clients: %w", err)
		}
		es, err := bench.PrepareEnrollments(ctx, admin, node, *n)
		if err != nil {
			return err
		}
		var before time.Duration
		if *pid > 0 {
			if before, err = bench.ProcessCPU(*pid); err != nil {
				return err
			}
		}
		r, err := bench.EnrollLoad(ctx, func() (*grpc.ClientConn, error) { return dial(nil) }, es, c, *handshake)
		if err != nil {
			return err
		}
		cpu := "-"
		if *pid > 0 {
			after, err := bench.ProcessCPU(*pid)
			if err != nil {
				return err
			}
			cpu = fmt.Sprintf("%.2f ms", float64((after-before).Microseconds())/1000/float64(r.N-r.Errors))
		}
		if err := r.Check(); err != nil {
			return fmt.Errorf("enroll at %d clients: %w", c, err)
		}
		if r.Errors > 0 {
			fmt.Fprintf(os.Stderr, "%d enrollments failed; first: %v\n", r.Errors, r.FirstError)
		}
		fmt.Printf("| %d | %s | %d | %.0f | %.1f ms | %.1f ms | %s | %.2f ms |\n", c, mode, r.N, r.Rate(),
			float64(r.P50.Microseconds())/1000, float64(r.P99.Microseconds())/1000, cpu,
			float64(r.ClientCPU.Microseconds())/1000/float64(max(1, r.N-r.Errors)))
	}
	return nil
}
