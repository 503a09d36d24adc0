// Package tetherctl is the operator CLI over the admin gRPC API. Every
// command prints a table by default, or one JSON document with -o json;
// errors go to stderr with a non-zero exit status.
package tetherctl

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/apierr"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// ExitInterrupted is the exit status after Ctrl-C or SIGTERM, as a shell
// reports a process killed by SIGINT.
const ExitInterrupted = 130

// App holds what every command shares.
type App struct {
	ConfigPath string
	Endpoint   string
	Output     string
	Timeout    time.Duration

	Stdout, Stderr io.Writer

	// base ends when the user interrupts; every call and poll derives from it.
	base   context.Context
	conn   *grpc.ClientConn
	client v1.AdminServiceClient
	leaf   *x509.Certificate // the client certificate, once dialled
	target string
	cfgSrc string
	// signWith are the signer keys of module push/build --sign-with.
	signWith []string
}

// Main runs the CLI and returns the process exit status. Ctrl-C and
// SIGTERM cancel the running call or poll, and the command returns.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first interrupt a second one kills at once, should
		// anything fail to end promptly.
		<-ctx.Done()
		stop()
	}()
	return Run(ctx, args, stdout, stderr)
}

// Run is Main with the caller's context: cancelling ctx is an interrupt.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := &App{Stdout: stdout, Stderr: stderr, base: ctx}
	root := app.root()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if app.conn != nil {
		app.conn.Close()
	}
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "tetherctl: interrupted")
		return ExitInterrupted
	default:
		fmt.Fprintln(stderr, "tetherctl:", app.explain(err))
		return 1
	}
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
		a.poolCmd(), a.certCmd(), a.eventsCmd(), a.dashboardCmd(), a.netbootCmd(), a.signerCmd(), a.identityCmd(), a.auditCmd(), a.credentialCmd(), a.bootimageCmd(), a.caCmd())
	return cmd
}

// ctx bounds one call by --timeout; an interrupt ends it too.
func (a *App) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(a.base, a.Timeout)
}

// explain turns a gRPC failure into a sentence that says which file, which
// address and what the server said. It branches on codes and on the
// server's structured reasons, never on the server's words.
func (a *App) explain(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	where := a.target
	// The server's message can quote what a node reported.
	msg := printable(st.Message())
	switch st.Code() {
	case codes.Unavailable:
		if apierr.Reason(err) == apierr.DatabaseUnavailable {
			return fmt.Sprintf("tetherd at %s is up but its database is not: %s\n  tetherd reconnects by itself; retry in a moment", where, msg)
		}
		// A failed handshake never reaches the server: the status is the
		// client transport's own, and its text is all gRPC gives us.
		if closedAtAccept(st.Message()) {
			return fmt.Sprintf("tetherd at %s accepted the connection and closed it before TLS finished: %s\n"+
				"  it is running, but at a connection limit (too many connections in all, or too many unauthenticated ones from this address);\n"+
				"  its log says which, and tether_connections_refused_total counts them; retry in a moment (config: %s)", where, msg, a.cfgSrc)
		}
		if isTLSFailure(st.Message()) {
			return fmt.Sprintf("TLS with %s failed: %s\n  the server certificate must be signed by the CA in %s and name %q", where, msg, a.cfgSrc, where)
		}
		return fmt.Sprintf("cannot reach tetherd at %s: %s\n  is `tetherd serve` running there? (config: %s)", where, msg, a.cfgSrc)
	case codes.Unauthenticated:
		return fmt.Sprintf("%s refused our identity: %s\n  (client certificate from %s)", where, msg, a.cfgSrc)
	case codes.PermissionDenied:
		return fmt.Sprintf("permission denied by %s: %s", where, msg)
	case codes.DeadlineExceeded:
		return fmt.Sprintf("%s did not answer within %s (raise --timeout?)", where, a.Timeout)
	default:
		return fmt.Sprintf("%s: %s", codeWords(st.Code()), msg)
	}
}

// closedAtAccept reports a handshake the server ended by closing the
// connection before any TLS answer: what tetherd's connection limits do
// (controlplane/connlimit). Nothing listening is "connection refused"
// instead, which still reads as "cannot reach".
func closedAtAccept(transportMsg string) bool {
	return strings.Contains(transportMsg, "handshake failed") &&
		(strings.HasSuffix(transportMsg, "EOF\"") || strings.HasSuffix(transportMsg, "EOF") || strings.Contains(transportMsg, "connection reset by peer"))
}

func isTLSFailure(transportMsg string) bool {
	return strings.Contains(transportMsg, "certificate") || strings.Contains(transportMsg, "tls:")
}

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

// sleep waits d, or returns the context's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
