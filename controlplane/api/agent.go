package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/controlplane/agenthub"
	"github.com/tetherfleet/tether/controlplane/api/protoconv"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/presence"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/modulewire"
	"github.com/tetherfleet/tether/pki/ca"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// fetchChunk is the FetchModule chunk size: big enough to amortise
// per-message costs, well under the message size limit.
const fetchChunk = 256 << 10

type agentServer struct {
	v1.UnimplementedAgentServiceServer
	Config
	m *Metrics
}

func (a *agentServer) caller(ctx context.Context) (Caller, error) {
	c, ok := CallerFrom(ctx)
	if !ok {
		return Caller{}, fail.Unauthenticated("no authenticated caller")
	}
	return c, nil
}

// Renew implements AgentService.
func (a *agentServer) Renew(ctx context.Context, req *v1.RenewRequest) (*v1.RenewResponse, error) {
	c, err := a.caller(ctx)
	if err != nil {
		return nil, err
	}
	issued, err := a.Enrollment.Renew(ctx, store.InstanceID(c.Identity.Name), c.PublicKey, req.CsrPem)
	if err != nil {
		return nil, err
	}
	return &v1.RenewResponse{CertificatePem: string(ca.CertPEM(issued.Cert)), CaPem: string(ca.CertPEM(a.CA.IssuerOf(issued.Cert))),
		NotAfter: tsp(issued.Cert.NotAfter), TrustBundle: a.trustBundle()}, nil
}

// assignment loads what the caller's template assigns.
func (a *agentServer) assignment(ctx context.Context, instanceID store.InstanceID) (*v1.Assignment, map[string]bool, error) {
	in, err := a.Store.GetInstance(ctx, instanceID)
	if err != nil {
		return nil, nil, err
	}
	if in.Status == lifecycle.Terminated {
		return nil, nil, fail.Precondition("instance %s is terminated", instanceID)
	}
	node, err := a.Store.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return nil, nil, err
	}
	tpl, err := a.Store.GetTemplateByID(ctx, node.TemplateID)
	if err != nil {
		return nil, nil, err
	}
	out := &v1.Assignment{InstanceId: instanceID.String(), RequireSignedModules: tpl.RequireSignedModules, SigningKeys: a.SigningKeys,
		RequiredSigners: tpl.RequiredSigners}
	if a.Registry != nil && tpl.RequireSignedModules {
		// Registered signers count as signing keys too, so a node whose
		// template requires signed modules accepts what they signed.
		signers, err := a.Registry.Signers(ctx)
		if err != nil {
			return nil, nil, err
		}
		out.SigningKeys = nil
		for _, s := range signers {
			out.SigningKeys = append(out.SigningKeys, s.PublicKey)
		}
	}
	allowed := map[string]bool{}
	load := func(refs []store.ModuleRef) ([]*v1.Module, error) {
		var ms []*v1.Module
		for _, r := range refs {
			m, err := a.Store.GetModule(ctx, r.Name, r.Version)
			if err != nil {
				return nil, err
			}
			allowed[m.Digest] = true
			ms = append(ms, moduleProto(m))
		}
		return ms, nil
	}
	if out.RootModules, err = load(tpl.RootModules); err != nil {
		return nil, nil, err
	}
	if out.ExtensionModules, err = load(tpl.ExtensionModules); err != nil {
		return nil, nil, err
	}
	return out, allowed, nil
}

// GetAssignment implements AgentService.
func (a *agentServer) GetAssignment(ctx context.Context, _ *v1.GetAssignmentRequest) (*v1.Assignment, error) {
	c, err := a.caller(ctx)
	if err != nil {
		return nil, err
	}
	out, _, err := a.assignment(ctx, store.InstanceID(c.Identity.Name))
	return out, err
}

