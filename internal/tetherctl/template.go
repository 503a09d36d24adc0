package tetherctl

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func parseRefs(list []string) ([]*v1.ModuleRef, error) {
	var out []*v1.ModuleRef
	for _, item := range list {
		for _, s := range strings.Split(item, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			n, v, err := splitRef(s)
			if err != nil {
				return nil, err
			}
			out = append(out, &v1.ModuleRef{Name: n, Version: v})
		}
	}
	return out, nil
}

func refsText(rs []*v1.ModuleRef) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, r.Name+":"+r.Version)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func templateTable(w *tabwriter.Writer, ts []*v1.Template) {
	row(w, "NAME", "ROOT", "EXTENSIONS", "KERNEL ARGS", "CREATED")
	for _, t := range ts {
		row(w, t.Name, refsText(t.RootModules), refsText(t.ExtensionModules), dash(t.KernelArgs), when(t.CreatedAt))
	}
}

func templateDetail(w *tabwriter.Writer, t *v1.Template) {
	row(w, "name:", t.Name)
	row(w, "id:", t.Id)
	for i, m := range t.RootModules {
		row(w, fmt.Sprintf("root[%d]:", i), m.Name+":"+m.Version, m.Digest)
	}
	for i, m := range t.ExtensionModules {
		row(w, fmt.Sprintf("ext[%d]:", i), m.Name+":"+m.Version, m.Digest)
	}
	row(w, "kernel args:", dash(t.KernelArgs))
	row(w, "signed modules:", t.RequireSignedModules)
	row(w, "required signers:", dash(strings.Join(t.RequiredSigners, ",")))
	row(w, "attestation required:", t.RequireAttestation)
}

// templateFlags are the fields template create and update share.
func templateFlags(f *pflag.FlagSet, root, ext *[]string, kernelArgs *string, requireSigned *bool, kernel, initramfs *string) {
	f.StringSliceVar(root, "root", nil, "root layers, bottom first (NAME:VERSION, comma-separated or repeated)")
	f.StringSliceVar(ext, "ext", nil, "extension modules (NAME:VERSION)")
	f.StringVar(kernelArgs, "kernel-args", "", "extra kernel command line arguments")
	f.BoolVar(requireSigned, "require-signed", false, "agents refuse unsigned modules")
	f.StringVar(kernel, "kernel", "", "kernel artifact digest (default: the control plane's)")
	f.StringVar(initramfs, "initramfs", "", "initramfs artifact digest (default: the control plane's)")
}

// deleted renders the empty answer of a delete.
func deleted[T any](what, name string) func(*tabwriter.Writer, T) {
	return func(w *tabwriter.Writer, _ T) { row(w, "deleted "+what, name) }
}

func (a *App) templateCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage templates (what nodes boot)"}
	var root, ext []string
	var createReq v1.CreateTemplateRequest
	create := &cobra.Command{
		Use: "create NAME --root MOD:VER[,MOD:VER...] [--ext MOD:VER...]", Short: "Create a template", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			var err error
			createReq.Name = args[0]
			if createReq.RootModules, err = parseRefs(root); err != nil {
				return fmt.Errorf("--root %w", err)
			}
			if createReq.ExtensionModules, err = parseRefs(ext); err != nil {
				return fmt.Errorf("--ext %w", err)
			}
			return call(a, v1.AdminServiceClient.CreateTemplate, &createReq, one(templateTable))
		},
	}
	templateFlags(create.Flags(), &root, &ext, &createReq.KernelArgs, &createReq.RequireSignedModules, &createReq.KernelDigest, &createReq.InitramfsDigest)
	create.Flags().StringVar(&createReq.Console, "console", "", "kernel console: a console= value (ttyS0, ttyS1,115200n8, tty0) or none (default ttyS0)")
	create.Flags().StringArrayVar(&createReq.RequiredSigners, "require-signer", nil, "signer fingerprint (sha256:HEX) one of which must have signed every module (repeatable)")
	create.Flags().BoolVar(&createReq.RequireAttestation, "require-attestation", false, "refuse token enrollment for every node of the template: only TPM attestation (admin only)")
	_ = create.MarkFlagRequired("root")

	var updateRoot, updateExt []string
	var updateReq v1.UpdateTemplateRequest
	update := &cobra.Command{
		Use: "update NAME [--root ...] [--ext ...] [--kernel-args ...]", Short: "Change a template", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			updateReq.Name = args[0]
			f := cmd.Flags()
			if f.Changed("root") {
				updateReq.UpdateMask = append(updateReq.UpdateMask, "root_modules")
				if updateReq.RootModules, err = parseRefs(updateRoot); err != nil {
					return fmt.Errorf("--root %w", err)
				}
			}
			if f.Changed("ext") {
				updateReq.UpdateMask = append(updateReq.UpdateMask, "extension_modules")
				if updateReq.ExtensionModules, err = parseRefs(updateExt); err != nil {
					return fmt.Errorf("--ext %w", err)
				}
			}
			for flag, field := range map[string]string{"kernel-args": "kernel_args", "require-signed": "require_signed_modules", "kernel": "kernel_digest", "initramfs": "initramfs_digest", "console": "console", "require-signer": "required_signers", "require-attestation": "require_attestation"} {
				if f.Changed(flag) {
					updateReq.UpdateMask = append(updateReq.UpdateMask, field)
				}
			}
			return call(a, v1.AdminServiceClient.UpdateTemplate, &updateReq, one(templateTable))
		},
	}
	templateFlags(update.Flags(), &updateRoot, &updateExt, &updateReq.KernelArgs, &updateReq.RequireSignedModules, &updateReq.KernelDigest, &updateReq.InitramfsDigest)
	update.Flags().StringVar(&updateReq.Console, "console", "", "kernel console: a console= value or none")
	update.Flags().StringArrayVar(&updateReq.RequiredSigners, "require-signer", nil, "signer fingerprint (sha256:HEX), repeatable; replaces the list (pass --require-signer= to clear)")
	update.Flags().BoolVar(&updateReq.RequireAttestation, "require-attestation", false, "refuse token enrollment for the template's nodes (=false allows it again; admin only)")

	var pg paging
	listCmd := &cobra.Command{Use: "list", Short: "List templates", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
		return list(a, v1.AdminServiceClient.ListTemplates, &v1.ListTemplatesRequest{}, pg,
			func(w *tabwriter.Writer, r *v1.ListTemplatesResponse) { templateTable(w, r.Templates) })
	}}
	pg.flags(listCmd.Flags(), 0, "templates")
	get := &cobra.Command{Use: "get NAME", Short: "Show a template", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.GetTemplate, &v1.GetTemplateRequest{Name: args[0]}, templateDetail)
	}}
	del := &cobra.Command{Use: "delete NAME", Short: "Delete a template no node or pool uses", Args: cobra.ExactArgs(1), RunE: func(_ *cobra.Command, args []string) error {
		return call(a, v1.AdminServiceClient.DeleteTemplate, &v1.DeleteTemplateRequest{Name: args[0]}, deleted[*v1.DeleteTemplateResponse]("template", args[0]))
	}}
	cmd.AddCommand(create, update, listCmd, get, del)
	return cmd
}
