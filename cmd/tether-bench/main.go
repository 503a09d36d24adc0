// Command tether-bench drives load against a running tetherd and prints
// the results as Markdown table rows for docs/benchmarks.md.
//
//	tether-bench enroll --config DIR/admin/tetherconfig.yaml --server-pid PID --clients 1,16,64 --n 2000
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

	"github.com/tetherfleet/tether/internal/bench"
	"github.com/tetherfleet/tether/internal/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "enroll" {
		fmt.Fprintln(os.Stderr, "usage: tether-bench enroll --config FILE [--server-pid PID] [--clients 1,16,64] [--n 2000] [--handshake]")
		os.Exit(2)
	}
	if err := enroll(os.Args[2:]); err != nil {
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

func enroll(args []string) error {
	fs := flag.NewFlagSet("enroll", flag.ExitOnError)
	cfgPath := fs.String("config", "", "tetherctl config written by tetherd init")
	pid := fs.Int("server-pid", 0, "tetherd's pid, to report its CPU per enrollment")
	clients := fs.String("clients", "1,16,64", "concurrency levels")
	n := fs.Int("n", 2000, "enrollments per level")
	handshake := fs.Bool("handshake", false, "open a new TLS connection per enrollment")
	_ = fs.Parse(args)

	raw, err := os.ReadFile(*cfgPath)
	if err != nil {
		return err
	}
	var cfg config
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return err
	}
	rel := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(*cfgPath), p)
	}
	caPEM, err := os.ReadFile(rel(cfg.CA))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(rel(cfg.Cert), rel(cfg.Key))
	if err != nil {
		return err
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
		return err
	}
	admin := v1.NewAdminServiceClient(adminConn)
	ctx := context.Background()

	// A fresh template and node per run, so runs do not collide.
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	img := testcp.TinyErofs()
	if _, err := testcp.PushModule(ctx, admin, "bench-"+tag, "1", img); err != nil {
		return err
	}
	if _, err := admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "bench-" + tag, RootModules: []*v1.ModuleRef{{Name: "bench-" + tag, Version: "1"}}}); err != nil {
		return err
	}
	if _, err := admin.CreateNode(ctx, &v1.CreateNodeRequest{Name: "bench-" + tag, Template: "bench-" + tag}); err != nil {
		return err
	}
	mode := "kept-alive"
	if *handshake {
		mode = "handshake per enrollment"
	}
	fmt.Println("| clients | connections | enrollments | enroll/s | p50 | p99 | server CPU/enrollment |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, s := range strings.Split(*clients, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			return fmt.Errorf("--clients: %w", err)
		}
		es, err := bench.PrepareEnrollments(ctx, admin, "bench-"+tag, *n)
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
		if r.Errors > 0 {
			fmt.Fprintf(os.Stderr, "%d enrollments failed; first: %v\n", r.Errors, r.FirstError)
		}
		fmt.Printf("| %d | %s | %d | %.0f | %.1f ms | %.1f ms | %s |\n", c, mode, r.N, r.Rate(),
			float64(r.P50.Microseconds())/1000, float64(r.P99.Microseconds())/1000, cpu)
	}
	return nil
}