// FetchModule implements AgentService: only modules assigned to the
// caller's template, from any offset (resume after a cut).
func (a *agentServer) FetchModule(req *v1.FetchModuleRequest, stream v1.AgentService_FetchModuleServer) error {
	ctx := stream.Context()
	c, err := a.caller(ctx)
	if err != nil {
		return err
	}
	if _, err := modules.ParseDigest(req.Digest); err != nil {
		return fail.Invalid("digest", "%v", err)
	}
	if req.Offset < 0 {
		return fail.Invalid("offset", "must not be negative")
	}
	_, allowed, err := a.assignment(ctx, store.InstanceID(c.Identity.Name))
	if err != nil {
		return err
	}
	if !allowed[req.Digest] {
		return fail.Denied("module %s is not assigned to instance %s", req.Digest, c.Identity.Name)
	}
	f, err := a.Registry.Blobs.Open(req.Digest)
	if errors.Is(err, os.ErrNotExist) {
		return fail.Internal("module %s is recorded but its blob is missing from the data dir", req.Digest)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if req.Offset > size {
		return fail.Invalid("offset", "%d is past the end of the module (%d bytes)", req.Offset, size)
	}
	off := req.Offset
	first := true
	for {
		// The transport returns buf to the pool once the chunk is on the
		// wire (see fetchcodec.go): it is sent without a copy.
		buf := modulewire.Buffers.Get(fetchChunk)
		n, err := f.ReadAt(*buf, off)
		if n > 0 || first {
			*buf = (*buf)[:n]
			chunk := &modulewire.Chunk{Offset: off, Data: mem.NewBuffer(buf, modulewire.Buffers)}
			if first {
				chunk.Size, first = size, false
			}
			if err := stream.SendMsg(chunk); err != nil {
				return err
			}
			off += int64(n)
		} else {
			modulewire.Buffers.Put(buf)
		}
		if errors.Is(err, io.EOF) || off >= size {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read module %s at %d: %w", req.Digest, off, err)
		}
	}
}

// Connect implements AgentService: the agent's one long-lived stream.
func (a *agentServer) Connect(stream v1.AgentService_ConnectServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	c, err := a.caller(ctx)
	if err != nil {
		return err
	}
	id := store.InstanceID(c.Identity.Name)
	in, err := a.Store.GetInstance(ctx, id)
	if err != nil {
		return err
	}
	if in.Status == lifecycle.Terminated {
		return fail.Precondition("instance %s is terminated; its agent may not connect", id)
	}
	// What ends the stream from outside (a newer stream, a revocation)
	// and what wakes it arrive as callbacks into two small channels: no
	// per-stream subscription to every revocation, no channel of its own
	// per cause.
	ended := make(chan error, 1)
	end := func(why error) {
		select {
		case ended <- why:
		default: // the first reason stands
		}
	}
	wake := make(chan struct{}, 1)
	var replaced atomic.Bool
	conn := a.Agents.Register(id, func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}, func() {
		replaced.Store(true)
		end(fail.Unavailable("a newer stream from instance %s replaced this one", id))
	})
	defer a.Agents.Unregister(id, conn)
	var ps presence.Stream
	if a.Presence != nil {
		// Presence is what makes a pool member claimable (design §2.10).
		// A store that cannot take it leaves the member unclaimable, not
		// the agent without its stream.
		var err error
		if ps, err = a.Presence.Open(ctx, id); err != nil {
			a.Log.Warn("agent stream: presence not recorded; the member is not claimable until it reconnects", "instance", id, "err", err)
		}
	}
	defer func() {
		if ps.ID != "" {
			a.Presence.Close(ps)
		}
		// A stream that ends is a cue to ask the provider at once rather
		// than wait out the silence (design §2.8); a newer stream taking
		// over is not.
		if a.StreamLost != nil && !replaced.Load() {
			a.StreamLost(id)
		}
	}()
	defer a.Revoked.OnRevoke(c.Serial, func() { end(fail.Unauthenticated("certificate %s was revoked", c.Serial)) })()

	// Taken before the first settings go out, so a growth in between is
	// not missed.
	grown := a.Agents.Grown()
	if err := stream.Send(&v1.ControlMessage{Msg: &v1.ControlMessage_Settings{Settings: a.settings()}}); err != nil {
		return err
	}
	// The trust bundle: at the start of a stream while a rotation is
	// under way (more than one root), and whenever the CA set changes
	// (design §3.10). With one root there is nothing to learn that the
	// enrollment answer did not say.
	caChanged := a.CA.Changed()
	if b := a.trustBundle(); b != nil && len(b.Roots) > 1 {
		if err := a.sendTrustBundle(stream); err != nil {
			return err
		}
	}

	// The receiver runs apart so that Send stays on this goroutine
	// (a gRPC stream allows one sender at a time). gRPC offers no way to
	// end a waiting Recv with a status of our choosing (a Recv cut by its
	// context writes Canceled to the agent itself), so the reasons above
	// need this goroutine to return them.
	recvErr := make(chan error, 1)
	go func() {
		// What the node sends is read here, outside the interceptors'
		// recovery: a panic on it ends this stream, not tetherd.
		defer func() {
			if v := recover(); v != nil {
				recvErr <- fail.Internal("%v", a.Panics.Note("grpc", v))
			}
		}()
		recvErr <- a.receive(ctx, in, stream)
	}()

	// No per-stream poll: work arrives by notification, and the hub's one
	// sweep query (AgentHub.SweepWork) wakes the streams whose
	// notification was lost. An idle stream costs no CPU.
	sentCancel := map[store.TaskID]bool{}
	resend := settingsResend{clock: a.Clock}
	for look := true; ; {
		if look {
			if err := a.push(ctx, id, stream, sentCancel); err != nil {
				return err
			}
		}
		look = false
		select {
		case <-ctx.Done():
			return nil
		case err := <-recvErr:
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case why := <-ended:
			return why
		case <-wake:
			look = true
		case <-grown:
			// The fleet doubled since this agent was told its settings:
			// its reconnection window is too short for the fleet it would
			// come back with. Nothing to look up, so no task query.
			grown = a.Agents.Grown()
			resend.grew()
		case <-caChanged:
			caChanged = a.CA.Changed()
			if err := a.sendTrustBundle(stream); err != nil {
				return err
			}
		case <-resend.due:
			resend.sent()
			if err := stream.Send(&v1.ControlMessage{Msg: &v1.ControlMessage_Settings{Settings: a.settings()}}); err != nil {
				return err
			}
		}
	}
}

