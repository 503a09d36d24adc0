package dashboard

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// States in lifecycle order; each has one colour everywhere (see app.css).
var instanceStates = []v1.InstanceStatus{
	v1.InstanceStatus_INSTANCE_STATUS_PENDING,
	v1.InstanceStatus_INSTANCE_STATUS_PROVISIONING,
	v1.InstanceStatus_INSTANCE_STATUS_STARTING,
	v1.InstanceStatus_INSTANCE_STATUS_RUNNING,
	v1.InstanceStatus_INSTANCE_STATUS_STOPPING,
	v1.InstanceStatus_INSTANCE_STATUS_STOPPED,
	v1.InstanceStatus_INSTANCE_STATUS_REBOOTING,
	v1.InstanceStatus_INSTANCE_STATUS_TERMINATED,
	v1.InstanceStatus_INSTANCE_STATUS_ERROR,
}

var poolStates = []v1.PoolState{
	v1.PoolState_POOL_STATE_WARMING,
	v1.PoolState_POOL_STATE_READY,
	v1.PoolState_POOL_STATE_CLAIMED,
	v1.PoolState_POOL_STATE_DRAINING,
	v1.PoolState_POOL_STATE_ERRORED,
}

// stateName shows INSTANCE_STATUS_RUNNING as running.
func stateName(s v1.InstanceStatus) string { return lower(s.String(), "INSTANCE_STATUS_") }
func poolStateName(s v1.PoolState) string  { return lower(s.String(), "POOL_STATE_") }
func poolStatusName(s v1.PoolStatus) string {
	return lower(s.String(), "POOL_STATUS_")
}
func phaseName(p v1.AgentPhase) string      { return lower(p.String(), "AGENT_PHASE_") }
func taskStatusName(s v1.TaskStatus) string { return lower(s.String(), "TASK_STATUS_") }
func taskKindName(k v1.TaskKind) string     { return lower(k.String(), "TASK_KIND_") }
func severityName(s v1.Severity) string     { return lower(s.String(), "SEVERITY_") }

func lower(full, prefix string) string {
	s := strings.ToLower(strings.TrimPrefix(full, prefix))
	if s == "unspecified" {
		return ""
	}
	return s
}

func parseState(s string) (v1.InstanceStatus, error) {
	if s == "" {
		return v1.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED, nil
	}
	v, ok := v1.InstanceStatus_value["INSTANCE_STATUS_"+strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("state %q: want one of pending, provisioning, starting, running, stopping, stopped, rebooting, terminated, error", s)
	}
	return v1.InstanceStatus(v), nil
}

func parseSeverity(s string) (v1.Severity, error) {
	if s == "" {
		return v1.Severity_SEVERITY_UNSPECIFIED, nil
	}
	v, ok := v1.Severity_value["SEVERITY_"+strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("severity %q: want low, medium, high or critical", s)
	}
	return v1.Severity(v), nil
}

// allInstances pages through every instance that matches req. The server
// decides the page size; the dashboard never assumes one.
func (s *Server) allInstances(ctx context.Context, req *v1.ListInstancesRequest) ([]*v1.Instance, error) {
	var out []*v1.Instance
	req.PageSize = 1000
	for {
		resp, err := s.cfg.Client.ListInstances(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Instances...)
		if resp.NextPageToken == "" {
			return out, nil
		}
		req.PageToken = resp.NextPageToken
	}
}

func (s *Server) allPools(ctx context.Context) ([]*v1.Pool, error) {
	var out []*v1.Pool
	req := &v1.ListPoolsRequest{PageSize: 1000}
	for {
		resp, err := s.cfg.Client.ListPools(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, resp.Pools...)
		if resp.NextPageToken == "" {
			return out, nil
		}
		req.PageToken = resp.NextPageToken
	}
}

