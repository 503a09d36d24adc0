package adminkit

import (
	"context"
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

// Timestamp converts a stored time. Responses carry the store's precision (microseconds), so an object reads
// the same right after it is created as it does later.
func Timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t.Truncate(time.Microsecond))
}

// TimestampPtr converts an optional stored time.
func TimestampPtr(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return Timestamp(*t)
}

// ProtoEnum is a generated enum whose values are PREFIX_NAME and whose zero
// value is PREFIX_UNSPECIFIED.
type ProtoEnum interface {
	~int32
	String() string
}

// StoredName is how an enum value is stored: INSTANCE_STATUS_PENDING is
// "pending", UNSPECIFIED is "".
func StoredName[E ProtoEnum](prefix string, e E) string {
	if e == 0 {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(e.String(), prefix))
}

// FromStored is the enum value of a stored name (UNSPECIFIED if unknown).
func FromStored[E ProtoEnum](prefix, name string, values map[string]int32) E {
	return E(values[prefix+strings.ToUpper(name)])
}

// InstanceStatusName is the stored form of a proto status.
func InstanceStatusName(s v1.InstanceStatus) lifecycle.State {
	return lifecycle.State(StoredName("INSTANCE_STATUS_", s))
}

// PhaseName is the stored form of an agent phase.
func PhaseName(p v1.AgentPhase) string { return StoredName("AGENT_PHASE_", p) }

// PoolStateName is the stored form of a pool state.
func PoolStateName(s v1.PoolState) lifecycle.PoolState {
	return lifecycle.PoolState(StoredName("POOL_STATE_", s))
}

// InstanceStatus is the proto form of an instance status.
func InstanceStatus(s lifecycle.State) v1.InstanceStatus {
	return FromStored[v1.InstanceStatus]("INSTANCE_STATUS_", string(s), v1.InstanceStatus_value)
}

// AgentPhase is the proto form of an agent phase.
func AgentPhase(name string) v1.AgentPhase {
	return FromStored[v1.AgentPhase]("AGENT_PHASE_", name, v1.AgentPhase_value)
}

// PoolState is the proto form of a pool state.
func PoolState(s lifecycle.PoolState) v1.PoolState {
	return FromStored[v1.PoolState]("POOL_STATE_", string(s), v1.PoolState_value)
}

// JSONStruct is a stored JSON object as a Struct (nil when empty or not an object).
func JSONStruct(raw json.RawMessage) *structpb.Struct {
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

// TemplateProto converts a template; modules fill in each reference's digest and size.
func TemplateProto(t *store.Template, modules map[store.ModuleRef]*store.Module) *v1.Template {
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
		Console: TemplateConsole(t), RequireSignedModules: t.RequireSignedModules, CreatedAt: Timestamp(t.CreatedAt), UpdatedAt: Timestamp(t.UpdatedAt),
		RequiredSigners: t.RequiredSigners, RequireAttestation: t.RequireAttestation,
	}
}

// ModuleProto converts a module.
func ModuleProto(m *store.Module) *v1.Module {
	out := &v1.Module{Name: m.Name, Version: m.Version, Digest: m.Digest, Size: m.Size, Signature: m.Signature, CreatedAt: Timestamp(m.CreatedAt)}
	for _, s := range m.Signatures {
		out.Signatures = append(out.Signatures, &v1.ModuleSignature{Signer: s.Signer, SignerName: s.SignerName,
			PublicKey: s.PublicKey, Signature: s.Signature, CreatedAt: Timestamp(s.CreatedAt)})
	}
	return out
}

// NodeProto converts a node.
func NodeProto(n *store.Node, templateName string) *v1.Node {
	return &v1.Node{Id: n.ID.String(), Name: n.Name, TemplateId: n.TemplateID.String(), TemplateName: templateName, Enabled: n.Enabled,
		Config: JSONStruct(n.Config), PublicAddress: n.PublicAddress, Macs: n.MACs, EkHashes: n.EKHashes, RequireAttestation: n.RequireAttestation, Bmc: NodeBMCProto(n.BMC), CreatedAt: Timestamp(n.CreatedAt), UpdatedAt: Timestamp(n.UpdatedAt)}
}

// InstanceProto converts an instance.
func InstanceProto(in *store.Instance, nodeName string) *v1.Instance {
	p := &v1.Instance{
		Id: in.ID.String(), NodeId: in.NodeID.String(), NodeName: nodeName, Status: InstanceStatus(in.Status), Provider: in.Provider,
		Region: in.Region, InstanceType: in.InstanceType, CloudInstanceId: in.CloudInstanceID, OperationId: in.OperationID,
		PoolId: in.PoolID.String(), PoolState: PoolState(in.PoolState), PoolWarmingStartedAt: TimestampPtr(in.PoolWarmingStartedAt),
		PoolReadyAt: TimestampPtr(in.PoolReadyAt), PoolAcquiredAt: TimestampPtr(in.PoolAcquiredAt), ClaimId: in.ClaimID.String(),
		Hold: in.Hold, HoldReason: in.HoldReason, LastHeartbeatAt: TimestampPtr(in.LastHeartbeatAt), AgentPhase: AgentPhase(in.AgentPhase),
		AgentVersion: in.AgentVersion, RunningModuleDigests: in.RunningModules, ErrorMessage: in.ErrorMessage,
		AgentError: in.AgentError, Addresses: in.Addresses, CreatedAt: Timestamp(in.CreatedAt), UpdatedAt: Timestamp(in.UpdatedAt),
		TerminateRequestedAt: TimestampPtr(in.TerminateRequestedAt), SilentSince: TimestampPtr(in.SilentSince),
	}
	if c := in.Cordon; c != nil {
		p.Cordon = &v1.CordonMarker{By: c.By, Reason: c.Reason, At: Timestamp(c.At), PoolStateBefore: PoolState(c.PoolStateBefore)}
	}
	return p
}

