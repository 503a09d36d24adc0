package api

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"unicode"

	"github.com/tetherfleet/tether/controlplane/catalog"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/macaddr"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Templates, modules and nodes: the catalogue of what boots.

const maxKernelArgs = 4096

func (a *adminServer) resolveModules(ctx context.Context, q store.Queries, field string, refs []*v1.ModuleRef) ([]store.ModuleRef, error) {
	out := make([]store.ModuleRef, 0, len(refs))
	seen := map[store.ModuleRef]bool{}
	for i, r := range refs {
		f := field + "[" + itoa(i) + "]"
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

func (a *adminServer) templateOut(ctx context.Context, t *store.Template) (*v1.Template, error) {
	mods := map[store.ModuleRef]*store.Module{}
	for _, r := range append(slices.Clone(t.RootModules), t.ExtensionModules...) {
		m, err := a.Store.GetModule(ctx, r.Name, r.Version)
		if err != nil {
			return nil, err
		}
		mods[r] = m
	}
	return templateProto(t, mods), nil
}

func (a *adminServer) CreateTemplate(ctx context.Context, req *v1.CreateTemplateRequest) (*v1.Template, error) {
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
	err = a.Catalog.CreateTemplate(ctx, t, func(q store.Queries, t *store.Template) error {
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

func (a *adminServer) GetTemplate(ctx context.Context, req *v1.GetTemplateRequest) (*v1.Template, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	t, err := a.Store.GetTemplate(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return a.templateOut(ctx, t)
}

func (a *adminServer) ListTemplates(ctx context.Context, req *v1.ListTemplatesRequest) (*v1.ListTemplatesResponse, error) {
	p, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	ts, err := a.Store.ListTemplates(ctx, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListTemplatesResponse{}
	var b budget
	for _, t := range ts {
		pt, err := a.templateOut(ctx, t)
		if err != nil {
			return nil, err
		}
		if !b.fits(pt) {
			break
		}
		out.Templates = append(out.Templates, pt)
	}
	if b.more(len(out.Templates), len(ts), p.Limit) {
		out.NextPageToken = ts[len(out.Templates)-1].Name
	}
	return out, nil
}

func (a *adminServer) UpdateTemplate(ctx context.Context, req *v1.UpdateTemplateRequest) (*v1.Template, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	mask, err := updateMask(req.UpdateMask, "root_modules", "extension_modules", "kernel_digest", "initramfs_digest", "kernel_args", "require_signed_modules", "console", "required_signers", "require_attestation")
	if err != nil {
		return nil, err
	}
	if mask["require_attestation"] {
		if err := attestationNeedsAdmin(ctx, "a template's require_attestation"); err != nil {
			return nil, err
		}
	}
	t, err := a.Catalog.UpdateTemplate(ctx, req.Name, func(q store.Queries, t *store.Template) error {
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

func (a *adminServer) DeleteTemplate(ctx context.Context, req *v1.DeleteTemplateRequest) (*v1.DeleteTemplateResponse, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if err := a.Catalog.DeleteTemplate(ctx, req.Name); err != nil {
		return nil, err
	}
	return &v1.DeleteTemplateResponse{}, nil
}

// PushModule receives a header, then chunks.
func (a *adminServer) PushModule(stream v1.AdminService_PushModuleServer) error {
	first, err := stream.Recv()
	if err != nil {
		return fail.Invalid("header", "the stream ended before the header: %v", err)
	}
	h := first.GetHeader()
	if h == nil {
		return fail.Invalid("header", "the first message must be the header")
	}
	m, _, err := a.Registry.Push(stream.Context(), modules.PushHeader{Name: h.Name, Version: h.Version, Digest: h.Digest, Size: h.Size, Signature: h.Signature, Signatures: signaturesIn(h.Signatures)},
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
	return stream.SendAndClose(moduleProto(m))
}

func (a *adminServer) GetModule(ctx context.Context, req *v1.GetModuleRequest) (*v1.Module, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if req.Version == "" {
		return nil, fail.Invalid("version", "required")
	}
	m, err := a.Store.GetModule(ctx, req.Name, req.Version)
	if err != nil {
		return nil, err
	}
	return moduleProto(m), nil
}

func (a *adminServer) ListModules(ctx context.Context, req *v1.ListModulesRequest) (*v1.ListModulesResponse, error) {
	p, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	ms, err := a.Store.ListModules(ctx, req.Name, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListModulesResponse{}
	var b budget
	for _, m := range ms {
		pm := moduleProto(m)
		if !b.fits(pm) {
			break
		}
		out.Modules = append(out.Modules, pm)
	}
	if b.more(len(out.Modules), len(ms), p.Limit) {
		out.NextPageToken = store.ModuleCursor(ms[len(out.Modules)-1])
	}
	return out, nil
}

func (a *adminServer) DeleteModule(ctx context.Context, req *v1.DeleteModuleRequest) (*v1.DeleteModuleResponse, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if req.Version == "" {
		return nil, fail.Invalid("version", "required")
	}
	if err := a.Registry.Delete(ctx, req.Name, req.Version); err != nil {
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

func (a *adminServer) CreateNode(ctx context.Context, req *v1.CreateNodeRequest) (*v1.Node, error) {
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
	tpl, err := a.Catalog.CreateNode(ctx, n, req.Template, func(q store.Queries, n *store.Node) error { return checkNodeBMC(ctx, q, n) })
	var inUse *store.MACInUseError
	if errors.As(err, &inUse) {
		return nil, fail.Exists("macs: %v", inUse)
	}
	if err != nil {
		return nil, a.ekConflict(ctx, req.Name, err)
	}
	return nodeProto(n, tpl.Name), nil
}

func (a *adminServer) nodeOut(ctx context.Context, n *store.Node) (*v1.Node, error) {
	tpl, err := a.Store.GetTemplateByID(ctx, n.TemplateID)
	if err != nil {
		return nil, err
	}
	return nodeProto(n, tpl.Name), nil
}

func (a *adminServer) GetNode(ctx context.Context, req *v1.GetNodeRequest) (*v1.Node, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	n, err := a.Store.GetNode(ctx, req.Name)
	if err != nil {
		return nil, err
	}
	return a.nodeOut(ctx, n)
}

func (a *adminServer) ListNodes(ctx context.Context, req *v1.ListNodesRequest) (*v1.ListNodesResponse, error) {
	p, err := page(req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	var f store.NodeFilter
	if req.Template != "" {
		tpl, err := a.Store.GetTemplate(ctx, req.Template)
		if err != nil {
			return nil, err
		}
		f.TemplateID = tpl.ID
	}
	ns, err := a.Store.ListNodes(ctx, f, p)
	if err != nil {
		return nil, err
	}
	out := &v1.ListNodesResponse{}
	var b budget
	for _, n := range ns {
		pn, err := a.nodeOut(ctx, n)
		if err != nil {
			return nil, err
		}
		if !b.fits(pn) {
			break
		}
		out.Nodes = append(out.Nodes, pn)
	}
	if b.more(len(out.Nodes), len(ns), p.Limit) {
		out.NextPageToken = ns[len(out.Nodes)-1].Name
	}
	return out, nil
}

func (a *adminServer) UpdateNode(ctx context.Context, req *v1.UpdateNodeRequest) (*v1.Node, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	mask, err := updateMask(req.UpdateMask, "template", "enabled", "config", "public_address", "macs", "bmc", "ek_hashes", "require_attestation")
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
	n, err := a.Catalog.UpdateNode(ctx, req.Name, func(q store.Queries, n *store.Node) error {
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

func (a *adminServer) DeleteNode(ctx context.Context, req *v1.DeleteNodeRequest) (*v1.DeleteNodeResponse, error) {
	if req.Name == "" {
		return nil, fail.Invalid("name", "required")
	}
	if err := a.Catalog.DeleteNode(ctx, req.Name); err != nil {
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

// templateConsole is what a template's console reads as: rows from before
// the setting existed have the default.
func templateConsole(t *store.Template) string {
	if t.Console == "" {
		return store.DefaultConsole
	}
	return t.Console
}

// bmcNeedsAdmin refuses a change of a node's BMC (its address, its
// credential, its TLS trust) to a caller below admin. The BMC fields decide
// where a stored credential's password is sent: an operator who could set
// them could point a node at a server of their own, pin its certificate
// and read the password (ADR 0017). Operators still drive the nodes an
// admin gave a BMC.
func bmcNeedsAdmin(ctx context.Context) error {
	c, ok := CallerFrom(ctx)
	if !ok {
		return fail.Denied("setting a node's bmc needs role admin; the call names no caller")
	}
	if !store.Role(c.Identity.Role).AtLeast(RoleAdmin) {
		return fail.Denied("setting a node's bmc needs role admin: it decides where a stored credential's password is sent; identity %s has role %s", c.Identity.Name, c.Identity.Role)
	}
	return nil
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