// settingsResendSpread is the most a stream waits to resend its settings
// after the fleet doubled. Every stream learns of a doubling at the same
// instant: sent at once, 16,000 settings messages (and, before, 16,000
// task queries) stalled new connections for 4–5 s in the middle of every
// 19,000-agent reconnect storm (docs/reliability.md).
const settingsResendSpread = 20 * time.Second

// settingsResend paces one stream's settings resend: one per doubling (or
// run of doublings), after a random pause of up to settingsResendSpread.
type settingsResend struct {
	clock clock.Clock
	// int64N draws the pause (default math/rand/v2).
	int64N func(int64) int64
	due    <-chan time.Time // nil: nothing to resend
}

// grew arms the resend, unless one is already due.
func (r *settingsResend) grew() {
	if r.due != nil {
		return
	}
	n := r.int64N
	if n == nil {
		n = rand.Int64N
	}
	c := r.clock
	if c == nil {
		c = clock.Real{}
	}
	r.due = c.After(time.Duration(n(int64(settingsResendSpread))))
}

// sent disarms it.
func (r *settingsResend) sent() { r.due = nil }

// sendTrustBundle sends the CA set's bundle, when there is one.
func (a *agentServer) sendTrustBundle(stream v1.AgentService_ConnectServer) error {
	b := a.trustBundle()
	if b == nil {
		return nil
	}
	return stream.Send(&v1.ControlMessage{Msg: &v1.ControlMessage_TrustBundle{TrustBundle: b}})
}

func (a *agentServer) settings() *v1.Settings {
	connected := a.Agents.Connected()
	return &v1.Settings{
		HeartbeatIntervalSeconds: int32(HeartbeatInterval(connected) / time.Second),
		MaxTaskOutputBytes:       int32(a.Tasks.MaxOutput()),
		TaskLeaseSeconds:         int32(a.Tasks.LeaseDuration() / time.Second),
		ReconnectSpreadMs:        int32(ReconnectSpread(connected) / time.Millisecond),
	}
}

// push leases the instance's pending tasks to it and relays cancellations.
func (a *agentServer) push(ctx context.Context, id store.InstanceID, stream v1.AgentService_ConnectServer, sentCancel map[store.TaskID]bool) error {
	pending, cancels, err := a.Tasks.Open(ctx, id)
	if err != nil {
		a.Log.Warn("read open tasks", "instance", id, "err", err)
		return nil
	}
	for pending {
		t, err := a.Tasks.LeaseNext(ctx, id)
		if err != nil {
			a.Log.Warn("lease task", "instance", id, "err", err)
			break
		}
		if t == nil {
			break
		}
		msg := &v1.TaskAssignment{TaskId: t.ID.String(), Kind: protoconv.TaskKind(t.Kind), LeaseExpiresAt: ntsp(t.LeaseExpiresAt)}
		if p := TaskProto(t); p.Exec != nil {
			msg.Exec = p.Exec
		}
		if err := stream.Send(&v1.ControlMessage{Msg: &v1.ControlMessage_Task{Task: msg}}); err != nil {
			return err
		}
		a.m.TasksPushed.Inc()
	}
	for _, t := range cancels {
		if sentCancel[t.ID] {
			continue
		}
		if err := stream.Send(&v1.ControlMessage{Msg: &v1.ControlMessage_Cancel{Cancel: &v1.TaskCancel{TaskId: t.ID.String()}}}); err != nil {
			return err
		}
		sentCancel[t.ID] = true
	}
	return nil
}

