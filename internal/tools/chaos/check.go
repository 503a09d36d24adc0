// Package chaos is the fault-injection run behind `make chaos`: it drives
// load against a real tetherd process, kills it at random moments, records
// every call that returned OK, and checks, against what the store and the
// fake provider hold once it has recovered, that nothing acknowledged was
// lost and nothing was done twice: a claim hands out a member once
// (docs/design.md §4.4), a token enrolls once (§3.1), provider sync leaves
// no machine without its instance (§2.7). docs/reliability.md has the runs.
package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// Claim is an acknowledged AcquirePoolMember; Asked is when the call
// started (zero where unknown).
type Claim struct {
	ClaimID, InstanceID, PoolID string
	// Asked is when the call was made, Acked when its answer came.
	Asked, Acked time.Time
}

// Death is a machine the harness stopped behind the control plane's back
// (its agent gone with it), and when the fake provider began to report it
// stopped.
type Death struct {
	InstanceID string
	At         time.Time
}

// Release is an acknowledged ReleasePoolMember of the claim it ended.
type Release struct{ InstanceID, ClaimID string }

// Enrollment is an acknowledged Enroll: which instance, with which token
// (kept as a hash; the ledger never holds a secret).
type Enrollment struct{ InstanceID, TokenHash string }

// Ledger is what the load generators saw acknowledged. Safe for concurrent
// use.
type Ledger struct {
	mu          sync.Mutex
	Tasks       []string
	Claims      []Claim
	Releases    []Release
	Enrollments []Enrollment
	Terminates  []string
	Deaths      []Death
	// Replays counts enrollments retried with a token already accepted;
	// ReplaysAccepted those the server took (each one breaks an invariant).
	Replays, ReplaysAccepted int
	// Live is the ids a watcher received, one slice per stream (a stream
	// ends when tetherd dies; the watcher then opens a new one).
	Live [][]string
}

func (l *Ledger) add(f func()) { l.mu.Lock(); f(); l.mu.Unlock() }

// Task records an acknowledged CreateTask.
func (l *Ledger) Task(id string) { l.add(func() { l.Tasks = append(l.Tasks, id) }) }

// Claim records an acknowledged claim.
func (l *Ledger) Claim(c Claim) { l.add(func() { l.Claims = append(l.Claims, c) }) }

// claims copies the acknowledged claims.
func (l *Ledger) claims() []Claim {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.Claims)
}

// Release records an acknowledged release.
func (l *Ledger) Release(r Release) { l.add(func() { l.Releases = append(l.Releases, r) }) }

// Enroll records an acknowledged enrollment.
func (l *Ledger) Enroll(e Enrollment) { l.add(func() { l.Enrollments = append(l.Enrollments, e) }) }

// Die records a machine the harness stopped.
func (l *Ledger) Die(d Death) { l.add(func() { l.Deaths = append(l.Deaths, d) }) }

// Terminate records an acknowledged TerminateInstance.
func (l *Ledger) Terminate(id string) { l.add(func() { l.Terminates = append(l.Terminates, id) }) }

// Replay records a replayed token and whether the server accepted it.
func (l *Ledger) Replay(accepted bool) {
	l.add(func() {
		l.Replays++
		if accepted {
			l.ReplaysAccepted++
		}
	})
}

// Stream starts a new watcher stream and returns the function that records
// an event id received on it.
func (l *Ledger) Stream() func(id string) {
	var i int
	l.add(func() { l.Live = append(l.Live, nil); i = len(l.Live) - 1 })
	return func(id string) { l.add(func() { l.Live[i] = append(l.Live[i], id) }) }
}

// Event is one entry of the event log.
type Event struct{ ID, Kind, InstanceID, CorrelationID string }

// Instance is a stored instance as the checks need it.
type Instance struct {
	ID, Provider string
	// Status is the lifecycle state in lower case: pending, provisioning,
	// starting, running, stopping, stopped, rebooting, terminated, error.
	Status             string
	Terminated         bool // status terminated
	TerminateRequested bool
}

// holdsMachine is the states in which the instance's machine must exist
// once provider sync has run: provider sync sends a running row whose
// machine is gone to error (docs/design.md §2.7), and pending or
// provisioning rows may not have reached the provider yet.
var holdsMachine = map[string]bool{"starting": true, "running": true, "stopping": true, "stopped": true, "rebooting": true}

