package tetherctl

import (
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func caTable(w *tabwriter.Writer, cs []*v1.CertificateAuthority) {
	row(w, "FINGERPRINT", "STATE", "NOT AFTER", "LIVE CERTIFICATES", "SUBJECT")
	for _, c := range cs {
		row(w, c.Fingerprint, c.State, when(c.NotAfter), strconv.FormatInt(c.LiveCertificates, 10), c.Subject)
	}
}

// caCmd is CA rotation (design §3.10): prepare, activate, retire.
func (a *App) caCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "The control plane's CAs: rotate without re-enrolling the fleet",
		Long: "A rotation is three steps, each on any replica:\n" +
			"  tetherctl ca prepare            a new CA, cross-signed by the active one; agents learn it over their stream\n" +
			"  tetherctl ca activate           the new CA signs from now on, and boots are handed its fingerprint\n" +
			"  tetherctl ca retire FINGERPRINT the old CA, once every certificate it signed has expired (ca list counts them)"}
	list := &cobra.Command{Use: "list", Short: "Every CA: fingerprint, state, end, live certificates it signed", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return call(a, v1.AdminServiceClient.ListCAs, &v1.ListCAsRequest{},
				func(w *tabwriter.Writer, r *v1.ListCAsResponse) { caTable(w, r.Authorities) })
		}}
	var keyType string
	prepare := &cobra.Command{Use: "prepare [--key p256|ed25519]", Short: "Make a new CA, trusted everywhere, signing nothing yet", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return call(a, v1.AdminServiceClient.PrepareCA, &v1.PrepareCARequest{KeyType: keyType}, one(caTable))
		}}
	prepare.Flags().StringVar(&keyType, "key", "", "the new CA's key type: p256 (default) or ed25519")
	activate := &cobra.Command{Use: "activate [FINGERPRINT]", Short: "Make the prepared CA the one that signs", Args: cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			req := &v1.ActivateCARequest{}
			if len(args) == 1 {
				req.Fingerprint = args[0]
			}
			return call(a, v1.AdminServiceClient.ActivateCA, req, one(caTable))
		}}
	retire := &cobra.Command{Use: "retire FINGERPRINT", Short: "Stop trusting a CA whose certificates have all expired", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return call(a, v1.AdminServiceClient.RetireCA, &v1.RetireCARequest{Fingerprint: args[0]}, one(caTable))
		}}
	cmd.AddCommand(list, prepare, activate, retire)
	return cmd
}
