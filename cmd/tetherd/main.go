// Command tetherd is the Tether control plane: `tetherd init` creates a data
// dir (CA, server certificate, admin identity); `tetherd serve` runs it.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/controlplane/daemon"
)

func main() {
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tetherd:", err)
		os.Exit(1)
	}
}

func root() *cobra.Command {
	cmd := &cobra.Command{Use: "tetherd", Short: "Tether control plane", SilenceUsage: true, SilenceErrors: true}
	cmd.AddCommand(initCmd(), serveCmd(), backupCmd(), restoreCmd(), renewServerCertCmd())
	return cmd
}

func initCmd() *cobra.Command {
	var o daemon.InitOptions
	cmd := &cobra.Command{
		Use:   "init --data-dir DIR",
		Short: "Create the CA, the server certificate and an admin identity in DIR",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := daemon.Init(o); err != nil {
				return err
			}
			if o.RotateAdmin {
				fmt.Printf("issued a new admin identity certificate in %s/%s\n  the next start of tetherd serve records it and revokes every earlier admin certificate: restart tetherd now\n",
					o.DataDir, daemon.AdminDir)
				return nil
			}
			fmt.Printf("initialised %s\n  admin client config: %s/%s/%s\n  next: tetherd serve --data-dir %s\n",
				o.DataDir, o.DataDir, daemon.AdminDir, daemon.ClientConfig, o.DataDir)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.DataDir, "data-dir", "", "data directory to create (required)")
	cmd.Flags().StringSliceVar(&o.Advertise, "advertise", nil, "extra host names or addresses for the server certificate")
	cmd.Flags().StringVar(&o.Endpoint, "endpoint", "127.0.0.1:7443", "address written into the admin client config")
	cmd.Flags().BoolVar(&o.RotateAdmin, "rotate-admin", false, "in an existing data dir, replace only the admin identity: a new key and certificate in DIR/admin; the next tetherd serve revokes the old ones")
	cmd.Flags().StringVar(&o.CAKey, "ca-key", "p256", "CA key type: p256 (every TLS stack and openssl take it) or ed25519 (signs node certificates for less CPU; Go clients, the agent and grpcurl take it)")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}

func renewServerCertCmd() *cobra.Command {
	var o daemon.RenewServerCertOptions
	cmd := &cobra.Command{
		Use:   "renew-server-cert --data-dir DIR",
		Short: "Issue a new server certificate under the data dir's CA; a running tetherd picks it up without a restart",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			hosts, until, err := daemon.RenewServerCert(o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote a new server certificate for %v, valid until %s\n"+
				"  a running tetherd serves it within 10 s, or at once after: kill -HUP $(pidof tetherd)\n", hosts, until)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.DataDir, "data-dir", "", "the data dir (required)")
	cmd.Flags().StringSliceVar(&o.Advertise, "advertise", nil, "extra host names or addresses for the certificate (it keeps those it has)")
	_ = cmd.MarkFlagRequired("data-dir")
	return cmd
}
