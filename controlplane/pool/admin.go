package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Bounds on what a pool may ask for. They are generous; they exist so that
// a typo (an extra zero) is refused rather than provisioned.
const (
	MaxPoolSize = 10000
	// maxPoolName leaves room in a member's node name for "-" and a
	// 10-character suffix within the 63 characters a name may have.
	maxPoolName          = 52
	maxWarmingTimeout    = 24 * 3600
	maxReadyTTL          = 30 * 24 * 3600
	maxClaimedTTL        = 365 * 24 * 3600
	maxRetentionDays     = 3650
	maxTerminateAttempts = 100
	maxText              = 128
)

// CreateParams is a new pool. MaxSize nil means TargetSize + 10.
type CreateParams struct {
	Name, Template, Provider, Region, InstanceType string
	// LifecycleClass is ephemeral (the default when empty) or spot.
	LifecycleClass      string
	TargetSize, MinSize int
	MaxSize             *int
	Metadata            store.PoolMetadata
}

func checkClass(field, class string) error {
	switch class {
	case "", store.ClassEphemeral, store.ClassSpot:
		return nil
	}
	return fail.Invalid(field, "%q is not a lifecycle class (ephemeral or spot)", class)
}

func checkSizes(target, minSize, maxSize int) error {
	switch {
	case target < 0 || target > MaxPoolSize:
		return fail.Invalid("target_size", "%d is out of range (0..%d)", target, MaxPoolSize)
	case minSize < 0 || minSize > MaxPoolSize:
		return fail.Invalid("min_size", "%d is out of range (0..%d)", minSize, MaxPoolSize)
	case maxSize < 0 || maxSize > MaxPoolSize:
		return fail.Invalid("max_size", "%d is out of range (0..%d)", maxSize, MaxPoolSize)
	case minSize > target:
		return fail.Invalid("min_size", "%d is above target_size %d (want min_size ≤ target_size ≤ max_size)", minSize, target)
	case target > maxSize:
		return fail.Invalid("max_size", "%d is below target_size %d (want min_size ≤ target_size ≤ max_size)", maxSize, target)
	}
	return nil
}

// checkMetadata refuses a negative or absurd value, naming the field. Zero
// means the default for every field but record_retention_days, where zero
// disables pruning and nil is the default.
func checkMetadata(m store.PoolMetadata) error {
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"warming_timeout_seconds", m.WarmingTimeoutSeconds, maxWarmingTimeout},
		{"ready_ttl_seconds", m.ReadyTTLSeconds, maxReadyTTL},
		{"claimed_ttl_seconds", m.ClaimedTTLSeconds, maxClaimedTTL},
		{"errored_terminate_max_attempts", m.ErroredTerminateMaxAttempts, maxTerminateAttempts},
	} {
		if f.v < 0 || f.v > f.max {
			return fail.Invalid("metadata."+f.name, "%d is out of range (0..%d; 0 means the default)", f.v, f.max)
		}
	}
	if d := m.RecordRetentionDays; d != nil && (*d < 0 || *d > maxRetentionDays) {
		return fail.Invalid("metadata.record_retention_days", "%d is out of range (0..%d; 0 disables pruning)", *d, maxRetentionDays)
	}
	return nil
}

func checkText(field, v string) error {
	if len(v) > maxText {
		return fail.Invalid(field, "at most %d characters", maxText)
	}
	return nil
}

// checkProvider refuses a provider this control plane cannot drive for a
// pool: unknown here, or external (nothing boots an external machine but
// an operator holding a token no pool member's token ever reaches).
func (s *Service) checkProvider(name string) error {
	if name == "" {
		return fail.Invalid("provider", "required (one of %v)", s.poolProviders())
	}
	if name == instances.ProviderExternal {
		return fail.Invalid("provider", "%q machines are booted by an operator; a pool cannot warm them (one of %v)", name, s.poolProviders())
	}
	if _, ok := s.Instances.Machines[name]; !ok {
		return fail.Invalid("provider", "%q is not configured here (configured: %v)", name, s.poolProviders())
	}
	return nil
}

