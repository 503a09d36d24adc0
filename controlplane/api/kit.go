package api

import (
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// The conversions, paging and caller helpers live in adminkit, shared with
// the resource packages under admin/; these short names keep the handlers
// still in this package as they read.

// listBudget bounds the encoded size of one list response.
const listBudget = adminkit.ListBudget

type budget = adminkit.Budget

func itoa(i int) string { return strconv.Itoa(i) }

func page(size int32, token string) (store.Page, error) { return adminkit.Page(size, token) }

func updateMask(mask []string, allowed ...string) (map[string]bool, error) {
	return adminkit.UpdateMask(mask, allowed...)
}

func tsp(t time.Time) *timestamppb.Timestamp   { return adminkit.Timestamp(t) }
func ntsp(t *time.Time) *timestamppb.Timestamp { return adminkit.TimestampPtr(t) }

// InstanceStatusName is the stored form of a proto status.
func InstanceStatusName(s v1.InstanceStatus) lifecycle.State { return adminkit.InstanceStatusName(s) }

// PhaseName is the stored form of an agent phase.
func PhaseName(p v1.AgentPhase) string { return adminkit.PhaseName(p) }

// PoolStateName is the stored form of a pool state.
func PoolStateName(s v1.PoolState) lifecycle.PoolState { return adminkit.PoolStateName(s) }

// LifecycleClassName is the stored form of a lifecycle class.
func LifecycleClassName(c v1.LifecycleClass) string { return adminkit.LifecycleClassName(c) }

// InstanceProto converts an instance.
func InstanceProto(in *store.Instance, nodeName string) *v1.Instance {
	return adminkit.InstanceProto(in, nodeName)
}

// TaskProto converts a task.
func TaskProto(t *store.Task) *v1.Task { return adminkit.TaskProto(t) }

func instanceStatus(s lifecycle.State) v1.InstanceStatus { return adminkit.InstanceStatus(s) }
func agentPhase(name string) v1.AgentPhase               { return adminkit.AgentPhase(name) }
func poolState(s lifecycle.PoolState) v1.PoolState       { return adminkit.PoolState(s) }
func templateProto(t *store.Template, modules map[store.ModuleRef]*store.Module) *v1.Template {
	return adminkit.TemplateProto(t, modules)
}
func moduleProto(m *store.Module) *v1.Module { return adminkit.ModuleProto(m) }
func nodeProto(n *store.Node, templateName string) *v1.Node {
	return adminkit.NodeProto(n, templateName)
}
func presenceProto(p *store.Presence, now time.Time) *v1.AgentPresence {
	return adminkit.PresenceProto(p, now)
}
func certProto(c *store.Certificate) *v1.Certificate { return adminkit.CertProto(c) }
func eventProto(e *store.Event) *v1.FleetEvent       { return adminkit.EventProto(e) }
func templateConsole(t *store.Template) string       { return adminkit.TemplateConsole(t) }
func nodeBMCProto(b store.NodeBMC) *v1.NodeBMC       { return adminkit.NodeBMCProto(b) }
