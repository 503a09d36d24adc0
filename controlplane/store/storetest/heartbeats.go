package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/store"
)

// hbFleet is larger than two of the backends' heartbeat chunks (512), so
// batches span full chunks and a remainder.
const hbFleet = 1200

// seedHeartbeatFleet creates hbFleet instances in one transaction, each
// shaped by prep (which sees its index), and returns their ids in order.
func seedHeartbeatFleet(t *testing.T, s store.Store, prep func(i int, in *store.Instance)) []store.InstanceID {
	c := ctx(t)
	n := seedNode(t, s, "fleet")
	ids := make([]store.InstanceID, hbFleet)
	must(t, s.Tx(c, func(q store.Queries) error {
		for i := range ids {
			in := newInstance(n.ID, lifecycle.Running)
			in.ErrorMessage = fmt.Sprintf("kept-%d", i)
			if prep != nil {
				prep(i, in)
			}
			if err := q.CreateInstance(c, in); err != nil {
				return err
			}
			ids[i] = in.ID
		}
		return nil
	}))
	return ids
}

// fleetByID reads every instance.
func fleetByID(t *testing.T, s store.Store) map[store.InstanceID]*store.Instance {
	c := ctx(t)
	out := make(map[store.InstanceID]*store.Instance)
	p := store.Page{Limit: store.MaxPageSize}
	for {
		page, err := s.ListInstances(c, store.InstanceFilter{}, p)
		must(t, err)
		for _, in := range page {
			out[in.ID] = in
		}
		if len(page) < p.Limit {
			return out
		}
		p.After = page[len(page)-1].ID.String()
	}
}

// fleetHeartbeat is instance i's heartbeat: every field differs per
// instance, so a value written to the wrong row or column shows.
func fleetHeartbeat(id store.InstanceID, i int, at time.Time, tag string) store.Heartbeat {
	return store.Heartbeat{
		InstanceID: id, At: at,
		Phase:          fmt.Sprintf("%s-phase-%d", tag, i),
		AgentVersion:   fmt.Sprintf("%s-v%d", tag, i),
		RunningModules: []string{fmt.Sprintf("sha256:%s%d", tag, i), "sha256:common"},
		AgentError:     fmt.Sprintf("%s-err-%d", tag, i),
		Addresses:      []string{fmt.Sprintf("10.0.%d.%d", i/250, i%250)},
		BootID:         fmt.Sprintf("%s-boot-%d", tag, i),
	}
}

// wantHeartbeat fails unless in holds exactly hb's fields.
func wantHeartbeat(t *testing.T, in *store.Instance, hb store.Heartbeat) {
	t.Helper()
	if in.LastHeartbeatAt == nil || !in.LastHeartbeatAt.Equal(hb.At) || in.AgentPhase != hb.Phase || in.AgentVersion != hb.AgentVersion ||
		!slices.Equal(in.RunningModules, hb.RunningModules) || in.AgentError != hb.AgentError ||
		!slices.Equal(in.Addresses, hb.Addresses) || in.BootID != hb.BootID {
		t.Fatalf("instance %s holds at=%v phase=%q version=%q modules=%q error=%q addresses=%q boot=%q, want %+v",
			in.ID, in.LastHeartbeatAt, in.AgentPhase, in.AgentVersion, in.RunningModules, in.AgentError, in.Addresses, in.BootID, hb)
	}
}

// testHeartbeatBatch: one batch larger than a chunk, in one transaction
// as the hub writes it, mixing every case a row can be in.
func testHeartbeatBatch(t *testing.T, s store.Store) {
	c := ctx(t)
	at := t0.Add(time.Hour)
	newer := t0.Add(2 * time.Hour)
	silent := t0.Add(30 * time.Minute)
	ids := seedHeartbeatFleet(t, s, func(i int, in *store.Instance) {
		if i%3 == 0 { // silent, flagged stale: the heartbeat ends both
			in.SilentSince, in.HeartbeatStaleFlagged = &silent, true
		}
		switch i % 4 {
		case 0: // a newer heartbeat already stored (another replica's batch landed first)
			in.LastHeartbeatAt, in.AgentPhase, in.BootID = &newer, "newer", "newer-boot"
		case 1: // one at the very same time: it is overwritten, as today
			in.LastHeartbeatAt, in.AgentPhase = &at, "same-time"
		case 2: // an older one
			in.LastHeartbeatAt, in.AgentPhase = &t0, "older"
		} // 3: never heartbeated
	})
	want := make(map[store.InstanceID]store.Heartbeat, len(ids))
	var batch []store.Heartbeat
	for i, id := range ids {
		hb := fleetHeartbeat(id, i, at, "b")
		want[id] = hb
		batch = append(batch, hb)
		if i%100 == 50 { // an instance that does not exist is skipped, not an error
			batch = append(batch, fleetHeartbeat(store.InstanceID(fmt.Sprintf("no-such-instance-%d", i)), i, at, "ghost"))
		}
	}
	// Duplicates (the hub keys by instance, so only a bug sends them):
	// the newest wins, whether it comes first or last, even a chunk away.
	// Both instances are i%4 == 1, whose stored time equals `at`.
	batch = append(batch, fleetHeartbeat(ids[5], 5, at.Add(-time.Minute), "dup-older"))
	newest := fleetHeartbeat(ids[1101], 1101, at.Add(time.Second), "dup-newest")
	batch = append(batch, newest)
	want[ids[1101]] = newest

	must(t, s.Tx(c, func(q store.Queries) error { return q.RecordHeartbeats(c, batch) }))

	got := fleetByID(t, s)
	if len(got) != hbFleet {
		t.Fatalf("%d instances after the batch, want %d (an unknown id must not create one)", len(got), hbFleet)
	}
	for i, id := range ids {
		in := got[id]
		if in.Status != lifecycle.Running || in.ErrorMessage != fmt.Sprintf("kept-%d", i) {
			t.Fatalf("instance %d: a heartbeat changed columns it does not own: status %q, error message %q", i, in.Status, in.ErrorMessage)
		}
		if i%4 == 0 {
			// Older than what is stored: the row is left as it was.
			if !in.LastHeartbeatAt.Equal(newer) || in.AgentPhase != "newer" || in.BootID != "newer-boot" {
				t.Fatalf("instance %d: an older heartbeat overwrote a newer one: at %v, phase %q, boot %q", i, in.LastHeartbeatAt, in.AgentPhase, in.BootID)
			}
			if wantSilent := i%3 == 0; (in.SilentSince != nil) != wantSilent || in.HeartbeatStaleFlagged != wantSilent {
				t.Fatalf("instance %d: a skipped heartbeat changed the silence: silent since %v, stale flagged %v", i, in.SilentSince, in.HeartbeatStaleFlagged)
			}
			continue
		}
		wantHeartbeat(t, in, want[id])
		if in.SilentSince != nil || in.HeartbeatStaleFlagged {
			t.Fatalf("instance %d: the heartbeat did not end the silence: silent since %v, stale flagged %v", i, in.SilentSince, in.HeartbeatStaleFlagged)
		}
	}
}

