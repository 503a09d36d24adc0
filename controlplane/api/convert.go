package api

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherfleet/tether/controlplane/api/protoconv"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/tasks"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Responses carry the store's precision (microseconds), so an object reads
// the same right after it is created as it does later.
func tsp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t.Truncate(time.Microsecond))
}

func ntsp(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return tsp(*t)
}

// protoEnum is a generated enum whose values are PREFIX_NAME and whose zero
// value is PREFIX_UNSPECIFIED.
type protoEnum interface {
	~int32
	String() string
}

// storedName is how an enum value is stored: INSTANCE_STATUS_PENDING is
// "pending", UNSPECIFIED is "".
func storedName[E protoEnum](prefix string, e E) string {
	if e == 0 {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(e.String(), prefix))
}

// fromStored is the enum value of a stored name (UNSPECIFIED if unknown).
func fromStored[E protoEnum](prefix, name string, values map[string]int32) E {
	return E(values[prefix+strings.ToUpper(name)])
}

// InstanceStatusName is the stored form of a proto status.
func InstanceStatusName(s v1.InstanceStatus) lifecycle.State {
	return lifecycle.State(storedName("INSTANCE_STATUS_", s))
}

// PhaseName is the stored form of an agent phase.
func PhaseName(p v1.AgentPhase) string { return storedName("AGENT_PHASE_", p) }

// PoolStateName is the stored form of a pool state.
func PoolStateName(s v1.PoolState) lifecycle.PoolState {
	return lifecycle.PoolState(storedName("POOL_STATE_", s))
}

func instanceStatus(s lifecycle.State) v1.InstanceStatus {
	return fromStored[v1.InstanceStatus]("INSTANCE_STATUS_", string(s), v1.InstanceStatus_value)
}

func agentPhase(name string) v1.AgentPhase {
	return fromStored[v1.AgentPhase]("AGENT_PHASE_", name, v1.AgentPhase_value)
}

func poolState(s lifecycle.PoolState) v1.PoolState {
	return fromStored[v1.PoolState]("POOL_STATE_", string(s), v1.PoolState_value)
}

