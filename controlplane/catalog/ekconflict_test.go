package catalog_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

// A write refused for another node's EK answers AlreadyExists and leaves
// one node.ek_conflict event; any other error passes through with none.
func TestEKConflict(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t)
	count := func() int {
		evs, err := s.Store.ListEvents(ctx, store.EventFilter{Kind: events.NodeEKConflict}, store.Page{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	other := errors.New("disk full")
	if answer, lost := s.EKConflict(ctx, "n2", "a test", other); answer != other || lost != nil || count() != 0 {
		t.Fatalf("EKConflict(other) = %v, %v with %d events; want it passed through and no event", answer, lost, count())
	}
	inUse := &store.EKInUseError{EK: "sha256:ab", Node: "n1"}
	answer, lost := s.EKConflict(ctx, "n2", "a test", inUse)
	if fail.Code(answer) != codes.AlreadyExists || lost != nil || count() != 1 {
		t.Fatalf("EKConflict(in use) = %v, %v with %d events; want AlreadyExists and one event", answer, lost, count())
	}
}
