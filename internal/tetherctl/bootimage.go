package tetherctl

import (
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tetherfleet/tether/internal/uki"
	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// bootImage is what `bootimage build` made.
type bootImage struct {
	File    string `json:"file"`
	Digest  string `json:"digest"`
	Size    int64  `json:"size"`
	Signed  bool   `json:"signed"`
	Cmdline string `json:"cmdline"`
	// Unsigned is the digest of the image before signing: the same inputs
	// give the same one (the signature carries a signing time).
	Unsigned string `json:"unsigned_digest"`
	// Measured is the Authenticode SHA-256 firmware measures into PCR 4
	// when it runs this file: what tetherd's measured-boot policy expects.
	Measured string `json:"measured_digest"`
}

func (a *App) bootimageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bootimage", Short: "Unified kernel images for UEFI Secure Boot"}
	var spec uki.Spec
	var signer uki.Signer
	var out, cpURL, caFP, console, handoff, extra string
	var signers []string
	build := &cobra.Command{
		Use:   "build --kernel FILE --initramfs FILE --url URL --out FILE",
		Short: "Join the kernel, Tether's initramfs and the node's command line into one (optionally signed) EFI image",
		Long: "The command line carries tether.url, the CA fingerprint and the signer anchors, so that under Secure Boot\n" +
			"none of them can change without breaking the signature. Per-boot data (a token) stays outside the image.\n" +
			"Signing takes the db key and its certificate as PEM files (decrypt the key first) and runs sbsign.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if caFP == "" {
				caFP = a.activeCA()
			}
			if caFP == "" {
				_, _, caPEM, err := a.readConfig()
				if err != nil {
					return fmt.Errorf("--ca not given, and the client config's CA cannot be read: %w", err)
				}
				b, _ := pem.Decode(caPEM)
				if b == nil {
					return fmt.Errorf("--ca not given, and %s holds no PEM certificate", a.cfgSrc)
				}
				caFP = pki.Fingerprint(b.Bytes)
			}
			var err error
			if spec.Cmdline, err = nodeCmdline(cpURL, caFP, signers, console, handoff, extra); err != nil {
				return err
			}
			sign := signer.Key != "" || signer.Cert != ""
			tools, err := uki.FindTools(sign)
			if err != nil {
				return err
			}
			unsigned := out
			if sign {
				unsigned = out + ".unsigned"
				_ = os.Remove(unsigned)
			}
			if err := uki.Build(cmd.Context(), tools, spec, unsigned); err != nil {
				return err
			}
			img := bootImage{File: out, Signed: sign, Cmdline: spec.Cmdline}
			if img.Unsigned, err = uki.Digest(unsigned); err != nil {
				return err
			}
			if sign {
				err := uki.Sign(cmd.Context(), tools, signer, unsigned, out)
				os.Remove(unsigned)
				if err != nil {
					return err
				}
			}
			st, err := os.Stat(out)
			if err != nil {
				return err
			}
			img.Size = st.Size()
			if img.Digest, err = uki.Digest(out); err != nil {
				return err
			}
			ph, err := uki.PEHash(out)
			if err != nil {
				return err
			}
			img.Measured = "sha256:" + hex.EncodeToString(ph)
			if a.Output == "json" {
				b, err := json.MarshalIndent(img, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintln(a.Stdout, string(b))
				return nil
			}
			w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
			row(w, "image:", img.File)
			row(w, "digest:", img.Digest)
			row(w, "size:", humanBytes(img.Size))
			row(w, "measured:", img.Measured+" (PCR 4)")
			row(w, "signed:", map[bool]string{true: "yes (" + filepath.Base(signer.Cert) + ")", false: "no: Secure Boot firmware refuses it"}[sign])
			row(w, "cmdline:", img.Cmdline)
			return w.Flush()
		},
	}
	f := build.Flags()
	f.StringVar(&spec.Kernel, "kernel", "", "the kernel (bzImage) (required)")
	f.StringVar(&spec.Initramfs, "initramfs", "", "Tether's initramfs, as `make initramfs` builds it (required)")
	f.StringVar(&spec.Stub, "stub", uki.DefaultStub, "systemd's EFI stub (Debian: systemd-boot-efi)")
	f.StringVar((*string)(&spec.Compress), "compress", string(uki.CompressLZ4), "how the image stores the initramfs: lz4 (smaller, so faster to download and to verify under Secure Boot; the kernel needs CONFIG_RD_LZ4) or none; an initramfs already compressed is stored as given")
	f.StringVar(&cpURL, "url", "", "the control plane as nodes reach it, https://HOST:PORT (required)")
	f.StringVar(&caFP, "ca", "", "the CA fingerprint nodes pin, sha256:HEX (default: the client config's CA)")
	f.StringSliceVar(&signers, "signers", nil, "module signer fingerprints the node anchors (tether.signers)")
	f.StringVar(&console, "console", "ttyS0,115200", "the kernel console")
	f.StringVar(&handoff, "handoff", "", "the netboot server as nodes reach it, http://HOST:PORT: the agent fetches its per-boot hand-off (instance, token) there (tether.handoff); needed when tetherd serves the image over UEFI HTTP Boot")
	f.StringVar(&extra, "cmdline", "", "further kernel arguments (ip=dhcp is added when --handoff is given and no ip= is)")
	f.StringVar(&signer.Key, "key", "", "Secure Boot db private key (PEM, unencrypted) to sign with")
	f.StringVar(&signer.Cert, "cert", "", "its certificate (PEM)")
	f.StringVar(&out, "out", "", "the image to write; it must not exist (required)")
	for _, r := range []string{"kernel", "initramfs", "url", "out"} {
		_ = build.MarkFlagRequired(r)
	}
	cmd.AddCommand(build)
	return cmd
}

