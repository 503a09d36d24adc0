package tetherctl

import (
	"text/tabwriter"

	"github.com/spf13/cobra"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func certTable(w *tabwriter.Writer, cs []*v1.Certificate) {
	row(w, "SERIAL", "INSTANCE", "KIND", "NOT AFTER", "REVOKED")
	for _, ct := range cs {
		revoked := "-"
		if ct.RevokedAt != nil {
			revoked = when(ct.RevokedAt) + " " + ct.RevokeReason
		}
		row(w, ct.Serial, dash(ct.InstanceId), enumText(ct.Kind.String(), "CERTIFICATE_KIND_"), when(ct.NotAfter), revoked)
	}
}

func (a *App) certCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cert", Short: "Issued certificates"}
	var instance string
	var pg paging
	listCmd := &cobra.Command{Use: "list [--instance ID]", Short: "List certificates", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		return list(a, v1.AdminServiceClient.ListCertificates, &v1.ListCertificatesRequest{InstanceId: instance}, pg,
			func(w *tabwriter.Writer, r *v1.ListCertificatesResponse) { certTable(w, r.Certificates) })
	}}
	listCmd.Flags().StringVar(&instance, "instance", "", "only this instance's certificates")
	pg.flags(listCmd.Flags(), 0, "certificates")
	var reason string
	revoke := &cobra.Command{Use: "revoke SERIAL", Short: "Revoke a certificate", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.RevokeCertificate, &v1.RevokeCertificateRequest{Serial: args[0], Reason: reason},
			func(w *tabwriter.Writer, ct *v1.Certificate) {
				row(w, "revoked", ct.Serial, when(ct.RevokedAt), ct.RevokeReason)
			})
	}}
	revoke.Flags().StringVar(&reason, "reason", "", "why")
	cmd.AddCommand(listCmd, revoke)
	return cmd
}