// eventsSince pages through events (newest first) until one is older than since.
func (s *Server) eventsSince(ctx context.Context, req *v1.ListEventsRequest, since time.Time, max int) ([]*v1.FleetEvent, error) {
	var out []*v1.FleetEvent
	req.PageSize = 500
	for {
		resp, err := s.cfg.Client.ListEvents(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, e := range resp.Events {
			if e.CreatedAt.AsTime().Before(since) || len(out) >= max {
				return out, nil
			}
			out = append(out, e)
		}
		if resp.NextPageToken == "" {
			return out, nil
		}
		req.PageToken = resp.NextPageToken
	}
}

type stateCount struct {
	State string
	Count int
}

type fleetSummary struct {
	Total   int
	States  []stateCount
	Silent  []*v1.Instance
	Dead    []*v1.Instance
	Pools   []*v1.Pool
	Alerts  []*v1.FleetEvent
	Elapsed time.Duration
}

// presumedDead is how liveness words its verdict (docs/design.md, liveness).
func presumedDead(in *v1.Instance) bool {
	return in.Status == v1.InstanceStatus_INSTANCE_STATUS_ERROR && strings.HasPrefix(in.ErrorMessage, "presumed dead")
}

func (s *Server) fleet(ctx context.Context) (*fleetSummary, error) {
	start := s.cfg.Clock.Now()
	ins, err := s.allInstances(ctx, &v1.ListInstancesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list instances: %w", err)
	}
	pools, err := s.allPools(ctx)
	if err != nil {
		return nil, fmt.Errorf("list pools: %w", err)
	}
	alerts, err := s.cfg.Client.ListEvents(ctx, &v1.ListEventsRequest{MinSeverity: v1.Severity_SEVERITY_HIGH, PageSize: 15})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	counts := map[v1.InstanceStatus]int{}
	sum := &fleetSummary{Total: len(ins), Pools: pools, Alerts: alerts.Events}
	for _, in := range ins {
		counts[in.Status]++
		if in.SilentSince != nil && in.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED && !presumedDead(in) {
			sum.Silent = append(sum.Silent, in)
		}
		if presumedDead(in) {
			sum.Dead = append(sum.Dead, in)
		}
	}
	for _, st := range instanceStates {
		sum.States = append(sum.States, stateCount{stateName(st), counts[st]})
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Name < pools[j].Name })
	sum.Silent = firstN(sum.Silent, 50)
	sum.Dead = firstN(sum.Dead, 50)
	sum.Elapsed = s.cfg.Clock.Now().Sub(start)
	return sum, nil
}

func firstN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// instanceFilter is the instance list's query.
type instanceFilter struct {
	State, Node, Pool, Provider, Text string
	Page                              string
	Size                              int
}

func (f instanceFilter) matches(in *v1.Instance) bool {
	if f.Provider != "" && in.Provider != f.Provider {
		return false
	}
	if f.Text == "" {
		return true
	}
	t := strings.ToLower(f.Text)
	for _, v := range append([]string{in.Id, in.NodeName, in.ErrorMessage, in.AgentError, in.CloudInstanceId}, in.Addresses...) {
		if strings.Contains(strings.ToLower(v), t) {
			return true
		}
	}
	return false
}

// instancePage fills one page of at most f.Size matching rows, reading
// server pages as needed; the returned token resumes after the last row
// read, so a filter that matches rarely still pages forward.
func (s *Server) instancePageRows(ctx context.Context, f instanceFilter) ([]*v1.Instance, string, error) {
	st, err := parseState(f.State)
	if err != nil {
		return nil, "", err
	}
	req := &v1.ListInstancesRequest{Status: st, Node: f.Node, Pool: f.Pool, PageSize: int32(f.Size), PageToken: f.Page}
	var rows []*v1.Instance
	for {
		resp, err := s.cfg.Client.ListInstances(ctx, req)
		if err != nil {
			return nil, "", err
		}
		for _, in := range resp.Instances {
			if f.matches(in) {
				rows = append(rows, in)
			}
		}
		if resp.NextPageToken == "" || len(rows) >= f.Size {
			return rows, resp.NextPageToken, nil
		}
		req.PageToken = resp.NextPageToken
	}
}

// claim is one row of a pool's claim history.
type claim struct {
	ClaimID, Instance, By, For, Disposition string
	At                                      time.Time
	Held                                    string
}

func payloadString(e *v1.FleetEvent, key string) string {
	if e.Payload == nil {
		return ""
	}
	v, ok := e.Payload.Fields[key]
	if !ok {
		return ""
	}
	if s := v.GetStringValue(); s != "" {
		return s
	}
	if n := v.GetNumberValue(); n != 0 {
		return fmt.Sprint(int64(n))
	}
	return ""
}

// claimHistory pairs pool.claimed with pool.released events by claim id.
func claimHistory(evs []*v1.FleetEvent, now time.Time) []claim {
	released := map[string]*v1.FleetEvent{}
	for _, e := range evs {
		if e.Kind == "pool.released" {
			released[payloadString(e, "claim_id")] = e
		}
	}
	var out []claim
	for _, e := range evs {
		if e.Kind != "pool.claimed" {
			continue
		}
		c := claim{ClaimID: payloadString(e, "claim_id"), Instance: e.InstanceId,
			By: payloadString(e, "acquired_by"), For: payloadString(e, "acquired_for"), At: e.CreatedAt.AsTime()}
		if r, ok := released[c.ClaimID]; ok {
			c.Disposition = payloadString(r, "disposition")
			c.Held = (time.Duration(parseInt(payloadString(r, "held_seconds"))) * time.Second).String()
		} else {
			c.Disposition = "held"
			c.Held = now.Sub(c.At).Round(time.Second).String() + " so far"
		}
		out = append(out, c)
	}
	return out
}

func parseInt(s string) int64 {
	var n int64
	fmt.Sscan(s, &n)
	return n
}
