// Package catalog serves the catalog RPCs of AdminService: templates,
// modules (push, read, delete), nodes (with their EK bindings and BMC)
// and adoption (docs/adr/0030). controlplane/catalog and
// controlplane/modules write; these handlers check the request's shape,
// the role some fields need (a node's BMC and EK bindings: admin), and
// convert.
package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/macaddr"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/attestation"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
	"github.com/tetherfleet/tether/providers/redfish"
)

// Config is what the catalog RPCs use.
type Config struct {
	// Catalog writes templates and nodes (required).
	Catalog *catalog.Service
	// Registry stores modules (required).
	Registry *modules.Registry
	// Store is read for the answers (required).
	Store store.Store
	// Log records an EK conflict event that could not be written (nil:
	// not logged).
	Log *slog.Logger
}

// Server serves the catalog RPCs.
type Server struct {
	cfg Config
}

// New builds the catalog RPCs, naming a missing dependency.
func New(cfg Config) (*Server, error) {
	for _, r := range []struct {
		name    string
		missing bool
	}{{"Catalog", cfg.Catalog == nil}, {"Registry", cfg.Registry == nil}, {"Store", cfg.Store == nil}} {
		if r.missing {
			return nil, errors.New("catalog: Config." + r.name + " is required")
		}
	}
	return &Server{cfg: cfg}, nil
}

// Templates, modules and nodes: the catalogue of what boots.

const maxKernelArgs = 4096

func (a *Server) resolveModules(ctx context.Context, q store.Queries, field string, refs []*v1.ModuleRef) ([]store.ModuleRef, error) {
	out := make([]store.ModuleRef, 0, len(refs))
	seen := map[store.ModuleRef]bool{}
	for i, r := range refs {
		f := field + "[" + strconv.Itoa(i) + "]"
		if err := modules.ValidateName(f+".name", r.GetName()); err != nil {
			return nil, err
		}
		if err := modules.ValidateVersion(f+".version", r.GetVersion()); err != nil {
			return nil, err
		}
		ref := store.ModuleRef{Name: r.Name, Version: r.Version}
		if seen[ref] {
			return nil, fail.Invalid(f, "module %s:%s is listed twice", r.Name, r.Version)
		}
		seen[ref] = true
		m, err := q.GetModule(ctx, r.Name, r.Version)
		if errors.Is(err, store.ErrNotFound) {
			return nil, fail.Invalid(f, "module %s:%s has not been pushed (tetherctl module push %s:%s FILE)", r.Name, r.Version, r.Name, r.Version)
		}
		if err != nil {
			return nil, err
		}
		if r.Digest != "" && r.Digest != m.Digest {
			return nil, fail.Invalid(f+".digest", "module %s:%s has digest %s, not %s", r.Name, r.Version, m.Digest, r.Digest)
		}
		out = append(out, ref)
	}
	return out, nil
}

func validateArtifactDigest(field, d string) error {
	if d == "" {
		return nil
	}
	if _, err := modules.ParseDigest(d); err != nil {
		return fail.Invalid(field, "%v", err)
	}
	return nil
}

func (a *Server) templateOut(ctx context.Context, t *store.Template) (*v1.Template, error) {
	mods := map[store.ModuleRef]*store.Module{}
	for _, r := range append(slices.Clone(t.RootModules), t.ExtensionModules...) {
		m, err := a.cfg.Store.GetModule(ctx, r.Name, r.Version)
		if err != nil {
			return nil, err
		}
		mods[r] = m
	}
	return adminkit.TemplateProto(t, mods), nil
}