func (s *Service) poolProviders() []string {
	var out []string
	for _, n := range s.Instances.ProviderNames() {
		if n != instances.ProviderExternal {
			out = append(out, n)
		}
	}
	return out
}

// Create makes an active pool; the reaper (nudged now) warms its members.
func (s *Service) Create(ctx context.Context, p CreateParams) (*View, error) {
	if err := modules.ValidateName("name", p.Name); err != nil {
		return nil, err
	}
	if len(p.Name) > maxPoolName {
		return nil, fail.Invalid("name", "at most %d characters (member nodes are named after the pool)", maxPoolName)
	}
	if p.Template == "" {
		return nil, fail.Invalid("template", "required")
	}
	if err := s.checkProvider(p.Provider); err != nil {
		return nil, err
	}
	for _, f := range []struct{ name, v string }{{"region", p.Region}, {"instance_type", p.InstanceType}} {
		if err := checkText(f.name, f.v); err != nil {
			return nil, err
		}
	}
	if err := checkClass("lifecycle_class", p.LifecycleClass); err != nil {
		return nil, err
	}
	maxSize := p.TargetSize + DefaultMaxHeadroom
	if p.MaxSize != nil {
		maxSize = *p.MaxSize
	}
	if err := checkSizes(p.TargetSize, p.MinSize, maxSize); err != nil {
		return nil, err
	}
	if err := checkMetadata(p.Metadata); err != nil {
		return nil, err
	}
	tpl, err := s.Store.GetTemplate(ctx, p.Template)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fail.Invalid("template", "template %q does not exist", p.Template)
	}
	if err != nil {
		return nil, err
	}
	class := p.LifecycleClass
	if class == "" {
		class = store.ClassEphemeral
	}
	now := s.Clock.Now()
	pl := &store.Pool{Name: p.Name, TemplateID: tpl.ID, Provider: p.Provider, Region: p.Region, InstanceType: p.InstanceType,
		LifecycleClass: class, TargetSize: p.TargetSize, MinSize: p.MinSize, MaxSize: maxSize, Status: store.PoolActive,
		Metadata: p.Metadata, CreatedAt: now, UpdatedAt: now}
	// In a transaction, not a bare write: the audit record of the call
	// commits with the pool, and on SQLite the write joins the group
	// commit instead of waiting in the busy handler behind it.
	err = s.Store.Tx(ctx, func(q store.Queries) error { return q.CreatePool(ctx, pl) })
	if errors.Is(err, store.ErrAlreadyExists) {
		return nil, fail.Exists("pool %q already exists", p.Name)
	} else if err != nil {
		return nil, err
	}
	s.Log.Info("pool created", "pool", pl.Name, "template", tpl.Name, "provider", pl.Provider, "target", pl.TargetSize, "max", pl.MaxSize)
	s.Nudge(pl.ID)
	return &View{Pool: pl, TemplateName: tpl.Name, Deficit: Deficit(pl, store.PoolCounts{})}, nil
}