// Task is a stored task as the checks need it.
type Task struct {
	ID string
	// Status is one of pending, leased, running, succeeded, failed, cancelled.
	Status       string
	LeaseExpires time.Time
}

// Observed is the state after recovery: the store through the admin API and
// the fake provider's machine file.
type Observed struct {
	Now       time.Time
	Events    []Event // oldest first
	Instances []Instance
	Tasks     []Task
	// Machines are the instance ids of the fake provider's machines.
	Machines []string
	// FakeProvider is the provider name whose instances must match Machines.
	FakeProvider string
}

// Result is one invariant: how many things it looked at and what broke.
type Result struct {
	Name       string
	Checked    int
	Violations []string
	// Notes are what the check saw and reports without counting it.
	Notes []string
}

// OK reports whether the invariant held.
func (r Result) OK() bool { return len(r.Violations) == 0 }

func (r Result) String() string {
	verdict := "ok"
	if !r.OK() {
		verdict = fmt.Sprintf("BROKEN (%d)", len(r.Violations))
	}
	out := fmt.Sprintf("%-44s checked %6d  %s", r.Name, r.Checked, verdict)
	for _, n := range r.Notes {
		out += "\n    note: " + n
	}
	return out
}

// Event kinds the checks read (controlplane/events).
const (
	kindClaimed  = "pool.claimed"
	kindReleased = "pool.released"
	kindEnrolled = "enroll.succeeded"
)

// Check runs every invariant.
func Check(l *Ledger, o Observed) []Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return []Result{
		claimedOnce(l, o),
		noDeadClaimed(l),
		claimsMatchEvents(l, o),
		acknowledgedPresent(l, o),
		noOrphans(o),
		noStuckTasks(o),
		tokensOnce(l),
		eventLogGapless(l, o),
	}
}

// claimedOnce: a member is never handed to a second claimer while a claim on
// it is open, in the event log or in what the claimers were told.
func claimedOnce(l *Ledger, o Observed) Result {
	r := Result{Name: "each ready member claimed at most once"}
	open := map[string]string{}
	for _, e := range o.Events {
		switch e.Kind {
		case kindClaimed:
			r.Checked++
			if prev, ok := open[e.InstanceID]; ok {
				r.Violations = append(r.Violations, fmt.Sprintf("instance %s: claim %s while claim %s was open (event log)", e.InstanceID, e.CorrelationID, prev))
			}
			open[e.InstanceID] = e.CorrelationID
		case kindReleased:
			delete(open, e.InstanceID)
		}
	}
	released := map[string]bool{}
	for _, rel := range l.Releases {
		released[rel.ClaimID] = true
	}
	for _, e := range o.Events {
		if e.Kind == kindReleased {
			released[e.CorrelationID] = true
		}
	}
	held := map[string]string{}
	for _, c := range l.Claims {
		if prev, ok := held[c.InstanceID]; ok && prev != c.ClaimID && !released[prev] {
			r.Violations = append(r.Violations, fmt.Sprintf("instance %s: acknowledged to claims %s and %s, the first never released", c.InstanceID, prev, c.ClaimID))
		}
		held[c.InstanceID] = c.ClaimID
	}
	return r
}

// noDeadClaimed: no acquire returns a member whose machine the fake
// provider already reported dead when the call was made (design §2.10,
// §4.4), with no grace: a claim asks the provider inside its transaction,
// so neither a presence lease left by a replica killed with -9 nor a
// stream end still on its way to the store lets a dead member through.
func noDeadClaimed(l *Ledger) Result {
	r := Result{Name: "no acquire returns a dead member"}
	died := map[string]time.Time{}
	for _, d := range l.Deaths {
		died[d.InstanceID] = d.At
	}
	for _, c := range l.Claims {
		at, dead := died[c.InstanceID]
		if !dead || c.Asked.IsZero() {
			continue
		}
		r.Checked++
		if late := c.Asked.Sub(at); late > 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("instance %s: claim %s asked %s after its machine died", c.InstanceID, c.ClaimID, late.Round(time.Millisecond)))
		}
	}
	return r
}