func (a *Server) CreateTemplate(ctx context.Context, req *v1.CreateTemplateRequest) (*v1.Template, error) {
	if err := modules.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	if len(req.RootModules) == 0 {
		return nil, fail.Invalid("root_modules", "at least one root layer is required")
	}
	if err := validKernelArgs(req.KernelArgs); err != nil {
		return nil, err
	}
	if err := validateArtifactDigest("kernel_digest", req.KernelDigest); err != nil {
		return nil, err
	}
	if err := validateArtifactDigest("initramfs_digest", req.InitramfsDigest); err != nil {
		return nil, err
	}
	console, err := validateConsole(req.Console)
	if err != nil {
		return nil, err
	}
	if req.RequireAttestation {
		if err := attestationNeedsAdmin(ctx, "a template's require_attestation"); err != nil {
			return nil, err
		}
	}
	t := &store.Template{Name: req.Name, KernelDigest: req.KernelDigest, InitramfsDigest: req.InitramfsDigest,
		KernelArgs: req.KernelArgs, Console: console, RequireSignedModules: req.RequireSignedModules, RequireAttestation: req.RequireAttestation}
	if t.RequiredSigners, err = parseRequiredSigners(req.RequiredSigners); err != nil {
		return nil, err
	}
	err = a.cfg.Catalog.CreateTemplate(ctx, t, func(q store.Queries, t *store.Template) error {
		var err error
		if t.RootModules, err = a.resolveModules(ctx, q, "root_modules", req.RootModules); err != nil {
			return err
		}
		if t.ExtensionModules, err = a.resolveModules(ctx, q, "extension_modules", req.ExtensionModules); err != nil {
			return err
		}
		return checkTemplateSigners(ctx, q, t)
	})
	if err != nil {
		return nil, err
	}
	return a.templateOut(ctx, t)
}

