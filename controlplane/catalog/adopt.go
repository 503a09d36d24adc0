package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/fail"
	"github.com/tetherfleet/tether/controlplane/store"
)

// Adoption binds a machine seen netbooting to a node (docs/adr/0030): its
// hardware address and its TPM's endorsement key, checked against what
// the machine announced. The API has validated and normalised the fields.
type Adoption struct {
	MAC string
	// EKHash is sha256:HEX in lower case; empty takes the one EK
	// announced for MAC.
	EKHash string
	// Name is the node; empty: the node that has MAC, else a new node
	// named after MAC (DefaultAdoptName).
	Name     string
	Template string
	// Unseen binds an EK no machine announced for MAC.
	Unseen bool
	// MaxMACs and MaxEKs are a node's limits (the API's).
	MaxMACs, MaxEKs int
}

// Adopted is what an adoption wrote.
type Adopted struct {
	Node     *store.Node
	Template string
	Created  bool
	// Announced is whether the EK bound was announced for the MAC.
	Announced bool
}

// maxAnnouncementsRead bounds what an adoption reads of a MAC's
// announcements (newest first). The announce route records at most 16
// per sender a minute, so a flood can push a machine's own announcement
// out of this window: the adoption then asks for --ek and --unseen.
const maxAnnouncementsRead = 100

// DefaultAdoptName is the name of a node adopted with none given: "m-" and
// the address's hex digits.
func DefaultAdoptName(mac string) string { return "m-" + strings.ReplaceAll(mac, ":", "") }

