package netboot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/internal/macaddr"
)

// BootPath is the boot route a machine's iPXE asks with its hardware
// address; the DHCP responder hands iPXE this URL, and an existing iPXE
// setup chains to it with `chain http://HOST:PORT/ipxe/boot?mac=${net0/mac}`.
func BootPath(mac string) string { return "/ipxe/boot?mac=" + mac }

// refusalWindow is how long a repeated refusal of one address for one
// reason is not recorded again: firmware retries in a loop, and one event
// per machine and reason says all there is to say.
const refusalWindow = time.Minute

// maxRecentRefusals bounds the coalescing memory against a flood of
// made-up addresses; past it the memory starts over (more events, no growth).
const maxRecentRefusals = 4096

// bootRefusal is why a machine gets no script.
type bootRefusal struct {
	code string // events.Refused*
	msg  string // shown on the machine's console: no client input in it
}

// boot resolves a hardware address to the node's booting instance and
// serves that instance's one-time script. Everything else gets a short
// iPXE script that says why on the console and exits, so the firmware
// moves on to its next boot device.
func (s *Server) boot(w http.ResponseWriter, r *http.Request) {
	if !s.allow(w, r) {
		return
	}
	mac, err := bootMAC(r)
	if err != nil {
		s.refuseMachine(w, r, "", bootRefusal{events.RefusedMalformed, err.Error()})
		return
	}
	id, ref, err := s.bootingInstance(r.Context(), mac)
	switch {
	case err != nil:
		s.Log.Error("netboot boot route", "mac", mac, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	case ref != nil:
		s.refuseMachine(w, r, mac, *ref)
		return
	}
	s.serveScript(w, r, id, "BOOTIF="+macaddr.BootIF(mac), false)
}

// bootMAC reads the one mac parameter, strictly: one value, no other
// parameters, a valid unicast hardware address.
func bootMAC(r *http.Request) (string, error) {
	q := r.URL.Query()
	vs := q["mac"]
	switch {
	case len(vs) != 1:
		return "", errors.New("the request needs exactly one mac parameter")
	case len(q) != 1:
		return "", errors.New("the request has parameters other than mac")
	}
	mac, err := macaddr.Normalize(vs[0])
	if err != nil {
		return "", errors.New("the mac parameter is not a valid hardware address")
	}
	return mac, nil
}

// bootingInstance finds the instance of mac's node that is in its boot
// window; a refusal says why there is none.
func (s *Server) bootingInstance(ctx context.Context, mac string) (string, *bootRefusal, error) {
	node, err := s.Store.GetNodeByMAC(ctx, mac)
	if errors.Is(err, store.ErrNotFound) {
		return "", &bootRefusal{events.RefusedUnknownMAC, "no node has hardware address " + mac}, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("find node of %s: %w", mac, err)
	}
	ins, err := s.Store.ListInstances(ctx, store.InstanceFilter{NodeID: node.ID, Statuses: bootWindow}, store.Page{Limit: 2})
	if err != nil {
		return "", nil, fmt.Errorf("find booting instance of node %q: %w", node.Name, err)
	}
	// An instance being terminated expects no boot: leave it out, so the
	// machine gets a refusal script rather than a bare HTTP error.
	ins = slices.DeleteFunc(ins, func(in *store.Instance) bool { return in.TerminateRequestedAt != nil })
	switch len(ins) {
	case 0:
		return "", &bootRefusal{events.RefusedNotBooting, fmt.Sprintf("node %s has no instance that is booting", node.Name)}, nil
	case 1:
		return ins[0].ID, nil, nil
	}
	// Two boot windows for one machine: serving either could hand one
	// instance's token to the other's machine.
	return "", &bootRefusal{events.RefusedNodeAmbiguous, fmt.Sprintf("node %s has more than one booting instance", node.Name)}, nil
}

// RefusalScript is the iPXE script a refused machine runs: it prints the
// reason and exits non-zero, so the firmware tries its next boot device.
func RefusalScript(reason string) string {
	return "#!ipxe\necho Tether netboot refused: " + ipxeText(reason) + "\nexit 1\n"
}

// ipxeText keeps a message one harmless iPXE line: no line breaks (a second
// command) and no ${...} expansion.
func ipxeText(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '$' || c == '\\' || c < 0x20 || c >= 0x7f:
			out = append(out, '_')
		default:
			out = append(out, c)
		}
	}
	return string(out)
}

func (s *Server) refuseMachine(w http.ResponseWriter, r *http.Request, mac string, ref bootRefusal) {
	s.Log.Warn("netboot machine refused", "mac", mac, "remote", r.RemoteAddr, "reason", ref.code)
	// Coalesce by machine, or by sender when the request named none.
	who := mac
	if who == "" {
		who, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	if s.recent.first(who+"|"+ref.code, s.Clock.Now()) {
		ctx := context.WithoutCancel(r.Context())
		err := s.Store.Tx(ctx, func(q store.Queries) error {
			_, err := events.E{Kind: events.NetbootMachineRefused, Severity: events.Medium,
				Message: fmt.Sprintf("netboot refused to %s (%s): %s", orUnknown(mac), r.RemoteAddr, ref.msg),
				Payload: map[string]any{"mac": mac, "reason": ref.code, "remote": r.RemoteAddr}}.Write(ctx, q, s.Clock.Now())
			return err
		})
		if err != nil {
			s.Log.Warn("netboot: record machine refusal", "mac", mac, "err", err)
		}
	}
	// 200: iPXE runs a script only from a successful response.
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, RefusalScript(ref.msg))
}

func orUnknown(mac string) string {
	if mac == "" {
		return "a machine"
	}
	return mac
}

// recentRefusals remembers which refusals were recorded lately.
type recentRefusals struct {
	mu   sync.Mutex
	seen map[string]time.Time
}

// first reports whether key was not recorded within refusalWindow of now,
// and remembers it.
func (rr *recentRefusals) first(key string, now time.Time) bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if t, ok := rr.seen[key]; ok && now.Sub(t) < refusalWindow {
		return false
	}
	if rr.seen == nil || len(rr.seen) >= maxRecentRefusals {
		rr.seen = make(map[string]time.Time)
	}
	rr.seen[key] = now
	return true
}