func jsonStruct(raw json.RawMessage) *structpb.Struct {
	if len(raw) == 0 {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || len(m) == 0 {
		return nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		return nil
	}
	return s
}

func templateProto(t *store.Template, modules map[store.ModuleRef]*store.Module) *v1.Template {
	refs := func(rs []store.ModuleRef) []*v1.ModuleRef {
		out := make([]*v1.ModuleRef, 0, len(rs))
		for _, r := range rs {
			mr := &v1.ModuleRef{Name: r.Name, Version: r.Version}
			if m := modules[r]; m != nil {
				mr.Digest, mr.Size = m.Digest, m.Size
			}
			out = append(out, mr)
		}
		return out
	}
	return &v1.Template{
		Id: t.ID.String(), Name: t.Name, RootModules: refs(t.RootModules), ExtensionModules: refs(t.ExtensionModules),
		KernelDigest: t.KernelDigest, InitramfsDigest: t.InitramfsDigest, KernelArgs: t.KernelArgs,
		Console: templateConsole(t), RequireSignedModules: t.RequireSignedModules, CreatedAt: tsp(t.CreatedAt), UpdatedAt: tsp(t.UpdatedAt),
		RequiredSigners: t.RequiredSigners, RequireAttestation: t.RequireAttestation,
	}
}

func moduleProto(m *store.Module) *v1.Module {
	out := &v1.Module{Name: m.Name, Version: m.Version, Digest: m.Digest, Size: m.Size, Signature: m.Signature, CreatedAt: tsp(m.CreatedAt)}
	for _, s := range m.Signatures {
		out.Signatures = append(out.Signatures, &v1.ModuleSignature{Signer: s.Signer, SignerName: s.SignerName,
			PublicKey: s.PublicKey, Signature: s.Signature, CreatedAt: tsp(s.CreatedAt)})
	}
	return out
}

func nodeProto(n *store.Node, templateName string) *v1.Node {
	return &v1.Node{Id: n.ID, Name: n.Name, TemplateId: n.TemplateID.String(), TemplateName: templateName, Enabled: n.Enabled,
		Config: jsonStruct(n.Config), PublicAddress: n.PublicAddress, Macs: n.MACs, EkHashes: n.EKHashes, RequireAttestation: n.RequireAttestation, Bmc: nodeBMCProto(n.BMC), CreatedAt: tsp(n.CreatedAt), UpdatedAt: tsp(n.UpdatedAt)}
}

// InstanceProto converts an instance.
func InstanceProto(in *store.Instance, nodeName string) *v1.Instance {
	p := &v1.Instance{
		Id: in.ID, NodeId: in.NodeID, NodeName: nodeName, Status: instanceStatus(in.Status), Provider: in.Provider,
		Region: in.Region, InstanceType: in.InstanceType, CloudInstanceId: in.CloudInstanceID, OperationId: in.OperationID,
		PoolId: in.PoolID, PoolState: poolState(in.PoolState), PoolWarmingStartedAt: ntsp(in.PoolWarmingStartedAt),
		PoolReadyAt: ntsp(in.PoolReadyAt), PoolAcquiredAt: ntsp(in.PoolAcquiredAt), ClaimId: in.ClaimID,
		Hold: in.Hold, HoldReason: in.HoldReason, LastHeartbeatAt: ntsp(in.LastHeartbeatAt), AgentPhase: agentPhase(in.AgentPhase),
		AgentVersion: in.AgentVersion, RunningModuleDigests: in.RunningModules, ErrorMessage: in.ErrorMessage,
		AgentError: in.AgentError, Addresses: in.Addresses, CreatedAt: tsp(in.CreatedAt), UpdatedAt: tsp(in.UpdatedAt),
		TerminateRequestedAt: ntsp(in.TerminateRequestedAt), SilentSince: ntsp(in.SilentSince),
	}
	if c := in.Cordon; c != nil {
		p.Cordon = &v1.CordonMarker{By: c.By, Reason: c.Reason, At: tsp(c.At), PoolStateBefore: poolState(c.PoolStateBefore)}
	}
	return p
}

// presenceProto says whether a replica vouches for the agent at now.
func presenceProto(p *store.Presence, now time.Time) *v1.AgentPresence {
	if p == nil {
		return nil
	}
	out := &v1.AgentPresence{Connected: p.Live(now), Replica: p.Replica, ConnectedAt: tsp(p.ConnectedAt)}
	switch {
	case p.LostAt != nil:
		out.LostAt = tsp(*p.LostAt)
	case !out.Connected:
		out.LostAt = tsp(p.LeaseUntil) // its replica stopped renewing
	}
	return out
}

func certProto(c *store.Certificate) *v1.Certificate {
	return &v1.Certificate{Serial: c.Serial, InstanceId: c.InstanceID, Kind: protoconv.CertKind(c.Kind), Subject: c.Subject,
		NotBefore: tsp(c.NotBefore), NotAfter: tsp(c.NotAfter), RevokedAt: ntsp(c.RevokedAt), RevokeReason: c.RevokeReason}
}

// TaskProto converts a task.
func TaskProto(t *store.Task) *v1.Task {
	p := &v1.Task{
		Id: t.ID.String(), Target: protoconv.TaskTarget(t.Target), InstanceId: t.InstanceID, Kind: protoconv.TaskKind(t.Kind), Status: protoconv.TaskStatus(t.Status),
		LeaseOwner: t.LeaseOwner, LeaseExpiresAt: ntsp(t.LeaseExpiresAt), Attempts: int32(t.Attempts), MaxAttempts: int32(t.MaxAttempts),
		ErrorMessage: t.ErrorMessage, Progress: t.Progress, CreatedAt: tsp(t.CreatedAt), UpdatedAt: tsp(t.UpdatedAt),
	}
	if t.Kind == store.TaskKindExec {
		var e tasks.Exec
		if json.Unmarshal(t.Payload, &e) == nil {
			p.Exec = &v1.ExecPayload{Argv: e.Argv, TimeoutSeconds: e.TimeoutSeconds}
		}
	}
	if t.ExitCode != nil || len(t.Output) > 0 {
		r := &v1.TaskResult{Output: t.Output, OutputTruncated: t.OutputTruncated}
		if t.ExitCode != nil {
			r.ExitCode = int32(*t.ExitCode)
		}
		p.Result = r
	}
	return p
}

func eventProto(e *store.Event) *v1.FleetEvent {
	return &v1.FleetEvent{Id: strconv.FormatInt(e.ID, 10), Kind: e.Kind.String(), Severity: protoconv.Severity(e.Severity), InstanceId: e.InstanceID,
		PoolId: e.PoolID, CorrelationId: e.CorrelationID, Message: e.Message, Payload: jsonStruct(e.Payload), CreatedAt: tsp(e.CreatedAt)}
}