// testHeartbeatBatchesOutOfOrder: two replicas' batches, each larger than
// a chunk, landing newest first. The older one changes nothing, in every
// chunk.
func testHeartbeatBatchesOutOfOrder(t *testing.T, s store.Store) {
	c := ctx(t)
	ids := seedHeartbeatFleet(t, s, nil)
	newer, older := make([]store.Heartbeat, len(ids)), make([]store.Heartbeat, len(ids))
	for i, id := range ids {
		newer[i] = fleetHeartbeat(id, i, t0.Add(2*time.Minute), "newer")
		older[i] = fleetHeartbeat(id, i, t0.Add(time.Minute), "older")
	}
	must(t, s.Tx(c, func(q store.Queries) error { return q.RecordHeartbeats(c, newer) }))
	// The older batch arrives later: out of autocommit this time, as a
	// caller outside a transaction would write it.
	must(t, s.RecordHeartbeats(c, older))
	got := fleetByID(t, s)
	for i, id := range ids {
		wantHeartbeat(t, got[id], newer[i])
	}
	// And nothing at all is a no-op, not an error.
	must(t, s.RecordHeartbeats(c, nil))
	must(t, s.Tx(c, func(q store.Queries) error { return q.RecordHeartbeats(c, []store.Heartbeat{}) }))
}

// testHeartbeatDuplicates: a small batch naming one instance more than
// once, so the copies travel in one statement. The newest is kept in
// whatever order they come.
func testHeartbeatDuplicates(t *testing.T, s store.Store) {
	c := ctx(t)
	n := seedNode(t, s, "dups")
	at := func(min int) time.Time { return t0.Add(time.Duration(min) * time.Minute) }
	for _, tc := range []struct {
		name    string
		minutes []int // one heartbeat per entry, phase "m<minutes>"
		want    int
	}{
		{"newest first", []int{3, 1}, 3},
		{"newest last", []int{1, 3}, 3},
		{"newest in the middle", []int{1, 3, 2}, 3},
		{"among others", []int{2, 5, 4, 1}, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := newInstance(n.ID, lifecycle.Running)
			must(t, s.CreateInstance(c, in))
			other := newInstance(n.ID, lifecycle.Running)
			must(t, s.CreateInstance(c, other))
			var batch []store.Heartbeat
			for i, m := range tc.minutes {
				batch = append(batch, store.Heartbeat{InstanceID: in.ID, At: at(m), Phase: fmt.Sprintf("m%d", m)})
				if i == 0 { // a second instance between the copies
					batch = append(batch, store.Heartbeat{InstanceID: other.ID, At: at(m), Phase: "other"})
				}
			}
			must(t, s.Tx(c, func(q store.Queries) error { return q.RecordHeartbeats(c, batch) }))
			got, err := s.GetInstance(c, in.ID)
			must(t, err)
			if wantPhase := fmt.Sprintf("m%d", tc.want); got.LastHeartbeatAt == nil || !got.LastHeartbeatAt.Equal(at(tc.want)) || got.AgentPhase != wantPhase {
				t.Fatalf("after %v: at %v phase %q, want %v %q", tc.minutes, got.LastHeartbeatAt, got.AgentPhase, at(tc.want), wantPhase)
			}
			if o, err := s.GetInstance(c, other.ID); err != nil || o.AgentPhase != "other" {
				t.Fatalf("the other instance in the batch: %+v, %v", o, err)
			}
		})
	}
}