// Get is a pool with its counts and roster.
func (s *Service) Get(ctx context.Context, name string) (*View, error) {
	p, err := s.byName(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.view(ctx, s.Store, p, true)
}

// List is a page of pools with their counts (no rosters).
func (s *Service) List(ctx context.Context, page store.Page) ([]*View, error) {
	ps, err := s.Store.ListPools(ctx, page)
	if err != nil {
		return nil, err
	}
	out := make([]*View, 0, len(ps))
	for _, p := range ps {
		v, err := s.view(ctx, s.Store, p, false)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// Update fields: the mask names what changes. "metadata" replaces the
// whole metadata; "metadata.<field>" changes one field of it.
const (
	FieldTargetSize     = "target_size"
	FieldMinSize        = "min_size"
	FieldMaxSize        = "max_size"
	FieldLifecycleClass = "lifecycle_class"
	FieldMetadata       = "metadata"
)

// MetadataFields are the sub-fields an update mask may name as
// "metadata.<name>".
var MetadataFields = []string{"warming_timeout_seconds", "ready_ttl_seconds", "claimed_ttl_seconds", "record_retention_days",
	"reuse_without_reset", "errored_terminate_max_attempts"}

// UpdateParams changes the masked fields of a pool.
type UpdateParams struct {
	Name                         string
	Mask                         map[string]bool
	TargetSize, MinSize, MaxSize int
	LifecycleClass               string
	Metadata                     store.PoolMetadata
}

// Update applies p under the pool's row lock and checks the result as a
// whole, so min ≤ target ≤ max holds whatever subset changed.
func (s *Service) Update(ctx context.Context, p UpdateParams) (*View, error) {
	if len(p.Mask) == 0 {
		return nil, fail.Invalid("update_mask", "name the fields to change")
	}
	if p.Mask[FieldLifecycleClass] {
		if p.LifecycleClass == "" {
			return nil, fail.Invalid("lifecycle_class", "required when the mask names it (ephemeral or spot)")
		}
		if err := checkClass("lifecycle_class", p.LifecycleClass); err != nil {
			return nil, err
		}
	}
	cur, err := s.byName(ctx, p.Name)
	if err != nil {
		return nil, err
	}
	var out *store.Pool
	grew := false
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		pl, err := q.LockPool(ctx, cur.ID)
		if err != nil {
			return err
		}
		before := pl.TargetSize
		if p.Mask[FieldTargetSize] {
			pl.TargetSize = p.TargetSize
		}
		if p.Mask[FieldMinSize] {
			pl.MinSize = p.MinSize
		}
		if p.Mask[FieldMaxSize] {
			pl.MaxSize = p.MaxSize
		}
		if p.Mask[FieldLifecycleClass] {
			pl.LifecycleClass = p.LifecycleClass
		}
		if p.Mask[FieldMetadata] {
			pl.Metadata = p.Metadata
		}
		applyMetadataFields(&pl.Metadata, p.Metadata, p.Mask)
		if err := checkSizes(pl.TargetSize, pl.MinSize, pl.MaxSize); err != nil {
			return err
		}
		if err := checkMetadata(pl.Metadata); err != nil {
			return err
		}
		pl.UpdatedAt = s.Clock.Now()
		grew = pl.TargetSize > before
		out = pl
		return q.UpdatePool(ctx, pl)
	})
	if err != nil {
		return nil, err
	}
	if grew && out.Status == store.PoolActive {
		s.Nudge(out.ID)
	}
	return s.view(ctx, s.Store, out, false)
}

func applyMetadataFields(dst *store.PoolMetadata, src store.PoolMetadata, mask map[string]bool) {
	for f := range mask {
		sub, ok := strings.CutPrefix(f, FieldMetadata+".")
		if !ok {
			continue
		}
		switch sub {
		case "warming_timeout_seconds":
			dst.WarmingTimeoutSeconds = src.WarmingTimeoutSeconds
		case "ready_ttl_seconds":
			dst.ReadyTTLSeconds = src.ReadyTTLSeconds
		case "claimed_ttl_seconds":
			dst.ClaimedTTLSeconds = src.ClaimedTTLSeconds
		case "record_retention_days":
			dst.RecordRetentionDays = src.RecordRetentionDays
		case "reuse_without_reset":
			dst.ReuseWithoutReset = src.ReuseWithoutReset
		case "errored_terminate_max_attempts":
			dst.ErroredTerminateMaxAttempts = src.ErroredTerminateMaxAttempts
		}
	}
}

// setStatus moves a pool to status if it is in one of from; a pool already
// there is left alone (docs/design.md §0.3). Anything else is FailedPrecondition
// naming the current and the allowed states.
func (s *Service) setStatus(ctx context.Context, name, verb, status string, from ...string) (*store.Pool, bool, error) {
	cur, err := s.byName(ctx, name)
	if err != nil {
		return nil, false, err
	}
	var out *store.Pool
	changed := false
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		pl, err := q.LockPool(ctx, cur.ID)
		if err != nil {
			return err
		}
		out = pl
		if pl.Status == status {
			return nil
		}
		ok := false
		for _, f := range from {
			ok = ok || pl.Status == f
		}
		if !ok {
			return fail.Precondition("pool %q is %s; %s is allowed from %s", pl.Name, pl.Status, verb, strings.Join(from, " or "))
		}
		pl.Status, pl.UpdatedAt, changed = status, s.Clock.Now(), true
		return q.UpdatePool(ctx, pl)
	})
	return out, changed, err
}