// receive handles what the agent sends until the stream ends. opened is
// the instance as Connect read it; the stream's first ready report
// decides from it whether there is anything to mark, rather than reading
// the row again (every reconnection reports ready at once).
func (a *agentServer) receive(ctx context.Context, opened *store.Instance, stream v1.AgentService_ConnectServer) error {
	id := opened.ID
	var lastPhase, lastError string
	gaveUp := false
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		now := a.Clock.Now()
		switch m := msg.Msg.(type) {
		case *v1.AgentMessage_Heartbeat:
			hb := m.Heartbeat
			if err := validHeartbeat(hb); err != nil {
				return err
			}
			phase := PhaseName(hb.Phase)
			a.Agents.Heartbeat(store.Heartbeat{InstanceID: id, At: now, Phase: phase, AgentVersion: hb.AgentVersion,
				RunningModules: hb.RunningModuleDigests, AgentError: hb.Error, Addresses: hb.Addresses, BootID: hb.BootId})
			switch {
			case hb.Error != "" && hb.BootFailed && !gaveUp:
				if err := a.Instances.AgentGaveUp(ctx, id, phase, hb.Error); err != nil {
					a.Log.Warn("record the agent giving up its boot", "instance", id, "err", err)
				} else {
					gaveUp = true
				}
			case hb.Error != "" && hb.Error != lastError:
				if err := a.Instances.AgentError(ctx, id, phase, hb.Error); err != nil {
					a.Log.Warn("record agent error", "instance", id, "err", err)
				}
			}
			lastError = hb.Error
			if phase == "ready" && lastPhase != "ready" {
				var err error
				if opened != nil {
					err = a.Ready.AgentReadyAsSeen(ctx, opened)
					opened = nil // later reports read afresh
				} else {
					err = a.Ready.AgentReady(ctx, id)
				}
				if err != nil {
					// Not marked running: forget this ready so the agent's next
					// ready heartbeat tries again, rather than leaving the
					// instance in its boot state until the boot timeout. A
					// stream that ended meanwhile (the agent left, tetherd is
					// stopping) canceled the write: no fault, so no error line.
					log := a.Log.Error
					if ctx.Err() != nil {
						log = a.Log.Info
					}
					log("mark instance running failed; retrying at the next ready heartbeat", "instance", id, "err", err)
					phase = ""
				}
			}
			lastPhase = phase
		case *v1.AgentMessage_TaskUpdate:
			u := m.TaskUpdate
			if err := validTaskUpdate(u); err != nil {
				return err
			}
			st, err := protoconv.TaskStatusFrom(u.Status)
			if err != nil {
				return fail.Invalid("task_update.status", "%v", err)
			}
			up := tasks.Update{TaskID: store.TaskID(u.TaskId), Status: st, ErrorMessage: u.ErrorMessage, Progress: u.Progress}
			if r := u.Result; r != nil {
				code := int(r.ExitCode)
				up.ExitCode, up.Output, up.OutputTruncated = &code, r.Output, r.OutputTruncated
			}
			if _, err := a.Tasks.ApplyAgentUpdate(ctx, id, up); err != nil {
				if errors.Is(err, tasks.ErrNotYours) {
					return fail.Denied("task update refused: %v", err)
				}
				if errors.Is(err, store.ErrNotFound) {
					return fail.Denied("task update refused: no task %s for instance %s", u.TaskId, id)
				}
				return err
			}
		default:
			return fail.Invalid("msg", "empty agent message")
		}
	}
}

// The heartbeat and reconnection rates are the hub's (controlplane/agenthub);
// these names are the agent API's, which its settings carry.

// HeartbeatInterval is agenthub.HeartbeatInterval.
func HeartbeatInterval(connected int) time.Duration { return agenthub.HeartbeatInterval(connected) }

// ReconnectSpread is agenthub.ReconnectSpread.
func ReconnectSpread(connected int) time.Duration { return agenthub.ReconnectSpread(connected) }

// Heartbeat and reconnection rate limits (see agenthub).
const (
	BaseHeartbeatInterval  = agenthub.BaseHeartbeatInterval
	MaxHeartbeatsPerSecond = agenthub.MaxHeartbeatsPerSecond
	MaxReconnectsPerSecond = agenthub.MaxReconnectsPerSecond
	MaxReconnectSpread     = agenthub.MaxReconnectSpread
)
