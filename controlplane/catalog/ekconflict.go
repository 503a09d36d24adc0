package catalog

import (
	"context"
	"errors"
	"fmt"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

// EKConflict answers a node write (described by how) that named another
// node's EK: the write changed nothing, and a high-severity event names
// the hash and both nodes, because a TPM seen on a second node is either
// a typo or a machine that moved, and an operator must decide which. It
// returns the AlreadyExists to answer, and the error of the event's
// write, if any, for the caller to log. Any other err is returned as it
// is, with no event.
func (s *Service) EKConflict(ctx context.Context, node, how string, err error) (answer, lost error) {
	var inUse *store.EKInUseError
	if !errors.As(err, &inUse) {
		return err, nil
	}
	if _, werr := events.EKConflict(inUse.EK, inUse.Node, node, how).Write(ctx, s.Store, s.Clock.Now()); werr != nil {
		lost = fmt.Errorf("write endorsement key conflict event for node %s, ek %s: %w", node, inUse.EK, werr)
	}
	return fail.Exists("ek_hashes: %v; remove it from node %q first (tetherctl node update %s --ek ...)", inUse, inUse.Node, inUse.Node), lost
}
