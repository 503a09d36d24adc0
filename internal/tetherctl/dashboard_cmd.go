package tetherctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/internal/tetherctl/dashboard"
	"github.com/tetherfleet/tether/pki"
)

func (a *App) dashboardCmd() *cobra.Command {
	var listen string
	var open bool
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve the fleet dashboard on this machine, with this identity",
		Long: "Serves a web dashboard on a local address, talking to tetherd with the identity in the client\n" +
			"config (as `kubectl proxy` does): the browser never holds a key, and the page offers what\n" +
			"the identity's role allows. The printed URL carries a per-run secret; without it every\n" +
			"request gets 403. Ctrl-C stops it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			host, _, err := net.SplitHostPort(listen)
			if err != nil {
				return fmt.Errorf("--listen %q: want HOST:PORT", listen)
			}
			if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
				return fmt.Errorf("--listen %q: the dashboard acts with your identity, so it serves on a loopback address only (127.0.0.1 or [::1])", listen)
			}
			client, err := a.dial()
			if err != nil {
				return err
			}
			id, err := pki.IdentityOf(a.leaf)
			if err != nil {
				return fmt.Errorf("client certificate %s: %w", a.cfgSrc, err)
			}
			if id.Kind != pki.KindAdmin {
				return fmt.Errorf("client certificate %s is a %s identity; the dashboard needs an operator identity (viewer, operator or admin)", a.cfgSrc, id.Kind)
			}
			srv, err := dashboard.New(dashboard.Config{Client: client, Identity: id.Name, Role: id.Role, Endpoint: a.target})
			if err != nil {
				return err
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("dashboard: listen on %s: %w", listen, err)
			}
			url := srv.URL(lis.Addr().String())
			if a.Output == "json" {
				b, _ := json.Marshal(map[string]string{"url": url, "identity": id.Name, "role": id.Role, "endpoint": a.target})
				fmt.Fprintln(a.Stdout, string(b))
			} else {
				fmt.Fprintf(a.Stdout, "dashboard for %s (role %s) on tetherd %s:\n  %s\nCtrl-C stops it.\n", id.Name, id.Role, a.target, url)
			}
			if open {
				cleanup, err := openInBrowser(url, nil)
				if err != nil {
					fmt.Fprintf(a.Stderr, "tetherctl: %v; open the URL above by hand\n", err)
				}
				defer cleanup()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
			done := make(chan error, 1)
			go func() { done <- hs.Serve(lis) }()
			select {
			case err := <-done:
				return fmt.Errorf("dashboard: serve: %w", err)
			case <-ctx.Done():
			}
			// Live pages hold event streams open; give them a moment, then cut them.
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("dashboard: shutdown: %w", err)
			}
			_ = hs.Close()
			fmt.Fprintln(a.Stderr, "dashboard stopped")
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "loopback HOST:PORT to serve on (port 0 picks one)")
	cmd.Flags().BoolVar(&open, "open", false, "open the dashboard in a browser (xdg-open on a private local page that redirects to it, so the URL's secret is on no command line)")
	return cmd
}