// claimsMatchEvents: one pool.claimed event per claim, every acknowledged
// claim among them, and every release (event or acknowledged) of a claim
// that exists.
func claimsMatchEvents(l *Ledger, o Observed) Result {
	r := Result{Name: "claims == pool.claimed events; releases match"}
	claimed := map[string]int{}
	for _, e := range o.Events {
		if e.Kind == kindClaimed {
			claimed[e.CorrelationID]++
		}
	}
	for id, n := range claimed {
		if n > 1 {
			r.Violations = append(r.Violations, fmt.Sprintf("claim %s has %d pool.claimed events", id, n))
		}
	}
	for _, c := range l.Claims {
		r.Checked++
		if claimed[c.ClaimID] == 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("acknowledged claim %s (instance %s) has no pool.claimed event", c.ClaimID, c.InstanceID))
		}
	}
	for _, e := range o.Events {
		if e.Kind == kindReleased && e.CorrelationID != "" && claimed[e.CorrelationID] == 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("pool.released for claim %s that was never claimed", e.CorrelationID))
		}
	}
	for _, rel := range l.Releases {
		r.Checked++
		if claimed[rel.ClaimID] == 0 {
			r.Violations = append(r.Violations, fmt.Sprintf("acknowledged release of instance %s names claim %s, which has no pool.claimed event", rel.InstanceID, rel.ClaimID))
		}
	}
	sort.Strings(r.Violations)
	return r
}

// acknowledgedPresent: every call that returned OK is in the store.
func acknowledgedPresent(l *Ledger, o Observed) Result {
	r := Result{Name: "every acknowledged write is present"}
	tasks := map[string]bool{}
	for _, t := range o.Tasks {
		tasks[t.ID] = true
	}
	for _, id := range l.Tasks {
		r.Checked++
		if !tasks[id] {
			r.Violations = append(r.Violations, fmt.Sprintf("task %s was created (OK) but is not in the store", id))
		}
	}
	claimed, enrolled := map[string]bool{}, map[string]bool{}
	for _, e := range o.Events {
		switch e.Kind {
		case kindClaimed:
			claimed[e.CorrelationID] = true
		case kindEnrolled:
			enrolled[e.InstanceID] = true
		}
	}
	for _, c := range l.Claims {
		r.Checked++
		if !claimed[c.ClaimID] {
			r.Violations = append(r.Violations, fmt.Sprintf("claim %s of instance %s was acknowledged but is not recorded", c.ClaimID, c.InstanceID))
		}
	}
	for _, e := range l.Enrollments {
		r.Checked++
		if !enrolled[e.InstanceID] {
			r.Violations = append(r.Violations, fmt.Sprintf("enrollment of instance %s was acknowledged but is not recorded", e.InstanceID))
		}
	}
	insts := map[string]Instance{}
	for _, in := range o.Instances {
		insts[in.ID] = in
	}
	for _, id := range l.Terminates {
		r.Checked++
		in, ok := insts[id]
		if !ok || (!in.Terminated && !in.TerminateRequested) {
			r.Violations = append(r.Violations, fmt.Sprintf("terminate of instance %s was acknowledged but the store has it %+v (found %v)", id, in, ok))
		}
	}
	return r
}

// noOrphans: after reconciliation, every machine of the fake provider
// belongs to a non-terminated instance, and every instance in a state that
// needs a machine has one.
func noOrphans(o Observed) Result {
	r := Result{Name: "no orphaned machine (provider == store)"}
	live := map[string]Instance{}
	for _, in := range o.Instances {
		if in.Provider == o.FakeProvider && !in.Terminated {
			live[in.ID] = in
		}
	}
	machines := map[string]bool{}
	for _, id := range o.Machines {
		r.Checked++
		machines[id] = true
		if _, ok := live[id]; !ok {
			r.Violations = append(r.Violations, fmt.Sprintf("machine of instance %s exists but the store has no live instance for it", id))
		}
	}
	for id, in := range live {
		if !machines[id] && holdsMachine[in.Status] {
			r.Violations = append(r.Violations, fmt.Sprintf("instance %s is %s in the store but the provider has no machine", id, in.Status))
		}
	}
	sort.Strings(r.Violations)
	return r
}

// noStuckTasks: every task has ended, is pending, or holds a lease that has
// not yet expired.
func noStuckTasks(o Observed) Result {
	r := Result{Name: "no stuck task"}
	for _, t := range o.Tasks {
		r.Checked++
		switch t.Status {
		case "succeeded", "failed", "cancelled", "pending":
		case "leased", "running":
			if !t.LeaseExpires.After(o.Now) {
				r.Violations = append(r.Violations, fmt.Sprintf("task %s is %s with a lease that expired at %s", t.ID, t.Status, t.LeaseExpires.Format(time.RFC3339)))
			}
		default:
			r.Violations = append(r.Violations, fmt.Sprintf("task %s has status %q", t.ID, t.Status))
		}
	}
	return r
}