// nodeCmdline is the command line a UKI carries.
func nodeCmdline(cpURL, caFP string, signers []string, console, handoff, extra string) (string, error) {
	u, err := url.Parse(cpURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Path != "" && u.Path != "/" {
		return "", fmt.Errorf("--url %q: want https://HOST:PORT", cpURL)
	}
	if _, err := pki.ParseFingerprint(caFP); err != nil {
		return "", fmt.Errorf("--ca %q: %w", caFP, err)
	}
	parts := []string{}
	if console != "" {
		parts = append(parts, "console="+console)
	}
	parts = append(parts, "tether.url="+strings.TrimSuffix(cpURL, "/"), "tether.ca="+caFP)
	if len(signers) > 0 {
		for _, s := range signers {
			if _, err := pki.ParseFingerprint(s); err != nil {
				return "", fmt.Errorf("--signers %q: %w", s, err)
			}
		}
		parts = append(parts, "tether.signers="+strings.Join(signers, ","))
	}
	if handoff != "" {
		h, err := url.Parse(handoff)
		if err != nil || h.Scheme != "http" || h.Host == "" || h.Path != "" && h.Path != "/" || h.RawQuery != "" || h.User != nil {
			return "", fmt.Errorf("--handoff %q: want http://HOST:PORT (the netboot server)", handoff)
		}
		parts = append(parts, "tether.handoff="+strings.TrimSuffix(handoff, "/"))
		if !strings.HasPrefix(extra, "ip=") && !strings.Contains(extra, " ip=") {
			// The agent fetches the hand-off over the network it brings
			// up; with no ip= it asks DHCP.
			parts = append(parts, "ip=dhcp")
		}
	}
	if strings.Contains(extra, "tether.token") || strings.Contains(extra, "tether.instance") {
		return "", errors.New("--cmdline: a token or an instance is per boot; it must not be baked into an image (the agent fetches it with --handoff)")
	}
	if extra != "" {
		parts = append(parts, extra)
	}
	c := strings.Join(parts, " ")
	return c, uki.CheckCmdline(c)
}

// activeCA is the fingerprint of the control plane's active CA, which
// boots pin from a rotation's activate on (design §3.10), or "" when the
// control plane cannot say (the client config's CA is used then).
func (a *App) activeCA() string {
	resp, err := invoke(a, v1.AdminServiceClient.ListCAs, &v1.ListCAsRequest{})
	if err != nil {
		fmt.Fprintf(a.Stderr, "note: could not ask the control plane for its active CA (%v); using the client config's CA\n", err)
		return ""
	}
	for _, c := range resp.Authorities {
		if c.State == "active" {
			return c.Fingerprint
		}
	}
	return ""
}
