// Package lifecycle serves the instance actions of AdminService (design
// §2): start, stop, reboot, terminate, hold, cordon, drain, the console
// and the seed ISO. The logic lives in controlplane/instances; these
// handlers check the request's shape, name the caller and convert.
package lifecycle

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/seediso"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Reads are the store reads the answers need.
type Reads interface {
	adminkit.InstanceReads
	ListCertificates(ctx context.Context, f store.CertificateFilter, p store.Page) ([]*store.Certificate, error)
}

// Revoked is this replica's revocation set: a terminated instance's
// streams are cut here at once.
type Revoked interface {
	Add(serials ...store.CertSerial)
}

// Config is what the instance actions use.
type Config struct {
	Instances *instances.Service
	Reads     Reads
	Clock     clock.Clock
	// Revoked, if set, hears a terminated instance's revoked serials.
	Revoked Revoked
}

// Server serves the instance actions.
type Server struct {
	cfg Config
}

// New builds the instance actions, naming a missing dependency.
func New(cfg Config) (*Server, error) {
	for _, r := range []struct {
		name    string
		missing bool
	}{{"Instances", cfg.Instances == nil}, {"Reads", cfg.Reads == nil}, {"Clock", cfg.Clock == nil}} {
		if r.missing {
			return nil, errors.New("lifecycle: Config." + r.name + " is required")
		}
	}
	return &Server{cfg: cfg}, nil
}

// The instance actions (docs/design.md §2).

// consoleChunk is the size of one console message; consolePoll is how
// often follow mode looks for new output. The log is a file another
// process (qemu) writes, and nothing signals its growth, so follow polls it
// on the wall clock.
const (
	consoleChunk = 32 << 10
	consolePoll  = 250 * time.Millisecond
)

func (a *Server) instanceReply(ctx context.Context, in *store.Instance, err error) (*v1.Instance, error) {
	if err != nil {
		return nil, err
	}
	return adminkit.InstanceOut(ctx, a.cfg.Reads, a.cfg.Clock.Now(), in)
}

// StartInstance implements AdminService.
func (a *Server) StartInstance(ctx context.Context, req *v1.InstanceActionRequest) (*v1.Instance, error) {
	in, err := a.cfg.Instances.Start(ctx, store.InstanceID(req.Id))
	return a.instanceReply(ctx, in, err)
}

// StopInstance implements AdminService.
func (a *Server) StopInstance(ctx context.Context, req *v1.InstanceActionRequest) (*v1.Instance, error) {
	in, err := a.cfg.Instances.Stop(ctx, store.InstanceID(req.Id))
	return a.instanceReply(ctx, in, err)
}

// RebootInstance implements AdminService.
func (a *Server) RebootInstance(ctx context.Context, req *v1.InstanceActionRequest) (*v1.Instance, error) {
	in, err := a.cfg.Instances.Reboot(ctx, store.InstanceID(req.Id))
	return a.instanceReply(ctx, in, err)
}

// TerminateInstance implements AdminService.
func (a *Server) TerminateInstance(ctx context.Context, req *v1.InstanceActionRequest) (*v1.Instance, error) {
	in, err := a.cfg.Instances.Terminate(ctx, store.InstanceID(req.Id))
	if err == nil && a.cfg.Revoked != nil {
		// Cut this replica's streams at once; other replicas hear the
		// revocation notifications the terminate queued.
		if certs, lerr := a.cfg.Reads.ListCertificates(ctx, store.CertificateFilter{InstanceID: in.ID}, store.Page{Limit: store.MaxPageSize}); lerr == nil {
			for _, c := range certs {
				if c.RevokedAt != nil {
					a.cfg.Revoked.Add(c.Serial)
				}
			}
		}
	}
	return a.instanceReply(ctx, in, err)
}

// HoldInstance implements AdminService.
func (a *Server) HoldInstance(ctx context.Context, req *v1.HoldInstanceRequest) (*v1.Instance, error) {
	in, err := a.cfg.Instances.Hold(ctx, store.InstanceID(req.Id), req.Reason, adminkit.CallerName(ctx))
	return a.instanceReply(ctx, in, err)
}

