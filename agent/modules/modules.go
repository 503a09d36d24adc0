// Package modules fetches the content-addressed erofs modules a node is
// assigned, verifying each against its SHA-256 digest while it streams,
// resuming a broken download from where it stopped, and keeping verified
// modules in a cache directory named by digest. A cached module is hashed
// again before it is used: the cache may be a persistent disk, and a module
// is mounted as part of the root filesystem.
package modules

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/pki"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// DigestMismatchError means the bytes received do not hash to the digest
// the module is known by. The download has been discarded.
type DigestMismatchError struct {
	Module string // name:version
	Want   string
	Got    string
}

func (e *DigestMismatchError) Error() string {
	return fmt.Sprintf("module %s digest mismatch: want %s got %s; the download was discarded (if it repeats, the control plane's blob store is corrupt: re-push the module)", e.Module, e.Want, e.Got)
}

// ParseDigest checks "sha256:<64 hex>" and returns the hex part.
func ParseDigest(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return "", fmt.Errorf("digest %q: want sha256:<64 hex digits>", d)
	}
	if _, err := hex.DecodeString(h); err != nil || strings.ToLower(h) != h {
		return "", fmt.Errorf("digest %q: want lower-case hex", d)
	}
	return h, nil
}

// Name is how a module is named in messages: name:version.
func Name(m *tetherv1.Module) string { return m.GetName() + ":" + m.GetVersion() }

// Progress reports a download's state.
type Progress struct {
	Module string // name:version
	Digest string
	Done   int64
	// Total is the module's size, 0 while unknown.
	Total int64
	// Cached is set when the module came from the cache.
	Cached bool
	// Resumed counts how many times the download was resumed.
	Resumed int
}

// Config configures a Fetcher.
type Config struct {
	// Dir is the cache, <state>/modules.
	Dir string
	// Client returns a client on the current mTLS connection (it may change
	// across a certificate renewal, and a resumed download takes the new one).
	Client func() tetherv1.AgentServiceClient
	// Progress, when set, is called after every chunk.
	Progress func(Progress)
	// Logf prints a console line.
	Logf func(format string, args ...any)
	// Delay is the wait before retry attempt n; default full jitter up to
	// min(30 s, 500 ms·2^n).
	Delay func(attempt int) time.Duration
	// After waits; default time.After. Tests make it instant.
	After func(time.Duration) <-chan time.Time
	// MaxStalls is how many consecutive attempts may fail without receiving
	// a byte before Fetch gives up (default 10).
	MaxStalls int
}

// Fetcher downloads and verifies modules.
type Fetcher struct {
	cfg Config
}