// PresenceProto says whether a replica vouches for the agent at now.
func PresenceProto(p *store.Presence, now time.Time) *v1.AgentPresence {
	if p == nil {
		return nil
	}
	out := &v1.AgentPresence{Connected: p.Live(now), Replica: p.Replica, ConnectedAt: Timestamp(p.ConnectedAt)}
	switch {
	case p.LostAt != nil:
		out.LostAt = Timestamp(*p.LostAt)
	case !out.Connected:
		out.LostAt = Timestamp(p.LeaseUntil) // its replica stopped renewing
	}
	return out
}

// CertProto converts a certificate.
func CertProto(c *store.Certificate) *v1.Certificate {
	return &v1.Certificate{Serial: c.Serial.String(), InstanceId: c.InstanceID.String(), Kind: protoconv.CertKind(c.Kind), Subject: c.Subject,
		NotBefore: Timestamp(c.NotBefore), NotAfter: Timestamp(c.NotAfter), RevokedAt: TimestampPtr(c.RevokedAt), RevokeReason: c.RevokeReason}
}

// TaskProto converts a task.
func TaskProto(t *store.Task) *v1.Task {
	p := &v1.Task{
		Id: t.ID.String(), Target: protoconv.TaskTarget(t.Target), InstanceId: t.InstanceID.String(), Kind: protoconv.TaskKind(t.Kind), Status: protoconv.TaskStatus(t.Status),
		LeaseOwner: t.LeaseOwner, LeaseExpiresAt: TimestampPtr(t.LeaseExpiresAt), Attempts: int32(t.Attempts), MaxAttempts: int32(t.MaxAttempts),
		ErrorMessage: t.ErrorMessage, Progress: t.Progress, CreatedAt: Timestamp(t.CreatedAt), UpdatedAt: Timestamp(t.UpdatedAt),
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

// EventProto converts an event.
func EventProto(e *store.Event) *v1.FleetEvent {
	return &v1.FleetEvent{Id: strconv.FormatInt(e.ID, 10), Kind: e.Kind.String(), Severity: protoconv.Severity(e.Severity), InstanceId: e.InstanceID.String(),
		PoolId: e.PoolID.String(), CorrelationId: e.CorrelationID.String(), Message: e.Message, Payload: JSONStruct(e.Payload), CreatedAt: Timestamp(e.CreatedAt)}
}

// TemplateConsole is what a template's console reads as: rows from before
// the setting existed have the default.
func TemplateConsole(t *store.Template) string {
	if t.Console == "" {
		return store.DefaultConsole
	}
	return t.Console
}

// NodeBMCProto converts a node's BMC (nil when it has none).
func NodeBMCProto(b store.NodeBMC) *v1.NodeBMC {
	if b.Address == "" {
		return nil
	}
	return &v1.NodeBMC{Address: b.Address, Credential: b.Credential, CaPem: b.CAPEM, Fingerprint: b.Fingerprint,
		InsecureSkipVerify: b.Insecure, BootMode: b.BootMode}
}

// LifecycleClassName is the stored form of a lifecycle class ("" for
// unspecified).
func LifecycleClassName(c v1.LifecycleClass) string { return StoredName("LIFECYCLE_CLASS_", c) }

// LifecycleClass is the proto form of a stored lifecycle class.
func LifecycleClass(name string) v1.LifecycleClass {
	return FromStored[v1.LifecycleClass]("LIFECYCLE_CLASS_", name, v1.LifecycleClass_value)
}

// PoolStatus is the proto form of a stored pool status.
func PoolStatus(name string) v1.PoolStatus {
	return FromStored[v1.PoolStatus]("POOL_STATUS_", name, v1.PoolStatus_value)
}

// InstanceReads are the reads InstanceOut makes.
type InstanceReads interface {
	GetNodeByID(ctx context.Context, id store.NodeID) (*store.Node, error)
	ListPresence(ctx context.Context, ids []store.InstanceID) (map[store.InstanceID]*store.Presence, error)
}

// InstanceOut converts an instance with its node's name and whether a
// replica vouches for its agent at now.
func InstanceOut(ctx context.Context, q InstanceReads, now time.Time, in *store.Instance) (*v1.Instance, error) {
	n, err := q.GetNodeByID(ctx, in.NodeID)
	if err != nil {
		return nil, err
	}
	out := InstanceProto(in, n.Name)
	ps, err := q.ListPresence(ctx, []store.InstanceID{in.ID})
	if err != nil {
		return nil, err
	}
	out.AgentPresence = PresenceProto(ps[in.ID], now)
	return out, nil
}

// IDStrings turns typed ids into a response's repeated string field.
func IDStrings[ID ~string](ids []ID) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = string(id)
	}
	return out
}
