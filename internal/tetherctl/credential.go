package tetherctl

import (
	"bytes"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func credentialTable(w *tabwriter.Writer, cs []*v1.Credential) {
	row(w, "NAME", "USERNAME", "CREATED")
	for _, c := range cs {
		row(w, c.Name, c.Username, when(c.CreatedAt))
	}
}

// readPassword reads a password file: its first line, without the line
// end, so `echo secret > f` works as expected.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--password-file: %w", err)
	}
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		if len(bytes.TrimSpace(b[i:])) > 0 {
			return "", fmt.Errorf("--password-file %s: holds more than one line; put only the password in it", path)
		}
		b = b[:i]
	}
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) == 0 {
		return "", fmt.Errorf("--password-file %s: is empty", path)
	}
	return string(b), nil
}

// credentialCmd manages BMC credentials. The password is read from a
// file (never a flag, which would land in shell history and ps) and is
// never shown again.
func (a *App) credentialCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "credential", Short: "BMC credentials (stored sealed; passwords are never shown)"}
	var req v1.CreateCredentialRequest
	var pwFile string
	create := &cobra.Command{Use: "create NAME --username U --password-file F", Short: "Store a BMC credential (admin)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			pw, err := readPassword(pwFile)
			if err != nil {
				return err
			}
			req.Name, req.Password = args[0], pw
			return call(a, v1.AdminServiceClient.CreateCredential, &req, one(credentialTable))
		}}
	create.Flags().StringVar(&req.Username, "username", "", "the BMC user name (required)")
	create.Flags().StringVar(&pwFile, "password-file", "", "file holding the password on its first line (required)")
	_ = create.MarkFlagRequired("username")
	_ = create.MarkFlagRequired("password-file")
	listCmd := &cobra.Command{Use: "list", Short: "List credentials (names and user names only)", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		return call(a, v1.AdminServiceClient.ListCredentials, &v1.ListCredentialsRequest{},
			func(w *tabwriter.Writer, r *v1.ListCredentialsResponse) { credentialTable(w, r.Credentials) })
	}}
	del := &cobra.Command{Use: "delete NAME", Short: "Delete a credential no node uses (admin)", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.DeleteCredential, &v1.DeleteCredentialRequest{Name: args[0]}, deleted[*v1.DeleteCredentialResponse]("credential", args[0]))
	}}
	var upd v1.UpdateCredentialRequest
	var updFile string
	update := &cobra.Command{Use: "update NAME --password-file F [--username U]", Short: "Replace a credential's password, for every node that names it (admin)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			pw, err := readPassword(updFile)
			if err != nil {
				return err
			}
			upd.Name, upd.Password = args[0], pw
			return call(a, v1.AdminServiceClient.UpdateCredential, &upd, one(credentialTable))
		}}
	update.Flags().StringVar(&upd.Username, "username", "", "a new user name (default: keep it)")
	update.Flags().StringVar(&updFile, "password-file", "", "file holding the new password on its first line (required)")
	_ = update.MarkFlagRequired("password-file")
	cmd.AddCommand(create, update, listCmd, del)
	return cmd
}

// bmcFlags are a node's BMC settings on node create and update.
type bmcFlags struct {
	address, credential, caFile, fingerprint, bootMode string
	insecure                                           bool
}

var bmcFlagNames = []string{"bmc", "bmc-credentials", "bmc-ca", "bmc-fingerprint", "bmc-insecure-skip-verify", "bmc-boot-mode"}

func (b *bmcFlags) add(f *pflag.FlagSet, update bool) {
	addr := "the machine's BMC: redfish://HOST[:PORT]/redfish/v1/Systems/ID (needs --mac and --bmc-credentials)"
	if update {
		addr += "; --bmc \"\" removes it"
	}
	f.StringVar(&b.address, "bmc", "", addr)
	f.StringVar(&b.credential, "bmc-credentials", "", "name of the stored credential that opens the BMC (tetherctl credential create)")
	f.StringVar(&b.caFile, "bmc-ca", "", "PEM file of the CA certificates that verify the BMC's certificate")
	f.StringVar(&b.fingerprint, "bmc-fingerprint", "", "pin the BMC's certificate: sha256:HEX over its DER bytes")
	f.BoolVar(&b.insecure, "bmc-insecure-skip-verify", false, "accept any BMC certificate (labs only; every use raises a warning event)")
	f.StringVar(&b.bootMode, "bmc-boot-mode", "", "boot override mode: uefi or legacy (default: leave the BMC's)")
}

func (b *bmcFlags) changed(cmd *cobra.Command) bool {
	for _, n := range bmcFlagNames {
		if cmd.Flags().Changed(n) {
			return true
		}
	}
	return false
}

// apply sets the changed flags on cur (nil: none yet) and returns the
// node's whole BMC; nil when --bmc "" removes it.
func (b *bmcFlags) apply(cmd *cobra.Command, cur *v1.NodeBMC) (*v1.NodeBMC, error) {
	out := &v1.NodeBMC{}
	if cur != nil {
		out = cur
	}
	f := cmd.Flags()
	if f.Changed("bmc") {
		if b.address == "" {
			return nil, nil
		}
		out.Address = b.address
	}
	if f.Changed("bmc-credentials") {
		out.Credential = b.credential
	}
	if f.Changed("bmc-ca") {
		out.CaPem = ""
		if b.caFile != "" {
			pem, err := os.ReadFile(b.caFile)
			if err != nil {
				return nil, fmt.Errorf("--bmc-ca: %w", err)
			}
			out.CaPem = string(pem)
		}
	}
	if f.Changed("bmc-fingerprint") {
		out.Fingerprint = b.fingerprint
	}
	if f.Changed("bmc-insecure-skip-verify") {
		out.InsecureSkipVerify = b.insecure
	}
	if f.Changed("bmc-boot-mode") {
		out.BootMode = b.bootMode
	}
	if out.Address == "" {
		return nil, fmt.Errorf("--bmc redfish://HOST/redfish/v1/Systems/ID is required with the other --bmc-* flags")
	}
	return out, nil
}
