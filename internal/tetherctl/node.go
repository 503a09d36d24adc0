package tetherctl

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/structpb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func nodeTable(w *tabwriter.Writer, ns []*v1.Node) {
	row(w, "NAME", "TEMPLATE", "ENABLED", "PUBLIC ADDRESS", "MACS", "BMC", "TPM", "CREATED")
	for _, n := range ns {
		bmc := "-"
		if b := n.Bmc; b != nil {
			bmc = b.Address + " (" + b.Credential + ")"
			if b.InsecureSkipVerify {
				bmc += " UNVERIFIED TLS"
			}
		}
		row(w, n.Name, n.TemplateName, n.Enabled, dash(n.PublicAddress), dash(strings.Join(n.Macs, ",")), bmc, nodeTPM(n), when(n.CreatedAt))
	}
}

// nodeTPM says what binds the node's identity: its EK hashes in full (an
// operator compares them with what the machine reports), and whether a
// token alone is refused.
func nodeTPM(n *v1.Node) string {
	s := dash(strings.Join(n.EkHashes, ","))
	if n.RequireAttestation {
		s += " (attestation required)"
	}
	return s
}

func parseConfig(s string) (*structpb.Struct, error) {
	if s == "" {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("--config-json: want a JSON object: %w", err)
	}
	return structpb.NewStruct(m)
}

func (a *App) nodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Manage nodes (logical hosts)"}
	var createReq v1.CreateNodeRequest
	var createCfg string
	var disabled bool
	var createBMC, updateBMC bmcFlags
	create := &cobra.Command{Use: "create NAME --template TEMPLATE [--mac MAC --bmc redfish://HOST/redfish/v1/Systems/ID --bmc-credentials NAME]", Short: "Create a node", Args: cobra.ExactArgs(1), RunE: func(cmd *cobra.Command, args []string) error {
		var err error
		createReq.Name = args[0]
		if createBMC.changed(cmd) {
			if createReq.Bmc, err = createBMC.apply(cmd, nil); err != nil {
				return err
			}
		}
		if createReq.Config, err = parseConfig(createCfg); err != nil {
			return err
		}
		enabled := !disabled
		createReq.Enabled = &enabled
		return call(a, v1.AdminServiceClient.CreateNode, &createReq, one(nodeTable))
	}}
	create.Flags().StringVar(&createReq.Template, "template", "", "template the node boots (required)")
	create.Flags().StringVar(&createCfg, "config-json", "", "free-form JSON object")
	create.Flags().StringVar(&createReq.PublicAddress, "public-address", "", "public address")
	create.Flags().StringArrayVar(&createReq.Macs, "mac", nil, "hardware address of a NIC the machine netboots from (repeatable)")
	create.Flags().BoolVar(&disabled, "disabled", false, "create the node disabled")
	create.Flags().StringArrayVar(&createReq.EkHashes, "ek", nil, "sha256:HEX of the machine's TPM endorsement key; such a node boots with no token (repeatable; admin only)")
	create.Flags().BoolVar(&createReq.RequireAttestation, "require-attestation", false, "refuse token enrollment: only the TPM bound with --ek may enroll (admin only)")
	createBMC.add(create.Flags(), false)
	_ = create.MarkFlagRequired("template")

	var updateReq v1.UpdateNodeRequest
	var updateCfg string
	var clearEK bool
	update := &cobra.Command{Use: "update NAME [--template T] [--enabled=BOOL] [--config-json J] [--public-address A] [--mac MAC...] [--ek sha256:HEX... | --clear-ek] [--require-attestation=BOOL]", Short: "Change a node", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			updateReq.Name = args[0]
			for flag, field := range map[string]string{"template": "template", "enabled": "enabled", "config-json": "config", "public-address": "public_address", "mac": "macs", "ek": "ek_hashes", "clear-ek": "ek_hashes", "require-attestation": "require_attestation"} {
				if cmd.Flags().Changed(flag) && !slices.Contains(updateReq.UpdateMask, field) {
					updateReq.UpdateMask = append(updateReq.UpdateMask, field)
				}
			}
			if clearEK {
				if len(updateReq.EkHashes) > 0 {
					return fmt.Errorf("--clear-ek and --ek: give one (--ek replaces the set, --clear-ek empties it)")
				}
				updateReq.EkHashes = nil
			}
			// --ek "" clears the set as --clear-ek does, like --mac "".
			updateReq.EkHashes = slices.DeleteFunc(updateReq.EkHashes, func(h string) bool { return h == "" })
			// --mac "" clears the set: an empty address means none.
			updateReq.Macs = slices.DeleteFunc(updateReq.Macs, func(m string) bool { return m == "" })
			if updateReq.Config, err = parseConfig(updateCfg); err != nil {
				return err
			}
			if updateBMC.changed(cmd) {
				// The BMC is written whole: start from the node's own.
				cur, err := invoke(a, v1.AdminServiceClient.GetNode, &v1.GetNodeRequest{Name: args[0]})
				if err != nil {
					return err
				}
				if updateReq.Bmc, err = updateBMC.apply(cmd, cur.Bmc); err != nil {
					return err
				}
				updateReq.UpdateMask = append(updateReq.UpdateMask, "bmc")
			}
			return call(a, v1.AdminServiceClient.UpdateNode, &updateReq, one(nodeTable))
		}}
	update.Flags().StringVar(&updateReq.Template, "template", "", "template")
	update.Flags().BoolVar(&updateReq.Enabled, "enabled", true, "enable or disable provisioning")
	update.Flags().StringVar(&updateCfg, "config-json", "", "free-form JSON object")
	update.Flags().StringVar(&updateReq.PublicAddress, "public-address", "", "public address")
	update.Flags().StringArrayVar(&updateReq.Macs, "mac", nil, "the node's hardware addresses, replacing the current set (repeatable; --mac \"\" clears)")
	update.Flags().StringArrayVar(&updateReq.EkHashes, "ek", nil, "sha256:HEX of a TPM endorsement key, replacing the node's set (repeatable; admin only)")
	update.Flags().BoolVar(&clearEK, "clear-ek", false, "remove every EK: the node boots with a token again (admin only)")
	update.Flags().BoolVar(&updateReq.RequireAttestation, "require-attestation", false, "refuse token enrollment (=false allows it again; admin only)")
	updateBMC.add(update.Flags(), true)

	var tpl string
	var pg paging
	listCmd := &cobra.Command{Use: "list", Short: "List nodes", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		return list(a, v1.AdminServiceClient.ListNodes, &v1.ListNodesRequest{Template: tpl}, pg,
			func(w *tabwriter.Writer, r *v1.ListNodesResponse) { nodeTable(w, r.Nodes) })
	}}
	listCmd.Flags().StringVar(&tpl, "template", "", "only nodes of this template")
	pg.flags(listCmd.Flags(), 0, "nodes")
	get := &cobra.Command{Use: "get NAME", Short: "Show a node", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.GetNode, &v1.GetNodeRequest{Name: args[0]}, one(nodeTable))
	}}
	del := &cobra.Command{Use: "delete NAME", Short: "Delete a node with no live instance", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.DeleteNode, &v1.DeleteNodeRequest{Name: args[0]}, deleted[*v1.DeleteNodeResponse]("node", args[0]))
	}}
	cmd.AddCommand(create, update, listCmd, get, del, a.nodeAdoptCmd())
	return cmd
}

