package modules

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
)

// MaxModuleSize bounds a pushed module.
const MaxModuleSize = 8 << 30

// Registry records modules and their blobs.
type Registry struct {
	Store store.Store
	Blobs *Blobs
	Clock clock.Clock
	Log   *slog.Logger
	// StaticSigners are the keys given to tetherd with --module-signing-key;
	// they count as signers next to the registered ones.
	StaticSigners []ed25519.PublicKey
}

// PushHeader is what the client declares before the bytes.
type PushHeader struct {
	Name, Version, Digest string
	Size                  int64
	// Signature is a raw signature whose signer the registry looks up.
	Signature  []byte
	Signatures []SignatureIn
}

func (h PushHeader) signatures() []SignatureIn {
	out := append([]SignatureIn(nil), h.Signatures...)
	if len(h.Signature) > 0 {
		out = append(out, SignatureIn{Signature: h.Signature})
	}
	return out
}

// Push streams a module into the blob store and records it. next returns
// the next chunk, io.EOF at the end. Pushing the same content under the
// same name and version again succeeds and changes nothing; different
// content under a taken name and version is AlreadyExists.
func (r *Registry) Push(ctx context.Context, h PushHeader, next func() ([]byte, error)) (*store.Module, bool, error) {
	if err := ValidateName("header.name", h.Name); err != nil {
		return nil, false, err
	}
	if err := ValidateVersion("header.version", h.Version); err != nil {
		return nil, false, err
	}
	if h.Digest != "" {
		if _, err := ParseDigest(h.Digest); err != nil {
			return nil, false, fail.Invalid("header.digest", "%v", err)
		}
	}
	if h.Size < 0 || h.Size > MaxModuleSize {
		return nil, false, fail.Invalid("header.size", "%d is out of range (0..%d)", h.Size, int64(MaxModuleSize))
	}
	if len(h.Signature) != 0 && len(h.Signature) != ed25519.SignatureSize {
		return nil, false, fail.Invalid("header.signature", "an Ed25519 signature is %d bytes, got %d", ed25519.SignatureSize, len(h.Signature))
	}
	var signers []store.Signer
	if sigs := h.signatures(); len(sigs) > 0 {
		var err error
		if signers, err = r.Signers(ctx); err != nil {
			return nil, false, err
		}
		// With a declared digest, refuse a bad signature before the bytes.
		if h.Digest != "" {
			if _, err := verifySignatures(signers, h.Name, h.Version, h.Digest, "header.signatures", sigs, func() store.ModuleSignature { return store.ModuleSignature{} }); err != nil {
				return nil, false, err
			}
		}
	}
	// Refuse a known conflict before receiving gigabytes.
	if existing, err := r.Store.GetModule(ctx, h.Name, h.Version); err == nil && h.Digest != "" && existing.Digest != h.Digest {
		return nil, false, fail.Exists("module %s:%s already exists with digest %s; modules are immutable, push a new version", h.Name, h.Version, existing.Digest)
	}
	limit := int64(MaxModuleSize)
	if h.Size > 0 {
		limit = h.Size
	}
	up, err := r.Blobs.Create(limit, true)
	if err != nil {
		return nil, false, err
	}
	defer up.Abort()
	for {
		chunk, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, false, fmt.Errorf("receive module %s:%s after %d bytes: %w", h.Name, h.Version, up.Size(), err)
		}
		if _, err := up.Write(chunk); err != nil {
			if errors.Is(err, ErrTooLarge) {
				return nil, false, fail.Invalid("chunk", "more data than the declared size %d", h.Size)
			}
			return nil, false, err
		}
	}
	if h.Size > 0 && up.Size() != h.Size {
		return nil, false, fail.Invalid("header.size", "declared %d bytes, received %d (was the upload cut short?)", h.Size, up.Size())
	}
	digest, err := up.Commit(h.Digest)
	switch {
	case errors.Is(err, ErrNotErofs):
		return nil, false, fail.Invalid("chunk", "%v", err)
	case errors.Is(err, ErrDigestMismatch):
		return nil, false, fail.Invalid("header.digest", "%v", err)
	case err != nil:
		return nil, false, err
	}
	now := r.Clock.Now()
	sigs, err := verifySignatures(signers, h.Name, h.Version, digest, "header.signatures", h.signatures(), func() store.ModuleSignature { return store.ModuleSignature{CreatedAt: now} })
	if err != nil {
		return nil, false, err
	}
	m := &store.Module{Name: h.Name, Version: h.Version, Digest: digest, Size: up.Size(), CreatedAt: now}
	created := true
	err = r.Store.Tx(ctx, func(q store.Queries) error {
		addSigs := func() error {
			for _, s := range sigs {
				if err := q.AddModuleSignature(ctx, h.Name, h.Version, s); err != nil {
					return err
				}
			}
			return nil
		}
		existing, err := q.GetModule(ctx, h.Name, h.Version)
		if err == nil {
			if existing.Digest != digest {
				return fail.Exists("module %s:%s already exists with digest %s; this push is %s; modules are immutable, push a new version", h.Name, h.Version, existing.Digest, digest)
			}
			m, created = existing, false
			if err := addSigs(); err != nil {
				return err
			}
			if len(sigs) > 0 {
				m, err = q.GetModule(ctx, h.Name, h.Version)
			}
			return err
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err := q.CreateModule(ctx, m); err != nil {
			return err
		}
		if err := addSigs(); err != nil {
			return err
		}
		m.Signatures = sigs
		_, err = events.E{Kind: events.ModulePushed, Message: fmt.Sprintf("module %s:%s pushed (%s, %d bytes)", h.Name, h.Version, digest, m.Size),
			Payload: events.ModulePushedPayload{Digest: digest, Name: h.Name, Size: m.Size, Version: h.Version}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		r.dropIfUnused(ctx, digest)
		return nil, false, err
	}
	return m, created, nil
}

// Delete removes a module record, refused while a template references it,
// and its blob once no other record shares the digest.
func (r *Registry) Delete(ctx context.Context, name, version string) error {
	m, err := r.Store.GetModule(ctx, name, version)
	if err != nil {
		return err
	}
	now := r.Clock.Now()
	err = r.Store.Tx(ctx, func(q store.Queries) error {
		if err := q.DeleteModule(ctx, name, version); err != nil {
			return err
		}
		_, err := events.E{Kind: events.ModuleDeleted, Message: fmt.Sprintf("module %s:%s deleted", name, version),
			Payload: events.ModuleDeletedPayload{Digest: m.Digest, Name: name, Version: version}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		return err
	}
	r.dropIfUnused(ctx, m.Digest)
	return nil
}

func (r *Registry) dropIfUnused(ctx context.Context, digest string) {
	n, err := r.Store.CountModulesWithDigest(ctx, digest)
	if err != nil || n > 0 {
		return
	}
	if err := r.Blobs.Remove(digest); err != nil {
		r.Log.Warn("remove unused blob", "digest", digest, "err", err)
	}
}
