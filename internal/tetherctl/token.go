package tetherctl

import (
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func (a *App) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Bootstrap tokens"}
	var id string
	var ttl time.Duration
	create := &cobra.Command{Use: "create --instance ID", Short: "Issue a one-time enrollment token (printed once)", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		req := &v1.CreateBootstrapTokenRequest{InstanceId: id, TtlSeconds: int32(ttl / time.Second)}
		return call(a, v1.AdminServiceClient.CreateBootstrapToken, req, func(w *tabwriter.Writer, resp *v1.CreateBootstrapTokenResponse) {
			row(w, "token:", resp.Token)
			row(w, "instance:", resp.InstanceId)
			row(w, "expires:", when(resp.ExpiresAt))
			row(w, "kernel args:", "tether.url="+resp.ControlPlaneUrl+" tether.token="+resp.Token+" tether.ca="+resp.CaFingerprint)
		})
	}}
	create.Flags().StringVar(&id, "instance", "", "instance id (required)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (default 24h)")
	_ = create.MarkFlagRequired("instance")
	cmd.AddCommand(create)
	return cmd
}