// AdoptNode creates or updates the node, with its MAC and EK, and writes
// node.adopted, in one transaction (the audit record joins it). It
// refuses, writing nothing: an EK chosen from none or several announced,
// an EK that was not announced for the MAC (unless Unseen), a MAC that
// belongs to another node than the one named, a node of another template
// than the one named, a node already at its limits, and (as
// *store.EKInUseError, for the caller's conflict event) an EK bound to
// another node.
func (s *Service) AdoptNode(ctx context.Context, a Adoption) (*Adopted, error) {
	var out *Adopted
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		out = nil
		now := s.Clock.Now()
		seen, err := announcedEKs(ctx, q, a.MAC)
		if err != nil {
			return err
		}
		ek, announced, err := chooseEK(a, seen)
		if err != nil {
			return err
		}
		byMAC, err := q.GetNodeByMAC(ctx, a.MAC)
		if errors.Is(err, store.ErrNotFound) {
			byMAC = nil
		} else if err != nil {
			return err
		}
		name := a.Name
		if name == "" {
			name = DefaultAdoptName(a.MAC)
			if byMAC != nil {
				name = byMAC.Name
			}
		}
		n, err := q.GetNode(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			n = nil
		} else if err != nil {
			return err
		}
		if byMAC != nil && (n == nil || byMAC.ID != n.ID) {
			return fail.Exists("mac: hardware address %s belongs to node %q; adopt it as that node (omit --name, or --name %s), or remove the address from it first",
				a.MAC, byMAC.Name, byMAC.Name)
		}
		if other, err := q.NodeByEK(ctx, ek); err == nil && (n == nil || other.ID != n.ID) {
			return &store.EKInUseError{EK: ek, Node: other.Name}
		} else if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		var tplName string
		created := n == nil
		if created {
			if a.Template == "" {
				return fail.Invalid("template", "required to create node %q (no node has the name or the address %s)", name, a.MAC)
			}
			tpl, err := TemplateFor(ctx, q, a.Template)
			if err != nil {
				return err
			}
			tplName = tpl.Name
			n = &store.Node{Name: name, TemplateID: tpl.ID, Enabled: true, CreatedAt: now}
		} else {
			tpl, err := q.GetTemplateByID(ctx, n.TemplateID)
			if err != nil {
				return err
			}
			if a.Template != "" && a.Template != tpl.Name {
				return fail.Precondition("node %q has template %q, not %q; adopting does not change a node's template (tetherctl node update %s --template %s)",
					n.Name, tpl.Name, a.Template, n.Name, a.Template)
			}
			tplName = tpl.Name
		}
		if !created && slices.Contains(n.MACs, a.MAC) && slices.Contains(n.EKHashes, ek) {
			// Adopted already: nothing to write, and no second event.
			out = &Adopted{Node: n, Template: tplName, Announced: announced}
			return nil
		}
		if !slices.Contains(n.MACs, a.MAC) {
			if len(n.MACs) >= a.MaxMACs {
				return fail.Invalid("mac", "node %q has %d addresses already, the most a node holds", n.Name, len(n.MACs))
			}
			n.MACs = append(n.MACs, a.MAC)
		}
		if !slices.Contains(n.EKHashes, ek) {
			if len(n.EKHashes) >= a.MaxEKs {
				return fail.Invalid("ek_hash", "node %q has %d endorsement keys already, the most a node holds; remove one first (tetherctl node update %s --ek ...)",
					n.Name, len(n.EKHashes), n.Name)
			}
			n.EKHashes = append(n.EKHashes, ek)
		}
		n.UpdatedAt = now
		if created {
			err = q.CreateNode(ctx, n)
		} else {
			err = q.UpdateNode(ctx, n)
		}
		if err != nil {
			return err
		}
		how := "updated"
		if created {
			how = "created"
		}
		seenText := "announced by the machine"
		if !announced {
			seenText = "not announced for the address (bound with --unseen)"
		}
		if _, err := (events.E{Kind: events.NodeAdopted, Severity: events.Medium, CorrelationID: events.AnnounceCorrelation(a.MAC),
			Message: fmt.Sprintf("machine %s adopted as node %q (%s) with endorsement key %s, %s", a.MAC, n.Name, how, ek, seenText),
			Payload: events.NodeAdoptedPayload{Announced: announced, Created: created, EK: ek, MAC: a.MAC, Node: n.Name}}).Write(ctx, q, now); err != nil {
			return err
		}
		out = &Adopted{Node: n, Template: tplName, Created: created, Announced: announced}
		return nil
	})
	var macInUse *store.MACInUseError
	var ekInUse *store.EKInUseError
	if errors.As(err, &macInUse) || errors.As(err, &ekInUse) {
		// The caller names the address or EK and its owner.
		return nil, err
	}
	if errors.Is(err, store.ErrAlreadyExists) {
		// Only a node created by another call meanwhile: try again.
		return nil, fail.Exists("a node of the same name was created meanwhile; adopt again")
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// announcedEKs are the distinct EKs announced for mac, newest first.
func announcedEKs(ctx context.Context, q store.EventQueries, mac string) ([]string, error) {
	evs, err := q.ListEvents(ctx, store.EventFilter{Kind: events.NetbootAnnounced, CorrelationID: events.AnnounceCorrelation(mac)}, store.Page{Limit: maxAnnouncementsRead})
	if err != nil {
		return nil, fmt.Errorf("read the announcements of %s: %w", mac, err)
	}
	var out []string
	for _, e := range evs {
		var p events.AnnouncedPayload
		if json.Unmarshal(e.Payload, &p) != nil || p.MAC != mac || p.EK == "" || slices.Contains(out, p.EK) {
			continue
		}
		out = append(out, p.EK)
	}
	return out, nil
}

// chooseEK decides the EK an adoption binds, and whether it was announced.
func chooseEK(a Adoption, seen []string) (string, bool, error) {
	list := func() string {
		if len(seen) == 0 {
			return "none"
		}
		return strings.Join(seen, ", ")
	}
	switch {
	case a.EKHash == "" && len(seen) == 0:
		return "", false, fail.Precondition("no TPM endorsement key was announced for %s (tetherctl netboot seen): let it netboot with tetherd serve --netboot-announce, "+
			"or give the hash its console or EK certificate shows with --ek HASH --unseen", a.MAC)
	case a.EKHash == "" && len(seen) > 1:
		return "", false, fail.Precondition("%d endorsement keys were announced for %s (%s), and anyone on the provisioning network can announce one: "+
			"give the one the machine's console shows with --ek", len(seen), a.MAC, list())
	case a.EKHash == "":
		return seen[0], true, nil
	case slices.Contains(seen, a.EKHash):
		return a.EKHash, true, nil
	case a.Unseen:
		return a.EKHash, false, nil
	}
	return "", false, fail.Precondition("endorsement key %s was not announced for %s (announced: %s); check it against the machine's console, "+
		"or pass --unseen to bind it anyway", a.EKHash, a.MAC, list())
}