// UnholdInstance implements AdminService.
func (a *Server) UnholdInstance(ctx context.Context, req *v1.InstanceActionRequest) (*v1.Instance, error) {
	in, err := a.cfg.Instances.Unhold(ctx, store.InstanceID(req.Id), adminkit.CallerName(ctx))
	return a.instanceReply(ctx, in, err)
}

// CordonInstance implements AdminService.
func (a *Server) CordonInstance(ctx context.Context, req *v1.CordonInstanceRequest) (*v1.CordonInstanceResponse, error) {
	in, state, err := a.cfg.Instances.Cordon(ctx, store.InstanceID(req.Id), req.Reason, adminkit.CallerName(ctx))
	out, err := a.instanceReply(ctx, in, err)
	if err != nil {
		return nil, err
	}
	return &v1.CordonInstanceResponse{Instance: out, CordonState: state}, nil
}

// UncordonInstance implements AdminService.
func (a *Server) UncordonInstance(ctx context.Context, req *v1.InstanceActionRequest) (*v1.UncordonInstanceResponse, error) {
	in, state, err := a.cfg.Instances.Uncordon(ctx, store.InstanceID(req.Id), adminkit.CallerName(ctx))
	out, err := a.instanceReply(ctx, in, err)
	if err != nil {
		return nil, err
	}
	return &v1.UncordonInstanceResponse{Instance: out, UncordonState: state}, nil
}

// DrainInstance implements AdminService.
func (a *Server) DrainInstance(ctx context.Context, req *v1.DrainInstanceRequest) (*v1.DrainInstanceResponse, error) {
	in, state, err := a.cfg.Instances.Drain(ctx, store.InstanceID(req.Id), req.Reason, adminkit.CallerName(ctx))
	out, err := a.instanceReply(ctx, in, err)
	if err != nil {
		return nil, err
	}
	return &v1.DrainInstanceResponse{Instance: out, CordonState: state}, nil
}

// GetInstanceConsole streams a qemu instance's serial console log: the
// whole file, or its last tail_bytes, then (with follow) new output as it
// is written, until the caller hangs up.
func (a *Server) GetInstanceConsole(req *v1.GetInstanceConsoleRequest, stream v1.AdminService_GetInstanceConsoleServer) error {
	if req.TailBytes < 0 {
		return fail.Invalid("tail_bytes", "must not be negative")
	}
	ctx := stream.Context()
	path, err := a.cfg.Instances.ConsoleLogPath(ctx, store.InstanceID(req.Id))
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	for errors.Is(err, os.ErrNotExist) && req.Follow {
		// Not booted yet: follow waits for the first output.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(consolePoll):
		}
		f, err = os.Open(path)
	}
	if errors.Is(err, os.ErrNotExist) {
		return fail.Precondition("instance %s has no console output (not booted yet, or the provider records no console)", req.Id)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if req.TailBytes > 0 {
		if st, err := f.Stat(); err == nil && st.Size() > req.TailBytes {
			if _, err := f.Seek(-req.TailBytes, io.SeekEnd); err != nil {
				return err
			}
		}
	}
	buf := make([]byte, consoleChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if serr := stream.Send(&v1.ConsoleChunk{Data: buf[:n]}); serr != nil {
				return serr
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if !req.Follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(consolePoll):
		}
	}
}

// CreateSeedISO returns a seed ISO (TETHERSEED) holding a fresh one-time
// token. Admin only: the image is a credential.
func (a *Server) CreateSeedISO(ctx context.Context, req *v1.CreateSeedISORequest) (*v1.CreateSeedISOResponse, error) {
	m, err := a.cfg.Instances.SeedMaterial(ctx, store.InstanceID(req.Id))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tether-seed-")
	if err != nil {
		return nil, fail.Internal("seed iso: %v", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "seed.iso")
	if err := seediso.Write(path, m); err != nil {
		return nil, fail.Internal("%v", err)
	}
	iso, err := os.ReadFile(path)
	if err != nil {
		return nil, fail.Internal("seed iso: %v", err)
	}
	return &v1.CreateSeedISOResponse{Iso: iso}, nil
}
