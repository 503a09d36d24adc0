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
}

// PushHeader is what the client declares before the bytes.
type PushHeader struct {
	Name, Version, Digest string
	Size                  int64
	Signature             []byte
}

// SignedMessage is what a module signature signs (docs/design.md §5.4).
func SignedMessage(name, version, digest string) []byte {
	return []byte("tether-module-v1\n" + name + "\n" + version + "\n" + digest)
}

// VerifySignature checks sig against any of keys.
func VerifySignature(keys []ed25519.PublicKey, name, version, digest string, sig []byte) bool {
	msg := SignedMessage(name, version, digest)
	for _, k := range keys {
		if len(sig) == ed25519.SignatureSize && ed25519.Verify(k, msg, sig) {
			return true
		}
	}
	return false
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
	m := &store.Module{Name: h.Name, Version: h.Version, Digest: digest, Size: up.Size(), Signature: h.Signature, CreatedAt: now}
	created := true
	err = r.Store.Tx(ctx, func(q store.Queries) error {
		existing, err := q.GetModule(ctx, h.Name, h.Version)
		if err == nil {
			if existing.Digest != digest {
				return fail.Exists("module %s:%s already exists with digest %s; this push is %s; modules are immutable, push a new version", h.Name, h.Version, existing.Digest, digest)
			}
			m, created = existing, false
			return nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err := q.CreateModule(ctx, m); err != nil {
			return err
		}
		_, err = events.E{Kind: events.ModulePushed, Message: fmt.Sprintf("module %s:%s pushed (%s, %d bytes)", h.Name, h.Version, digest, m.Size),
			Payload: map[string]any{"name": h.Name, "version": h.Version, "digest": digest, "size": m.Size}}.Write(ctx, q, now)
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
			Payload: map[string]any{"name": name, "version": version, "digest": m.Digest}}.Write(ctx, q, now)
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
