package api

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherfleet/tether/controlplane/api/admin/adminkit"
	"github.com/tetherfleet/tether/controlplane/store"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// The conversions, paging and caller helpers live in adminkit, shared with
// the resource packages under admin/; these short names serve the agent
// and enrollment services in this package.

// listBudget bounds the encoded size of one list response.
const listBudget = adminkit.ListBudget

func tsp(t time.Time) *timestamppb.Timestamp   { return adminkit.Timestamp(t) }
func ntsp(t *time.Time) *timestamppb.Timestamp { return adminkit.TimestampPtr(t) }

// PhaseName is the stored form of an agent phase.
func PhaseName(p v1.AgentPhase) string { return adminkit.PhaseName(p) }

// TaskProto converts a task.
func TaskProto(t *store.Task) *v1.Task { return adminkit.TaskProto(t) }

func moduleProto(m *store.Module) *v1.Module { return adminkit.ModuleProto(m) }