func (a *Server) GetTemplate(ctx context.Context, req *v1.GetTemplateRequest) (*v1.Template, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	t, err := a.cfg.Store.GetTemplate(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return a.templateOut(ctx, t)
}

func (a *Server) ListTemplates(ctx context.Context, req *v1.ListTemplatesRequest) (*v1.ListTemplatesResponse, error) {
	p, err := adminkit.Page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	ts, err := a.cfg.Store.ListTemplates(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListTemplatesResponse{}
	if out.Templates, out.NextPageToken, err = adminkit.Fill(ts, p.Limit,
		func(t *store.Template) (*v1.Template, error) { return a.templateOut(ctx, t) },
		func(t *store.Template) string { return t.Name }); err != nil {
		return nil, err
	}
	return out, nil
}

func (a *Server) UpdateTemplate(ctx context.Context, req *v1.UpdateTemplateRequest) (*v1.Template, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	mask, err := adminkit.UpdateMask(req.UpdateMask, "root_modules", "extension_modules", "kernel_digest", "initramfs_digest", "kernel_args", "require_signed_modules", "console", "required_signers", "require_attestation")
	if err != nil {
		return nil, err
	}
	if mask["require_attestation"] {
		if err := attestationNeedsAdmin(ctx, "a template's require_attestation"); err != nil {
			return nil, err
		}
	}
	t, err := a.cfg.Catalog.UpdateTemplate(ctx, req.Name, func(q store.Queries, t *store.Template) error {
		var err error
		if mask["root_modules"] {
			if len(req.RootModules) == 0 {
				return fail.Invalid("root_modules", "at least one root layer is required")
			}
			if t.RootModules, err = a.resolveModules(ctx, q, "root_modules", req.RootModules); err != nil {
				return err
			}
		}
		if mask["extension_modules"] {
			if t.ExtensionModules, err = a.resolveModules(ctx, q, "extension_modules", req.ExtensionModules); err != nil {
				return err
			}
		}
		if mask["kernel_digest"] {
			if err := validateArtifactDigest("kernel_digest", req.KernelDigest); err != nil {
				return err
			}
			t.KernelDigest = req.KernelDigest
		}
		if mask["initramfs_digest"] {
			if err := validateArtifactDigest("initramfs_digest", req.InitramfsDigest); err != nil {
				return err
			}
			t.InitramfsDigest = req.InitramfsDigest
		}
		if mask["kernel_args"] {
			if err := validKernelArgs(req.KernelArgs); err != nil {
				return err
			}
			t.KernelArgs = req.KernelArgs
		}
		if mask["require_signed_modules"] {
			t.RequireSignedModules = req.RequireSignedModules
		}
		if mask["console"] {
			if t.Console, err = validateConsole(req.Console); err != nil {
				return err
			}
		}
		if mask["require_attestation"] {
			t.RequireAttestation = req.RequireAttestation
		}
		if mask["required_signers"] {
			var err error
			if t.RequiredSigners, err = parseRequiredSigners(req.RequiredSigners); err != nil {
				return err
			}
		}
		return checkTemplateSigners(ctx, q, t)
	})
	if err != nil {
		return nil, err
	}
	return a.templateOut(ctx, t)
}

func (a *Server) DeleteTemplate(ctx context.Context, req *v1.DeleteTemplateRequest) (*v1.DeleteTemplateResponse, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if err := a.cfg.Catalog.DeleteTemplate(ctx, req.Name); err != nil {
		return nil, err
	}
	return &v1.DeleteTemplateResponse{}, nil
}

// PushModule receives a header, then chunks.
func (a *Server) PushModule(stream v1.AdminService_PushModuleServer) error {
	first, err := stream.Recv()
	if err != nil {
		return fail.Invalid("header", "the stream ended before the header: %v", err)
	}
	h := first.GetHeader()
	if h == nil {
		return fail.Invalid("header", "the first message must be the header")
	}
	m, _, err := a.cfg.Registry.Push(stream.Context(), modules.PushHeader{Name: h.Name, Version: h.Version, Digest: h.Digest, Size: h.Size, Signature: h.Signature, Signatures: signaturesIn(h.Signatures)},
		func() ([]byte, error) {
			msg, err := stream.Recv()
			if err != nil {
				return nil, err
			}
			if msg.GetHeader() != nil {
				return nil, fail.Invalid("header", "only the first message may be a header")
			}
			return msg.GetChunk(), nil
		})
	if err != nil {
		return err
	}
	return stream.SendAndClose(adminkit.ModuleProto(m))
}

func (a *Server) GetModule(ctx context.Context, req *v1.GetModuleRequest) (*v1.Module, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if req.Version == "" {
		return nil, fail.Invalid("version", "required")
	}
	m, err := a.cfg.Store.GetModule(ctx, req.Name, req.Version)
	if err != nil {
		return nil, err
	}
	return adminkit.ModuleProto(m), nil
}

func (a *Server) ListModules(ctx context.Context, req *v1.ListModulesRequest) (*v1.ListModulesResponse, error) {
	p, err := adminkit.Page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	ms, err := a.cfg.Store.ListModules(ctx, req.Name, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListModulesResponse{}
	if out.Modules, out.NextPageToken, err = adminkit.Fill(ms, p.Limit,
		func(m *store.Module) (*v1.Module, error) { return adminkit.ModuleProto(m), nil }, store.ModuleCursor); err != nil {
		return nil, err
	}
	return out, nil
}

func (a *Server) DeleteModule(ctx context.Context, req *v1.DeleteModuleRequest) (*v1.DeleteModuleResponse, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if req.Version == "" {
		return nil, fail.Invalid("version", "required")
	}
	if err := a.cfg.Registry.Delete(ctx, req.Name, req.Version); err != nil {
		return nil, err
	}
	return &v1.DeleteModuleResponse{}, nil
}

func nodeConfig(field string, s interface{ AsMap() map[string]any }) (json.RawMessage, error) {
	b, err := json.Marshal(s.AsMap())
	if err != nil {
		return nil, fail.Invalid(field, "%v", err)
	}
	if len(b) > 64<<10 {
		return nil, fail.Invalid(field, "%d bytes is more than 64 KiB", len(b))
	}
	return b, nil
}

// maxNodeMACs bounds a node's hardware addresses: a machine has a few NICs.
const maxNodeMACs = 16

// nodeMACs validates and normalises a node's hardware addresses.
func nodeMACs(in []string) ([]string, error) {
	if len(in) > maxNodeMACs {
		return nil, fail.Invalid("macs", "%d addresses is more than %d", len(in), maxNodeMACs)
	}
	out := make([]string, 0, len(in))
	seen := map[string]bool{}
	for _, s := range in {
		mac, err := macaddr.Normalize(s)
		if err != nil {
			return nil, fail.Invalid("macs", "%v", err)
		}
		if seen[mac] {
			return nil, fail.Invalid("macs", "hardware address %s is given twice", mac)
		}
		seen[mac] = true
		out = append(out, mac)
	}
	return out, nil
}

func (a *Server) CreateNode(ctx context.Context, req *v1.CreateNodeRequest) (*v1.Node, error) {
	if err := modules.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	if req.Template == "" {
		return nil, fail.Invalid("template", "required")
	}
	if len(req.PublicAddress) > 253 {
		return nil, fail.Invalid("public_address", "longer than 253 characters")
	}
	macs, err := nodeMACs(req.Macs)
	if err != nil {
		return nil, err
	}
	if req.Bmc != nil {
		if err := bmcNeedsAdmin(ctx); err != nil {
			return nil, err
		}
	}
	bmc, err := nodeBMC(req.Bmc)
	if err != nil {
		return nil, err
	}
	eks, err := nodeEKHashes(req.EkHashes)
	if err != nil {
		return nil, err
	}
	if len(eks) > 0 {
		if err := attestationNeedsAdmin(ctx, "a node's ek_hashes"); err != nil {
			return nil, err
		}
	}
	if req.RequireAttestation {
		if err := attestationNeedsAdmin(ctx, "a node's require_attestation"); err != nil {
			return nil, err
		}
	}
	n := &store.Node{Name: req.Name, Enabled: req.Enabled == nil || *req.Enabled, PublicAddress: req.PublicAddress, MACs: macs, BMC: bmc,
		EKHashes: eks, RequireAttestation: req.RequireAttestation}
	if req.Config != nil {
		var err error
		if n.Config, err = nodeConfig("config", req.Config); err != nil {
			return nil, err
		}
	}
	tpl, err := a.cfg.Catalog.CreateNode(ctx, n, req.Template, func(q store.Queries, n *store.Node) error { return checkNodeBMC(ctx, q, n) })
	var inUse *store.MACInUseError
	if errors.As(err, &inUse) {
		return nil, fail.Exists("macs: %v", inUse)
	}
	if err != nil {
		return nil, a.ekConflict(ctx, req.Name, err)
	}
	return adminkit.NodeProto(n, tpl.Name), nil
}

func (a *Server) nodeOut(ctx context.Context, n *store.Node) (*v1.Node, error) {
	tpl, err := a.cfg.Store.GetTemplateByID(ctx, n.TemplateID)
	if err != nil {
		return nil, err
	}
	return adminkit.NodeProto(n, tpl.Name), nil
}

func (a *Server) GetNode(ctx context.Context, req *v1.GetNodeRequest) (*v1.Node, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	n, err := a.cfg.Store.GetNode(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return a.nodeOut(ctx, n)
}

func (a *Server) ListNodes(ctx context.Context, req *v1.ListNodesRequest) (*v1.ListNodesResponse, error) {
	p, err := adminkit.Page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	var f store.NodeFilter
	if req.Template != "" {
		tpl, err := a.cfg.Store.GetTemplate(ctx, req.Template)
		if err != nil {
			return nil, err
		}
		f.TemplateID = tpl.ID
	}
	ns, err := a.cfg.Store.ListNodes(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListNodesResponse{}
	if out.Nodes, out.NextPageToken, err = adminkit.Fill(ns, p.Limit,
		func(n *store.Node) (*v1.Node, error) { return a.nodeOut(ctx, n) },
		func(n *store.Node) string { return n.Name }); err != nil {
		return nil, err
	}
	return out, nil
}

func (a *Server) UpdateNode(ctx context.Context, req *v1.UpdateNodeRequest) (*v1.Node, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	mask, err := adminkit.UpdateMask(req.UpdateMask, "template", "enabled", "config", "public_address", "macs", "bmc", "ek_hashes", "require_attestation")
	if err != nil {
		return nil, err
	}
	var eks []string
	if mask["ek_hashes"] {
		if err := attestationNeedsAdmin(ctx, "a node's ek_hashes"); err != nil {
			return nil, err
		}
		if eks, err = nodeEKHashes(req.EkHashes); err != nil {
			return nil, err
		}
	}
	if mask["require_attestation"] {
		if err := attestationNeedsAdmin(ctx, "a node's require_attestation"); err != nil {
			return nil, err
		}
	}
	var bmc store.NodeBMC
	if mask["bmc"] {
		if err := bmcNeedsAdmin(ctx); err != nil {
			return nil, err
		}
		if bmc, err = nodeBMC(req.Bmc); err != nil {
			return nil, err
		}
	}
	var macs []string
	if mask["macs"] {
		if macs, err = nodeMACs(req.Macs); err != nil {
			return nil, err
		}
	}
	n, err := a.cfg.Catalog.UpdateNode(ctx, req.Name, func(q store.Queries, n *store.Node) error {
		var err error
		if mask["template"] {
			tpl, err := catalog.TemplateFor(ctx, q, req.Template)
			if err != nil {
				return err
			}
			n.TemplateID = tpl.ID
		}
		if mask["enabled"] {
			n.Enabled = req.Enabled
		}
		if mask["config"] {
			n.Config = nil
			if req.Config != nil {
				if n.Config, err = nodeConfig("config", req.Config); err != nil {
					return err
				}
			}
		}
		if mask["public_address"] {
			n.PublicAddress = req.PublicAddress
		}
		if mask["macs"] {
			n.MACs = macs
		}
		if mask["bmc"] {
			n.BMC = bmc
		}
		if mask["ek_hashes"] {
			n.EKHashes = eks
		}
		if mask["require_attestation"] {
			n.RequireAttestation = req.RequireAttestation
		}
		return checkNodeBMC(ctx, q, n)
	})
	var inUse *store.MACInUseError
	if errors.As(err, &inUse) {
		return nil, fail.Exists("macs: %v", inUse)
	}
	if err != nil {
		return nil, a.ekConflict(ctx, req.Name, err)
	}
	return a.nodeOut(ctx, n)
}

func (a *Server) DeleteNode(ctx context.Context, req *v1.DeleteNodeRequest) (*v1.DeleteNodeResponse, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if err := a.cfg.Catalog.DeleteNode(ctx, req.Name); err != nil {
		return nil, err
	}
	return &v1.DeleteNodeResponse{}, nil
}

// validConsole is a console= value: a device name and optional serial
// options (ttyS0, ttyS1,115200n8, hvc0, tty0). Nothing that could end the
// parameter or the iPXE line.
var validConsole = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,31}(,[A-Za-z0-9]{1,16})?$`)

// validateConsole checks a template's console; empty means the default.
func validateConsole(c string) (string, error) {
	switch {
	case c == "":
		return store.DefaultConsole, nil
	case c == store.ConsoleNone || validConsole.MatchString(c):
		return c, nil
	}
	return "", fail.Invalid("console", "%q is not a console device (want e.g. ttyS0, ttyS1,115200n8, tty0, or none)", c)
}

// bmcNeedsAdmin refuses a change of a node's BMC (its address, its
// credential, its TLS trust) to a caller below admin. The BMC fields decide
// where a stored credential's password is sent: an operator who could set
// them could point a node at a server of their own, pin its certificate
// and read the password (ADR 0017). Operators still drive the nodes an
// admin gave a BMC.
func bmcNeedsAdmin(ctx context.Context) error {
	return adminkit.NeedsAdmin(ctx, "a node's bmc", "it decides where a stored credential's password is sent")
}

// validKernelArgs refuses kernel arguments that are too long or hold a
// control character. The arguments are written into the iPXE script's
// kernel line and QEMU's -append: a newline there would end the line and
// start a command of the template author's choosing.
func validKernelArgs(args string) error {
	if len(args) > maxKernelArgs {
		return fail.Invalid("kernel_args", "longer than %d bytes", maxKernelArgs)
	}
	for i, r := range args {
		if unicode.IsControl(r) {
			return fail.Invalid("kernel_args", "control character %q at byte %d: the arguments are one line of space-separated words", r, i)
		}
	}
	return nil
}

// maxNodeEKs bounds a node's endorsement keys: a machine has one TPM, and
// a few hashes cover a replaced board or an RSA and an ECC EK.
const maxNodeEKs = 8

// ekPrefix is the one algorithm an EK hash names: SHA-256 of the EK
// public key (docs/design.md §3.8).
const ekPrefix = "sha256:"

// nodeEKHashes validates a node's EK hashes: sha256: and 64 hex digits.
// Upper-case hex is accepted and stored lower-case, so a hash copied from
// a tool that prints upper case names the same key; any other form is
// refused with the field and the value.
func nodeEKHashes(in []string) ([]string, error) {
	if len(in) > maxNodeEKs {
		return nil, fail.Invalid("ek_hashes", "%d endorsement keys is more than %d", len(in), maxNodeEKs)
	}
	out := make([]string, 0, len(in))
	seen := map[string]bool{}
	for _, s := range in {
		h, err := parseEKHash(s)
		if err != nil {
			return nil, fail.Invalid("ek_hashes", "%v", err)
		}
		if seen[h] {
			return nil, fail.Invalid("ek_hashes", "endorsement key %s is given twice", h)
		}
		seen[h] = true
		out = append(out, h)
	}
	return out, nil
}

// parseEKHash is the one form of an EK hash, shared with the attested
// enrollment that computes it.
func parseEKHash(s string) (string, error) { return attestation.ParseEKHash(s) }

// attestationNeedsAdmin refuses an identity below admin that sets a
// node's EK hashes or a require_attestation flag: binding a TPM decides
// which machine may become the node without a token, and clearing the
// requirement makes a stolen token good again (docs/adr/0024).
func attestationNeedsAdmin(ctx context.Context, field string) error {
	return adminkit.NeedsAdmin(ctx, field, "it decides which machine may enroll as the node")
}

// ekConflict answers a node write that names another node's EK: the
// write changed nothing, and a high-severity event names the hash and
// both nodes, because a TPM seen on a second node is either a typo or a
// machine that moved, and an operator must decide which.
func (a *Server) ekConflict(ctx context.Context, node string, err error) error {
	return a.ekConflictBy(ctx, node, "an admin node write", err)
}

// ekConflictBy is ekConflict for a write described by how.
func (a *Server) ekConflictBy(ctx context.Context, node, how string, err error) error {
	answer, lost := a.cfg.Catalog.EKConflict(ctx, node, how, err)
	if lost != nil && a.cfg.Log != nil {
		a.cfg.Log.Error("write endorsement key conflict event", "node", node, "err", lost)
	}
	return answer
}

// AdoptNode binds a machine seen netbooting, by its hardware address and
// the endorsement key it announced, to a node it creates or updates, in
// one audited transaction (docs/adr/0030). Admin only, as every EK
// binding is (docs/adr/0024).
func (a *Server) AdoptNode(ctx context.Context, req *v1.AdoptNodeRequest) (*v1.AdoptNodeResponse, error) {
	mac, err := macaddr.Normalize(req.Mac)
	if err != nil {
		return nil, fail.Invalid("mac", "%v", err)
	}
	var ek string
	if req.EkHash != "" {
		if ek, err = parseEKHash(req.EkHash); err != nil {
			return nil, fail.Invalid("ek_hash", "%v", err)
		}
	} else if req.Unseen {
		return nil, fail.Invalid("unseen", "needs ek_hash: --unseen binds a hash given with --ek that no machine announced")
	}
	if req.Name != "" {
		if err := modules.ValidateName("name", req.Name); err != nil {
			return nil, err
		}
	}
	if req.Template != "" {
		if err := modules.ValidateName("template", req.Template); err != nil {
			return nil, err
		}
	}
	if err := attestationNeedsAdmin(ctx, "a node's ek_hashes (by adoption)"); err != nil {
		return nil, err
	}
	res, err := a.cfg.Catalog.AdoptNode(ctx, catalog.Adoption{MAC: mac, EKHash: ek, Name: req.Name, Template: req.Template, Unseen: req.Unseen,
		MaxMACs: maxNodeMACs, MaxEKs: maxNodeEKs})
	var inUse *store.MACInUseError
	if errors.As(err, &inUse) {
		return nil, fail.Exists("mac: %v", inUse)
	}
	if err != nil {
		name := req.Name
		if name == "" {
			name = "(the node of " + mac + ")"
		}
		return nil, a.ekConflictBy(ctx, name, "an admin adoption of "+mac, err)
	}
	return &v1.AdoptNodeResponse{Node: adminkit.NodeProto(res.Node, res.Template), Created: res.Created, Announced: res.Announced}, nil
}

// A node's BMC settings, which the node RPCs take; the credential RPCs
// themselves are in admin/credentials.

// maxBMCCA bounds a BMC's CA bundle: a few certificates.
const maxBMCCA = 64 << 10

// nodeBMC validates a node's BMC settings; nil means none.
func nodeBMC(in *v1.NodeBMC) (store.NodeBMC, error) {
	if in == nil {
		return store.NodeBMC{}, nil
	}
	if in.Address == "" {
		return store.NodeBMC{}, fail.Invalid("bmc.address", "required (redfish://HOST[:PORT]/redfish/v1/Systems/ID)")
	}
	if len(in.Address) > 2048 {
		return store.NodeBMC{}, fail.Invalid("bmc.address", "longer than 2048 characters")
	}
	if _, err := redfish.ParseEndpoint(in.Address); err != nil {
		return store.NodeBMC{}, fail.Invalid("bmc.address", "%v", err)
	}
	if in.Credential == "" {
		return store.NodeBMC{}, fail.Invalid("bmc.credential", "required: the name of a credential (tetherctl credential create)")
	}
	out := store.NodeBMC{Address: in.Address, Credential: in.Credential, Insecure: in.InsecureSkipVerify}
	if in.CaPem != "" {
		if len(in.CaPem) > maxBMCCA {
			return store.NodeBMC{}, fail.Invalid("bmc.ca_pem", "%d bytes is more than %d", len(in.CaPem), maxBMCCA)
		}
		if _, err := redfish.ParseCA([]byte(in.CaPem)); err != nil {
			return store.NodeBMC{}, fail.Invalid("bmc.ca_pem", "%v", err)
		}
		out.CAPEM = in.CaPem
	}
	if in.Fingerprint != "" {
		fp, err := redfish.ParseFingerprint(in.Fingerprint)
		if err != nil {
			return store.NodeBMC{}, fail.Invalid("bmc.fingerprint", "%v", err)
		}
		out.Fingerprint = fp
	}
	if out.Insecure && (out.CAPEM != "" || out.Fingerprint != "") {
		return store.NodeBMC{}, fail.Invalid("bmc.insecure_skip_verify", "contradicts bmc.ca_pem and bmc.fingerprint: verify the BMC or skip verification, not both")
	}
	switch strings.ToLower(in.BootMode) {
	case "":
	case "uefi":
		out.BootMode = redfish.ModeUEFI
	case "legacy", "bios":
		out.BootMode = redfish.ModeLegacy
	default:
		return store.NodeBMC{}, fail.Invalid("bmc.boot_mode", "%s is not UEFI or Legacy", adminkit.QuoteSome(in.BootMode))
	}
	return out, nil
}

// checkNodeBMC refuses a BMC whose credential does not exist, or a BMC on
// a node without a hardware address (its machine netboots by MAC).
func checkNodeBMC(ctx context.Context, q store.Queries, n *store.Node) error {
	if n.BMC.Address == "" {
		return nil
	}
	if len(n.MACs) == 0 {
		return fail.Invalid("macs", "node %s has a BMC but no hardware address: its machine netboots by its NIC's MAC (--mac)", n.Name)
	}
	if _, err := q.GetCredential(ctx, n.BMC.Credential); errors.Is(err, store.ErrNotFound) {
		return fail.Invalid("bmc.credential", "credential %q does not exist (tetherctl credential create %s --username U --password-file F)", n.BMC.Credential, n.BMC.Credential)
	} else if err != nil {
		return err
	}
	return nil
}

// What templates and module pushes share with signing; the signer RPCs
// themselves are in admin/signers.

func signaturesIn(in []*v1.ModuleSignature) []modules.SignatureIn {
	var out []modules.SignatureIn
	for _, s := range in {
		out = append(out, modules.SignatureIn{PublicKey: s.GetPublicKey(), Signature: s.GetSignature()})
	}
	return out
}

func parseRequiredSigners(in []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for i, s := range in {
		fp, err := pki.ParseSignerFingerprint(s)
		if err != nil {
			return nil, fail.Invalid("required_signers", "[%d]: %v", i, err)
		}
		if !seen[fp] {
			seen[fp], out = true, append(out, fp)
		}
	}
	return out, nil
}

func checkTemplateSigners(ctx context.Context, q store.Queries, t *store.Template) error {
	return modules.CheckTemplateSigners(ctx, q, t)
}