// nodeAdoptCmd binds a machine seen netbooting (tetherctl netboot seen) to
// a node by its hardware address and the EK it announced.
func (a *App) nodeAdoptCmd() *cobra.Command {
	var req v1.AdoptNodeRequest
	adopt := &cobra.Command{Use: "adopt MAC [--ek sha256:HEX [--unseen]] [--template T] [--name N]",
		Short: "Bind a machine seen netbooting, by its MAC and TPM endorsement key, to a node (admin only)",
		Long: "Creates the node (with --template; named --name, or m-<address digits>) or adds the address and the EK to\n" +
			"the node that has the address (or the one --name names), and records node.adopted, in one audited call.\n" +
			"Without --ek the one EK the machine announced for MAC is bound (tetherctl netboot seen); an EK that was\n" +
			"not announced for MAC is refused unless --unseen says it was read elsewhere (the machine's console, its\n" +
			"EK certificate). An announcement is only a hint: compare the hash with the machine's console.",
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			req.Mac = args[0]
			return call(a, v1.AdminServiceClient.AdoptNode, &req, func(w *tabwriter.Writer, resp *v1.AdoptNodeResponse) {
				nodeTable(w, []*v1.Node{resp.Node})
				how := "updated"
				if resp.Created {
					how = "created"
				}
				seen := "as the machine announced it"
				if !resp.Announced {
					seen = "not announced by the machine (--unseen)"
				}
				row(w, "")
				row(w, fmt.Sprintf("Node %s %s; its TPM is bound %s. Boot it with: tetherctl instance provision --node %s --provider PROVIDER", resp.Node.GetName(), how, seen, resp.Node.GetName()))
			})
		}}
	adopt.Flags().StringVar(&req.EkHash, "ek", "", "sha256:HEX of the machine's TPM endorsement key (default: the one it announced)")
	adopt.Flags().StringVar(&req.Template, "template", "", "template of the node, required when it is created")
	adopt.Flags().StringVar(&req.Name, "name", "", "the node (default: the node that has MAC, else m-<address digits>)")
	adopt.Flags().BoolVar(&req.Unseen, "unseen", false, "bind --ek although the machine did not announce it for MAC")
	return adopt
}
