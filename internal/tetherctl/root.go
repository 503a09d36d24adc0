// Package tetherctl is the operator CLI over the admin gRPC API. Every
// command prints a table by default, or one JSON document with -o json;
// errors go to stderr with a non-zero exit status.
package tetherctl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"gopkg.in/yaml.v3"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// App holds what every command shares.
type App struct {
	ConfigPath string
	Endpoint   string
	Output     string
	Timeout    time.Duration

	Stdout, Stderr io.Writer

	conn   *grpc.ClientConn
	client v1.AdminServiceClient
	target string
	cfgSrc string
	// signWith are the signer keys of module push/build --sign-with.
	signWith []string
}

// Main runs the CLI and returns the process exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	app := &App{Stdout: stdout, Stderr: stderr}
	root := app.root()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if app.conn != nil {
		app.conn.Close()
	}
	if err != nil {
		fmt.Fprintln(stderr, "tetherctl:", app.explain(err))
		return 1
	}
	return 0
}

func (a *App) root() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "tetherctl",
		Short:         "Operate a Tether fleet",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if a.Output != "table" && a.Output != "json" {
				return fmt.Errorf("-o %q: want table or json", a.Output)
			}
			return nil
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&a.ConfigPath, "config", "", "client config (default $TETHERCONFIG, then ~/.config/tether/config.yaml)")
	pf.StringVar(&a.Endpoint, "endpoint", "", "HOST:PORT of tetherd (overrides the config's endpoint)")
	pf.StringVarP(&a.Output, "output", "o", "table", "table or json")
	pf.DurationVar(&a.Timeout, "timeout", 30*time.Second, "deadline for each call (streams excepted)")
	cmd.AddCommand(a.templateCmd(), a.moduleCmd(), a.nodeCmd(), a.instanceCmd(), a.tokenCmd(), a.taskCmd(),
		a.poolCmd(), a.certCmd(), a.eventsCmd(), a.signerCmd(), a.identityCmd(), a.auditCmd())
	return cmd
}

type clientConfig struct {
	Endpoint string `yaml:"endpoint"`
	CA       string `yaml:"ca"`
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
}

func (a *App) configPath() (string, string) {
	if a.ConfigPath != "" {
		return a.ConfigPath, "--config"
	}
	if p := os.Getenv("TETHERCONFIG"); p != "" {
		return p, "$TETHERCONFIG"
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".config", "tether", "config.yaml"), "the default location"
}

// dial connects once per process.
func (a *App) dial() (v1.AdminServiceClient, error) {
	if a.client != nil {
		return a.client, nil
	}
	path, src := a.configPath()
	a.cfgSrc = fmt.Sprintf("%s (from %s)", path, src)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read client config %s: %w\n  hint: `tetherd init --data-dir DIR` writes one to DIR/admin/tetherconfig.yaml; pass it with --config or $TETHERCONFIG", a.cfgSrc, err)
	}
	var cfg clientConfig
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("parse client config %s: %w", a.cfgSrc, err)
	}
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(filepath.Dir(path), p)
	}
	for _, f := range []struct{ name, v string }{{"ca", cfg.CA}, {"cert", cfg.Cert}, {"key", cfg.Key}} {
		if f.v == "" {
			return nil, fmt.Errorf("client config %s: %q is not set", a.cfgSrc, f.name)
		}
	}
	caPEM, err := os.ReadFile(rel(cfg.CA))
	if err != nil {
		return nil, fmt.Errorf("client config %s: CA certificate: %w", a.cfgSrc, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("client config %s: %s holds no PEM certificate", a.cfgSrc, rel(cfg.CA))
	}
	cert, err := tls.LoadX509KeyPair(rel(cfg.Cert), rel(cfg.Key))
	if err != nil {
		return nil, fmt.Errorf("client config %s: client certificate %s / key %s: %w", a.cfgSrc, rel(cfg.Cert), rel(cfg.Key), err)
	}
	a.target = cfg.Endpoint
	if a.Endpoint != "" {
		a.target = a.Endpoint
	}
	if a.target == "" {
		return nil, fmt.Errorf("no endpoint: set endpoint in %s or pass --endpoint HOST:PORT", a.cfgSrc)
	}
	host, _, err := net.SplitHostPort(a.target)
	if err != nil {
		return nil, fmt.Errorf("endpoint %q: want HOST:PORT", a.target)
	}
	tlsCfg := &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: host, MinVersion: tls.VersionTLS13}
	conn, err := grpc.NewClient(a.target, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", a.target, err)
	}
	a.conn, a.client = conn, v1.NewAdminServiceClient(conn)
	return a.client, nil
}

func (a *App) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), a.Timeout)
}

// explain turns a gRPC failure into a sentence that says which file, which
// address and what the server said.
func (a *App) explain(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	where := a.target
	switch st.Code() {
	case codes.Unavailable:
		msg := st.Message()
		if strings.Contains(msg, "database is unavailable") {
			return fmt.Sprintf("tetherd at %s is up but its database is not: %s\n  tetherd reconnects by itself; retry in a moment", where, msg)
		}
		if strings.Contains(msg, "certificate") || strings.Contains(msg, "tls:") {
			return fmt.Sprintf("TLS with %s failed: %s\n  the server certificate must be signed by the CA in %s and name %q", where, msg, a.cfgSrc, where)
		}
		return fmt.Sprintf("cannot reach tetherd at %s: %s\n  is `tetherd serve` running there? (config: %s)", where, msg, a.cfgSrc)
	case codes.Unauthenticated:
		return fmt.Sprintf("%s refused our identity: %s\n  (client certificate from %s)", where, st.Message(), a.cfgSrc)
	case codes.PermissionDenied:
		return fmt.Sprintf("permission denied by %s: %s", where, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Sprintf("%s did not answer within %s (raise --timeout?)", where, a.Timeout)
	default:
		return fmt.Sprintf("%s: %s", codeWords(st.Code()), st.Message())
	}
}

var jsonOut = protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}

// print writes m as JSON, or calls table.
func (a *App) print(m proto.Message, table func(w *tabwriter.Writer)) error {
	if a.Output == "json" {
		b, err := jsonOut.Marshal(m)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(a.Stdout, string(b))
		return err
	}
	w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
	table(w)
	return w.Flush()
}

func row(w io.Writer, cols ...any) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprint(c)
	}
	fmt.Fprintln(w, strings.Join(parts, "\t"))
}

func when(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

func ago(t *timestamppb.Timestamp) string {
	if t == nil {
		return "never"
	}
	d := time.Since(t.AsTime()).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// enumText shows INSTANCE_STATUS_RUNNING as running.
func enumText(full, prefix string) string {
	s := strings.ToLower(strings.TrimPrefix(full, prefix))
	if s == "unspecified" {
		return "-"
	}
	return s
}

// splitRef parses NAME:VERSION.
func splitRef(s string) (string, string, error) {
	name, version, ok := strings.Cut(s, ":")
	if !ok || name == "" || version == "" {
		return "", "", fmt.Errorf("%q: want NAME:VERSION", s)
	}
	return name, version, nil
}

var errUsage = errors.New("usage")

// codeWords renders FailedPrecondition as "failed precondition".
func codeWords(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte(' ')
		}
		b.WriteRune(r)
	}
	return strings.ToLower(b.String())
}