// New checks cfg.
func New(cfg Config) (*Fetcher, error) {
	if cfg.Dir == "" || cfg.Client == nil {
		return nil, errors.New("modules: Dir and Client are required")
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Progress == nil {
		cfg.Progress = func(Progress) {}
	}
	if cfg.Delay == nil {
		cfg.Delay = func(n int) time.Duration {
			ceil := min(500*time.Millisecond<<min(n, 6), 30*time.Second)
			return time.Duration(rand.Int64N(int64(ceil) + 1))
		}
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	if cfg.MaxStalls == 0 {
		cfg.MaxStalls = 10
	}
	return &Fetcher{cfg: cfg}, nil
}

// Path is where a verified module with this digest is cached.
func (f *Fetcher) Path(digest string) (string, error) {
	h, err := ParseDigest(digest)
	if err != nil {
		return "", err
	}
	return filepath.Join(f.cfg.Dir, h), nil
}

// Fetch returns the path of the verified module, from the cache when a
// verified copy is there, otherwise downloaded.
func (f *Fetcher) Fetch(ctx context.Context, m *tetherv1.Module) (string, error) {
	name := Name(m)
	hexDigest, err := ParseDigest(m.GetDigest())
	if err != nil {
		return "", fmt.Errorf("module %s: %w", name, err)
	}
	if err := os.MkdirAll(f.cfg.Dir, 0o700); err != nil {
		return "", fmt.Errorf("module cache: %w", err)
	}
	final := filepath.Join(f.cfg.Dir, hexDigest)
	switch err := VerifyFile(final, m.GetDigest()); {
	case err == nil:
		size := fileSize(final)
		f.cfg.Progress(Progress{Module: name, Digest: m.GetDigest(), Done: size, Total: size, Cached: true})
		return final, nil
	case errors.Is(err, fs.ErrNotExist):
	default:
		f.cfg.Logf("cached module %s failed verification (%v); discarding it and downloading again", name, err)
		if err := os.Remove(final); err != nil {
			return "", fmt.Errorf("module %s: discard bad cache entry: %w", name, err)
		}
	}
	if err := f.download(ctx, m, hexDigest, final); err != nil {
		return "", err
	}
	return final, nil
}

// download streams the module into <hex>.partial, resuming after broken
// streams, and renames it into place once its digest checks out.
func (f *Fetcher) download(ctx context.Context, m *tetherv1.Module, hexDigest, final string) (err error) {
	name := Name(m)
	partial := final + ".partial"
	file, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("module %s: %w", name, err)
	}
	defer func() {
		if file != nil {
			file.Close()
		}
	}()
	h := sha256.New()
	// A partial file from an earlier run (the agent restarted mid-download)
	// is resumed: re-hash what is there so the digest covers every byte.
	offset, err := rehash(file, h, m.GetSize())
	if err != nil {
		return fmt.Errorf("module %s: resume %s: %w", name, partial, err)
	}
	w := newSink(file, h)
	// Runs before file.Close (defers are last in, first out).
	defer w.close()
	total := m.GetSize()
	resumed := 0
	stalls := 0
	for {
		if total > 0 && offset == total {
			break // every byte is here; only the end of the stream was lost
		}
		got, size, err := f.stream(ctx, m, offset, w, total, resumed)
		offset += got
		if size > 0 {
			total = size
		}
		if err == nil {
			break
		}
		if werr := w.err(); werr != nil {
			return fmt.Errorf("module %s: write %s: %w", name, partial, werr)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("module %s: %w", name, ctx.Err())
		}
		var perm *permanentError
		if errors.As(err, &perm) {
			if perm.discard {
				w.close()
				file.Close()
				file = nil
				os.Remove(partial)
			}
			return fmt.Errorf("module %s: %w", name, perm.err)
		}
		if got > 0 {
			stalls = 0
		} else {
			stalls++
		}
		if stalls >= f.cfg.MaxStalls {
			return fmt.Errorf("module %s: download made no progress in %d attempts, last error: %w (check the control plane's reachability; the partial download is kept and resumed next time)", name, stalls, err)
		}
		d := f.cfg.Delay(stalls)
		f.cfg.Logf("module %s: download interrupted at %d of %d bytes (%v); resuming in %s", name, offset, total, err, d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return fmt.Errorf("module %s: %w", name, ctx.Err())
		case <-f.cfg.After(d):
		}
		resumed++
	}
	if err := w.close(); err != nil {
		return fmt.Errorf("module %s: write %s: %w", name, partial, err)
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if got != m.GetDigest() {
		file.Close()
		file = nil
		os.Remove(partial)
		return &DigestMismatchError{Module: name, Want: m.GetDigest(), Got: got}
	}
	if err := file.Sync(); err != nil {
		return fmt.Errorf("module %s: sync: %w", name, err)
	}
	if err := file.Close(); err != nil {
		return fmt.Errorf("module %s: close: %w", name, err)
	}
	file = nil
	if err := os.Rename(partial, final); err != nil {
		return fmt.Errorf("module %s: %w", name, err)
	}
	syncDir(f.cfg.Dir)
	return nil
}

// permanentError ends a download without retrying; discard says the
// partial bytes are useless.
type permanentError struct {
	err     error
	discard bool
}

func (e *permanentError) Error() string { return e.err.Error() }

// stream runs one FetchModule call from offset, feeding w. It returns the
// bytes received and the size the server announced; a nil error means the
// module is complete.
func (f *Fetcher) stream(ctx context.Context, m *tetherv1.Module, offset int64, w *sink, total int64, resumed int) (got, size int64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	name := Name(m)
	// chunkCodec leaves each chunk's data in gRPC's receive buffers; the
	// sink hashes and writes it from there, then releases them.
	st, err := f.cfg.Client().FetchModule(ctx, &tetherv1.FetchModuleRequest{Digest: m.GetDigest(), Offset: offset}, grpc.ForceCodecV2(chunkCodec{}))
	if err != nil {
		return 0, 0, classify(err, offset)
	}
	for {
		var c wireChunk
		err := st.RecvMsg(&c)
		if err == io.EOF {
			if total > 0 && offset+got < total {
				return got, size, fmt.Errorf("stream ended at %d of %d bytes", offset+got, total)
			}
			return got, size, nil
		}
		if err != nil {
			return got, size, classify(err, offset+got)
		}
		n := int64(c.data.Len())
		if err := checkChunk(m, &c, offset+got, total); err != nil {
			c.free()
			return got, size, err
		}
		if c.size > 0 {
			size, total = c.size, c.size
		}
		if err := w.write(c.offset, c.data); err != nil {
			return got, size, &permanentError{err: err}
		}
		got += n
		f.cfg.Progress(Progress{Module: name, Digest: m.GetDigest(), Done: offset + got, Total: total, Resumed: resumed})
	}
}

// checkChunk checks a chunk against the bytes expected next.
func checkChunk(m *tetherv1.Module, c *wireChunk, want, total int64) error {
	if c.offset != want {
		return fmt.Errorf("server sent offset %d, expected %d", c.offset, want)
	}
	if c.size > 0 {
		if m.GetSize() > 0 && c.size != m.GetSize() {
			return &permanentError{err: fmt.Errorf("server says the module is %d bytes, the assignment says %d", c.size, m.GetSize()), discard: true}
		}
		total = c.size
	}
	if total > 0 && want+int64(c.data.Len()) > total {
		return &permanentError{err: fmt.Errorf("server sent more than the module's %d bytes", total), discard: true}
	}
	return nil
}

// classify splits stream errors into retryable and permanent ones.
func classify(err error, offset int64) error {
	switch status.Code(err) {
	case codes.NotFound, codes.PermissionDenied, codes.InvalidArgument, codes.Unauthenticated, codes.Unimplemented:
		return &permanentError{err: err}
	case codes.OutOfRange:
		// Our partial file is longer than the server's module: it is not a
		// prefix of this module, so start again.
		return &permanentError{err: fmt.Errorf("offset %d refused (%w); the partial download was discarded", offset, err), discard: true}
	}
	return err
}

// rehash feeds an existing partial file into h and leaves the file
// positioned at its end. A partial file longer than the module is dropped.
func rehash(file *os.File, h hash.Hash, size int64) (int64, error) {
	st, err := file.Stat()
	if err != nil {
		return 0, err
	}
	if size > 0 && st.Size() > size {
		if err := file.Truncate(0); err != nil {
			return 0, err
		}
		_, err := file.Seek(0, io.SeekStart)
		return 0, err
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	n, err := io.Copy(h, file)
	if err != nil {
		return 0, err
	}
	return n, nil
}

// VerifyFile hashes the file at path and compares it to digest.
func VerifyFile(path, digest string) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, file, make([]byte, 1<<20)); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		return fmt.Errorf("content hashes to %s, want %s", got, digest)
	}
	return nil
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// syncDir makes a rename durable on a persistent cache; on tmpfs it is a
// no-op, and a failure only costs a re-download after a crash.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// SignedMessage is what a signer's key signs for a module (pki's one
// definition, shared with tetherctl and tetherd).
func SignedMessage(name, version, digest string) []byte {
	return pki.ModuleMessage(name, version, digest)
}

// SignatureRefused is a module no acceptable signer signed. Its text starts
// with the event kind, so the heartbeat that carries it is recorded on the
// control plane as a module.signature_refused event.
type SignatureRefused struct {
	Module string
	Reason string
}

// RefusedKind is the event kind a refusal is reported under.
const RefusedKind = "module.signature_refused"

func (e *SignatureRefused) Error() string {
	return fmt.Sprintf("%s: module %s refused: %s", RefusedKind, e.Module, e.Reason)
}

// Policy is what this node requires of module signatures.
type Policy struct {
	// Anchors are signer fingerprints the node learned outside the control
	// plane (kernel command line, fw_cfg, initramfs). With any, every
	// module needs a valid signature by one of them, whatever the
	// assignment says.
	Anchors []string
}

// verified maps each signer fingerprint on m to whether its signature
// verifies over m's name, version and digest: each signature is checked
// once, however many requirements look at it.
func verified(m *tetherv1.Module) map[string]bool {
	out := make(map[string]bool, len(m.GetSignatures()))
	for _, s := range m.GetSignatures() {
		fp := pki.SignerFingerprint(s.GetPublicKey())
		out[fp] = out[fp] || pki.VerifyModule(s.GetPublicKey(), m.GetName(), m.GetVersion(), m.GetDigest(), s.GetSignature())
	}
	return out
}

// signedBy reports whether one of fps validly signed m, and if not, why not.
func signedBy(m *tetherv1.Module, ok map[string]bool, fps []string) (bool, string) {
	var bad []string
	for _, fp := range fps {
		valid, present := ok[fp]
		if valid {
			return true, ""
		}
		if present {
			bad = append(bad, fp)
		}
	}
	switch {
	case len(bad) > 0:
		return false, fmt.Sprintf("the signature by %s does not verify over this module's name, version and digest %s", strings.Join(bad, ", "), m.GetDigest())
	case len(ok) > 0:
		other := make([]string, 0, len(ok))
		for fp := range ok {
			other = append(other, fp)
		}
		slices.Sort(other)
		return false, fmt.Sprintf("signed only by %s, none of the trusted signers %s", strings.Join(other, ", "), strings.Join(fps, ", "))
	default:
		return false, fmt.Sprintf("unsigned; it needs a signature by one of %s", strings.Join(fps, ", "))
	}
}

// VerifySignature checks m against the assignment's signing keys (the
// template's require_signed_modules): a verified signature by one of keys.
func VerifySignature(m *tetherv1.Module, keys [][]byte) error {
	if len(m.GetSignature()) == 0 && len(m.GetSignatures()) == 0 {
		return &SignatureRefused{Module: Name(m), Reason: "unsigned, and this template requires signed modules (sign it with `tetherctl module sign`)"}
	}
	if len(keys) == 0 {
		return &SignatureRefused{Module: Name(m), Reason: "the template requires signed modules but the assignment lists no signing keys"}
	}
	for _, k := range keys {
		if pki.VerifyModule(k, m.GetName(), m.GetVersion(), m.GetDigest(), m.GetSignature()) {
			return nil
		}
		for _, s := range m.GetSignatures() {
			if string(s.GetPublicKey()) == string(k) && pki.VerifyModule(k, m.GetName(), m.GetVersion(), m.GetDigest(), s.GetSignature()) {
				return nil
			}
		}
	}
	return &SignatureRefused{Module: Name(m), Reason: fmt.Sprintf("the signature does not verify against any of the %d signing keys in the assignment (signed by another key, or signed over another name, version or digest)", len(keys))}
}

// CheckSignatures applies the node's anchor and the assignment's signing
// policy to every module before any is fetched, so a boot refuses a bad set
// as a whole. The assignment can add requirements (required signers,
// signed modules); the node's anchor applies whatever it says.
func CheckSignatures(a *tetherv1.Assignment, p Policy) error {
	for _, m := range append(append([]*tetherv1.Module(nil), a.GetRootModules()...), a.GetExtensionModules()...) {
		if len(p.Anchors) == 0 && len(a.GetRequiredSigners()) == 0 && !a.GetRequireSignedModules() {
			continue
		}
		valid := verified(m)
		if len(p.Anchors) > 0 {
			if ok, why := signedBy(m, valid, p.Anchors); !ok {
				return &SignatureRefused{Module: Name(m), Reason: "node signer anchor: " + why}
			}
		}
		if req := a.GetRequiredSigners(); len(req) > 0 {
			if ok, why := signedBy(m, valid, req); !ok {
				return &SignatureRefused{Module: Name(m), Reason: "template's required signers: " + why}
			}
		}
		if a.GetRequireSignedModules() {
			if err := VerifySignature(m, a.GetSigningKeys()); err != nil {
				return err
			}
		}
	}
	return nil
}
