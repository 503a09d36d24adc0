package api

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherfleet/tether/controlplane/store"
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

// enumName maps "pending" <-> INSTANCE_STATUS_PENDING for every enum whose
// values are PREFIX_NAME.
func enumName(prefix, full string) string {
	return strings.ToLower(strings.TrimPrefix(full, prefix))
}

func enumValue(prefix, name string, values map[string]int32) int32 {
	return values[prefix+strings.ToUpper(name)]
}

// InstanceStatusName is the stored form of a proto status.
func InstanceStatusName(s v1.InstanceStatus) string {
	if s == v1.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED {
		return ""
	}
	return enumName("INSTANCE_STATUS_", s.String())
}

func instanceStatus(name string) v1.InstanceStatus {
	return v1.InstanceStatus(enumValue("INSTANCE_STATUS_", name, v1.InstanceStatus_value))
}

// PhaseName is the stored form of an agent phase.
func PhaseName(p v1.AgentPhase) string {
	if p == v1.AgentPhase_AGENT_PHASE_UNSPECIFIED {
		return ""
	}
	return enumName("AGENT_PHASE_", p.String())
}

func agentPhase(name string) v1.AgentPhase {
	return v1.AgentPhase(enumValue("AGENT_PHASE_", name, v1.AgentPhase_value))
}

func poolState(name string) v1.PoolState {
	return v1.PoolState(enumValue("POOL_STATE_", name, v1.PoolState_value))
}

// PoolStateName is the stored form of a pool state.
func PoolStateName(s v1.PoolState) string {
	if s == v1.PoolState_POOL_STATE_UNSPECIFIED {
		return ""
	}
	return enumName("POOL_STATE_", s.String())
}

// TaskKindName is the stored form of a task kind.
func TaskKindName(k v1.TaskKind) string {
	if k == v1.TaskKind_TASK_KIND_UNSPECIFIED {
		return ""
	}
	return enumName("TASK_KIND_", k.String())
}

func taskKind(name string) v1.TaskKind {
	return v1.TaskKind(enumValue("TASK_KIND_", name, v1.TaskKind_value))
}

// TaskStatusName is the stored form of a task status.
func TaskStatusName(s v1.TaskStatus) string {
	if s == v1.TaskStatus_TASK_STATUS_UNSPECIFIED {
		return ""
	}
	return enumName("TASK_STATUS_", s.String())
}

func taskStatus(name string) v1.TaskStatus {
	return v1.TaskStatus(enumValue("TASK_STATUS_", name, v1.TaskStatus_value))
}

// TaskTargetName is the stored form of a task target.
func TaskTargetName(t v1.TaskTarget) string {
	if t == v1.TaskTarget_TASK_TARGET_UNSPECIFIED {
		return ""
	}
	return enumName("TASK_TARGET_", t.String())
}

func taskTarget(name string) v1.TaskTarget {
	return v1.TaskTarget(enumValue("TASK_TARGET_", name, v1.TaskTarget_value))
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
		Id: t.ID, Name: t.Name, RootModules: refs(t.RootModules), ExtensionModules: refs(t.ExtensionModules),
		KernelDigest: t.KernelDigest, InitramfsDigest: t.InitramfsDigest, KernelArgs: t.KernelArgs,
		RequireSignedModules: t.RequireSignedModules, CreatedAt: tsp(t.CreatedAt), UpdatedAt: tsp(t.UpdatedAt),
	}
}

func moduleProto(m *store.Module) *v1.Module {
	return &v1.Module{Name: m.Name, Version: m.Version, Digest: m.Digest, Size: m.Size, Signature: m.Signature, CreatedAt: tsp(m.CreatedAt)}
}

func nodeProto(n *store.Node, templateName string) *v1.Node {
	return &v1.Node{Id: n.ID, Name: n.Name, TemplateId: n.TemplateID, TemplateName: templateName, Enabled: n.Enabled,
		Config: jsonStruct(n.Config), PublicAddress: n.PublicAddress, CreatedAt: tsp(n.CreatedAt), UpdatedAt: tsp(n.UpdatedAt)}
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

func certProto(c *store.Certificate) *v1.Certificate {
	kind := v1.CertificateKind_CERTIFICATE_KIND_NODE
	switch c.Kind {
	case store.CertKindAdmin:
		kind = v1.CertificateKind_CERTIFICATE_KIND_ADMIN
	case store.CertKindServer:
		kind = v1.CertificateKind_CERTIFICATE_KIND_SERVER
	}
	return &v1.Certificate{Serial: c.Serial, InstanceId: c.InstanceID, Kind: kind, Subject: c.Subject,
		NotBefore: tsp(c.NotBefore), NotAfter: tsp(c.NotAfter), RevokedAt: ntsp(c.RevokedAt), RevokeReason: c.RevokeReason}
}

// ExecPayload is the stored payload of an exec task.
type ExecPayload struct {
	Argv           []string `json:"argv"`
	TimeoutSeconds int32    `json:"timeout_seconds,omitempty"`
}

// TaskProto converts a task.
func TaskProto(t *store.Task) *v1.Task {
	p := &v1.Task{
		Id: t.ID, Target: taskTarget(t.Target), InstanceId: t.InstanceID, Kind: taskKind(t.Kind), Status: taskStatus(t.Status),
		LeaseOwner: t.LeaseOwner, LeaseExpiresAt: ntsp(t.LeaseExpiresAt), Attempts: int32(t.Attempts), MaxAttempts: int32(t.MaxAttempts),
		ErrorMessage: t.ErrorMessage, Progress: t.Progress, CreatedAt: tsp(t.CreatedAt), UpdatedAt: tsp(t.UpdatedAt),
	}
	if t.Kind == "exec" {
		var e ExecPayload
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
	return &v1.FleetEvent{Id: strconv.FormatInt(e.ID, 10), Kind: e.Kind, Severity: v1.Severity(e.Severity), InstanceId: e.InstanceID,
		PoolId: e.PoolID, CorrelationId: e.CorrelationID, Message: e.Message, Payload: jsonStruct(e.Payload), CreatedAt: tsp(e.CreatedAt)}
}