// Pause stops replenishment and acquisition; members stay as they are.
func (s *Service) Pause(ctx context.Context, name string) (*View, error) {
	p, changed, err := s.setStatus(ctx, name, "pause", store.PoolPaused, store.PoolActive)
	if err != nil {
		return nil, err
	}
	if changed {
		s.Log.Info("pool paused", "pool", p.Name)
	}
	return s.view(ctx, s.Store, p, false)
}

// Activate resumes a paused or drained pool: it warms back to the target
// it kept.
func (s *Service) Activate(ctx context.Context, name string) (*View, error) {
	p, changed, err := s.setStatus(ctx, name, "activate", store.PoolActive, store.PoolPaused, store.PoolDraining)
	if err != nil {
		return nil, err
	}
	if changed {
		s.Log.Info("pool activated", "pool", p.Name, "target", p.TargetSize)
		s.Nudge(p.ID)
	}
	return s.view(ctx, s.Store, p, false)
}

// Delete removes a pool with no live members, together with the records of
// its dead ones (and their nodes, where nothing else is left on them).
func (s *Service) Delete(ctx context.Context, name string) error {
	cur, err := s.byName(ctx, name)
	if err != nil {
		return err
	}
	pruned := 0
	err = s.Store.Tx(ctx, func(q store.Queries) error {
		pruned = 0 // Tx may run fn again (a lost deadlock)
		pl, err := q.LockPool(ctx, cur.ID)
		if err != nil {
			return err
		}
		c, err := q.CountPoolMembers(ctx, pl.ID)
		if err != nil {
			return err
		}
		if live := c.Warming + c.Ready + c.Claimed + c.Draining + c.Errored; live > 0 {
			return fail.Precondition("pool %q still has %d live member(s) (warming %d, ready %d, claimed %d, draining %d, errored %d); "+
				"drain it and let them end first", pl.Name, live, c.Warming, c.Ready, c.Claimed, c.Draining, c.Errored)
		}
		for {
			dead, err := q.ListInstances(ctx, store.InstanceFilter{PoolID: pl.ID}, store.Page{Limit: store.MaxPageSize})
			if err != nil {
				return err
			}
			for _, in := range dead {
				if _, err := pruneTx(ctx, q, in); err != nil {
					return err
				}
				pruned++
			}
			if len(dead) < store.MaxPageSize {
				break
			}
		}
		return q.DeletePool(ctx, pl.ID)
	})
	if err != nil {
		return err
	}
	s.Log.Info("pool deleted", "pool", cur.Name, "dead_member_records_removed", pruned)
	return nil
}

// pruneTx deletes a dead member's row and then its node, but only once no
// instance of that node is left: a node shared with a live instance, or
// with a record still inside its retention, is never taken from under it.
func pruneTx(ctx context.Context, q store.Queries, in *store.Instance) (nodeDeleted bool, err error) {
	if err := q.DeletePoolMember(ctx, in.ID); err != nil {
		return false, fmt.Errorf("prune member %s: %w", in.ID, err)
	}
	left, err := q.CountInstances(ctx, store.InstanceFilter{NodeID: in.NodeID})
	if err != nil || left > 0 {
		return false, err
	}
	node, err := q.GetNodeByID(ctx, in.NodeID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if node.BMC.Address != "" {
		// A bare-metal node is the operator's record of a machine in a
		// rack, lent to the pool: it outlives its members.
		return false, nil
	}
	if err := q.DeleteNode(ctx, node.Name); err != nil {
		return false, fmt.Errorf("prune node %s of member %s: %w", node.Name, in.ID, err)
	}
	return true, nil
}
