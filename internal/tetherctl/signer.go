package tetherctl

import (
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Signer key files `signer create` writes in --out.
const (
	SignerKeyFile = "signer.key"
	SignerPubFile = "signer.pub"
)

// signerCmd manages module signing keys: made locally (the private key
// never leaves the operator's machine), registered with the control plane
// by their public half.
func (a *App) signerCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "signer", Short: "Module signing keys (create locally, register with the control plane)"}
	var out string
	create := &cobra.Command{
		Use: "create NAME --out DIR", Short: "Make an Ed25519 signing key pair (no call to tetherd)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out DIR is required")
			}
			pub, fp, err := CreateSigner(out)
			if err != nil {
				return err
			}
			m := &v1.Signer{Name: args[0], Fingerprint: fp, PublicKey: pub}
			return a.print(m, func(w *tabwriter.Writer) {
				row(w, "signer:", args[0])
				row(w, "fingerprint:", fp)
				row(w, "private key:", filepath.Join(out, SignerKeyFile)+" (0600; keep it offline)")
				row(w, "public key:", filepath.Join(out, SignerPubFile))
				row(w, "next:", "tetherctl signer add "+args[0]+" --key "+filepath.Join(out, SignerPubFile))
			})
		},
	}
	create.Flags().StringVar(&out, "out", "", "directory for signer.key and signer.pub (created 0700)")

	var keyFile string
	add := &cobra.Command{
		Use: "add NAME --key FILE.pub", Short: "Register a signer's public key (admin)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			raw, err := os.ReadFile(keyFile)
			if err != nil {
				return fmt.Errorf("--key: %w", err)
			}
			pub, err := pki.ParseSignerPublicKey(raw)
			if err != nil {
				return fmt.Errorf("--key %s: %w", keyFile, err)
			}
			return call(a, v1.AdminServiceClient.AddSigner, &v1.AddSignerRequest{Name: args[0], PublicKey: pub},
				func(w *tabwriter.Writer, s *v1.Signer) { signerTable(s)(w) })
		},
	}
	add.Flags().StringVar(&keyFile, "key", "", "the signer's public key (signer.pub)")
	_ = add.MarkFlagRequired("key")

	list := &cobra.Command{Use: "list", Short: "List the signers the control plane checks signatures against", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return call(a, v1.AdminServiceClient.ListSigners, &v1.ListSignersRequest{},
				func(w *tabwriter.Writer, resp *v1.ListSignersResponse) { signerTable(resp.Signers...)(w) })
		}}
	remove := &cobra.Command{Use: "remove NAME|sha256:FP", Short: "Unregister a signer (signatures already recorded stay)", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			return call(a, v1.AdminServiceClient.RemoveSigner, &v1.RemoveSignerRequest{Signer: args[0]},
				func(w *tabwriter.Writer, _ *v1.RemoveSignerResponse) { row(w, "removed signer", args[0]) })
		}}
	cmd.AddCommand(create, add, list, remove)
	return cmd
}

func signerTable(ss ...*v1.Signer) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "NAME", "FINGERPRINT", "CREATED")
		for _, s := range ss {
			row(w, s.Name, s.Fingerprint, when(s.CreatedAt))
		}
	}
}

// CreateSigner writes a new key pair into dir and returns the raw public
// key and its fingerprint. It never overwrites an existing key.
func CreateSigner(dir string) ([]byte, string, error) {
	pub, priv, err := pki.GenerateSigner()
	if err != nil {
		return nil, "", err
	}
	privPEM, err := pki.SignerPrivatePEM(priv)
	if err != nil {
		return nil, "", err
	}
	pubPEM, err := pki.SignerPublicPEM(pub)
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("--out: %w", err)
	}
	if err := writeNew(filepath.Join(dir, SignerKeyFile), privPEM, 0o600); err != nil {
		return nil, "", err
	}
	if err := writeNew(filepath.Join(dir, SignerPubFile), pubPEM, 0o644); err != nil {
		return nil, "", err
	}
	return pub, pki.SignerFingerprint(pub), nil
}

// writeNew creates path with perm, refusing to replace a file: a signing
// key overwritten by mistake cannot be recovered.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("write %s: %w (refusing to overwrite a key)", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// moduleSignatures signs (name, version, digest) with each key file.
func moduleSignatures(flag string, keyFiles []string, name, version, digest string) ([]*v1.ModuleSignature, error) {
	var out []*v1.ModuleSignature
	for _, f := range keyFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		key, err := pki.ParseSignerPrivateKey(raw)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", flag, f, err)
		}
		pub := []byte(key.Public().(ed25519.PublicKey))
		out = append(out, &v1.ModuleSignature{Signer: pki.SignerFingerprint(pub), PublicKey: pub, Signature: pki.SignModule(key, name, version, digest)})
	}
	return out, nil
}

// moduleSignCmd signs a module already pushed: the digest comes from the
// control plane, the signature is made here with the local key.
func (a *App) moduleSignCmd() *cobra.Command {
	var keyFile string
	cmd := &cobra.Command{
		Use: "sign NAME:VERSION --key FILE", Short: "Sign a pushed module with a signer key and attach the signature", Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			n, v, err := splitRef(args[0])
			if err != nil {
				return err
			}
			c, err := a.dial()
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			m, err := c.GetModule(ctx, &v1.GetModuleRequest{Name: n, Version: v})
			if err != nil {
				return err
			}
			sigs, err := moduleSignatures("--key", []string{keyFile}, n, v, m.Digest)
			if err != nil {
				return err
			}
			m, err = c.SignModule(ctx, &v1.SignModuleRequest{Name: n, Version: v, Signature: sigs[0]})
			if err != nil {
				return err
			}
			return a.print(m, a.moduleDetail(m))
		},
	}
	cmd.Flags().StringVar(&keyFile, "key", "", "the signer's private key (signer.key)")
	_ = cmd.MarkFlagRequired("key")
	return cmd
}

// signedColumn is the module table's SIGNED column: how many verified
// signatures the module carries.
func signedColumn(m *v1.Module) string {
	switch n := len(m.Signatures); {
	case n > 0:
		return fmt.Sprintf("%d signer(s)", n)
	case len(m.Signature) > 0:
		return "unverified (legacy)"
	default:
		return "no"
	}
}

// moduleDetail is `module get`: the module and each signature's signer.
func (a *App) moduleDetail(m *v1.Module) func(*tabwriter.Writer) {
	return func(w *tabwriter.Writer) {
		row(w, "name:", m.Name)
		row(w, "version:", m.Version)
		row(w, "digest:", m.Digest)
		row(w, "size:", humanBytes(m.Size))
		row(w, "created:", when(m.CreatedAt))
		if len(m.Signatures) == 0 {
			row(w, "signatures:", "none")
		}
		for i, s := range m.Signatures {
			row(w, fmt.Sprintf("signature[%d]:", i), s.Signer, dash(s.SignerName), when(s.CreatedAt))
		}
	}
}
