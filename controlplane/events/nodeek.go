package events

import (
	"fmt"

	"github.com/tetherfleet/tether/controlplane/store"
)

// NodeEKConflict records an endorsement key refused because it is bound to
// another node: one TPM is one machine, so either the operator mistyped a
// hash or a machine (or its TPM) moved, and the binding stays where it was
// until an operator acts. High severity; the payload names the EK hash, the
// node it is bound to and the node it was asked for or presented as.
const NodeEKConflict store.EventKind = "node.ek_conflict"

// EKConflict is the NodeEKConflict event for ek, bound to boundNode, that
// node asked for or presented. how says by what ("an admin node update",
// "attested enrollment of instance X"), so one kind serves both the admin
// API and enrollment; a caller with an instance sets E.InstanceID.
func EKConflict(ek, boundNode, node, how string) E {
	return E{Kind: NodeEKConflict, Severity: High,
		Message: fmt.Sprintf("endorsement key %s is bound to node %q; %s for node %q was refused it", ek, boundNode, how, node),
		Payload: EKConflictPayload{BoundNode: boundNode, EKHash: ek, Node: node}}
}