// tokensOnce: no bootstrap token enrolled twice.
func tokensOnce(l *Ledger) Result {
	r := Result{Name: "no token accepted twice"}
	seen := map[string]string{}
	for _, e := range l.Enrollments {
		r.Checked++
		if prev, ok := seen[e.TokenHash]; ok {
			r.Violations = append(r.Violations, fmt.Sprintf("one token enrolled instance %s and then %s", prev, e.InstanceID))
		}
		seen[e.TokenHash] = e.InstanceID
	}
	r.Checked += l.Replays
	if l.ReplaysAccepted > 0 {
		r.Violations = append(r.Violations, fmt.Sprintf("%d of %d replayed tokens were accepted", l.ReplaysAccepted, l.Replays))
	}
	return r
}

// eventLogGapless: what a watcher saw live is all in the log, once, and in
// log order; so a watcher resuming from its last id misses nothing that
// was already committed.
func eventLogGapless(l *Ledger, o Observed) Result {
	r := Result{Name: "event log has no gaps for a resuming watcher"}
	pos := map[string]int{}
	for i, e := range o.Events {
		if _, dup := pos[e.ID]; dup {
			r.Violations = append(r.Violations, fmt.Sprintf("event id %s appears twice in the log", e.ID))
		}
		pos[e.ID] = i
	}
	for s, ids := range l.Live {
		last := -1
		for _, id := range ids {
			r.Checked++
			p, ok := pos[id]
			if !ok {
				r.Violations = append(r.Violations, fmt.Sprintf("event %s was delivered live (stream %d) but is not in the log", id, s))
				continue
			}
			if p < last {
				r.Violations = append(r.Violations, fmt.Sprintf("event %s was delivered after a later event (stream %d): a watcher resuming from the later id would never see it", id, s))
			}
			last = max(last, p)
		}
	}
	return r
}

// expectedRefusals are the answers the load itself provokes with nothing
// wrong: no ready member to claim (ResourceExhausted), an action on an
// instance the terminator or the crasher already ended
// (FailedPrecondition), and a call the dropper cut (Canceled).
var expectedRefusals = map[codes.Code]bool{codes.ResourceExhausted: true, codes.FailedPrecondition: true, codes.Canceled: true}

// slowAnswers are the codes of calls that ran out of time rather than
// failed: on this two-core machine, with two builds, PostgreSQL and the
// load on it, one call in three of five runs (2026-12-07, the previous
// day's build as often) passes its deadline. MixedBuilds reports them
// without counting them against the upgrade: they are latency under
// saturation, tracked in docs/reliability.md, not a fault between builds.
var slowAnswers = map[codes.Code]bool{codes.DeadlineExceeded: true}

// oldCanceledReady is one error line builds before 2026-12-07 16:00 UTC
// wrote for no fault: an agent stream that ended while its ready heartbeat
// was being recorded canceled the write, and that was logged at ERROR.
// tetherd now logs it at INFO; the previous build in a rolling upgrade
// still writes it when the load's agents leave.
func oldCanceledReady(line string) bool {
	return strings.Contains(line, `msg="mark instance running failed; retrying at the next ready heartbeat"`) &&
		strings.HasSuffix(strings.TrimSpace(line), `context canceled"`)
}

// MixedBuilds is the invariant of a rolling upgrade's middle (an old and
// a new build on one database): no call fails but with a refusal the load
// provokes or a deadline passed, and neither replica logs an error.
func MixedBuilds(errs map[codes.Code]int, logs ...string) Result {
	r := Result{Name: "old and new builds serve side by side"}
	for c, n := range errs {
		r.Checked += n
		if slowAnswers[c] {
			r.Notes = append(r.Notes, fmt.Sprintf("%d calls passed their deadline (latency, not counted)", n))
			continue
		}
		if !expectedRefusals[c] {
			r.Violations = append(r.Violations, fmt.Sprintf("%d calls failed %s", n, c))
		}
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			r.Violations = append(r.Violations, fmt.Sprintf("read %s: %v", l, err))
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			r.Checked++
			if strings.Contains(line, "level=ERROR") && !oldCanceledReady(line) {
				r.Violations = append(r.Violations, fmt.Sprintf("%s: %s", filepath.Base(l), line))
			}
		}
	}
	sort.Strings(r.Violations)
	return r
}
