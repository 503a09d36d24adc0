package netboot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/throttle"
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

// perSourceMachines is how many distinct refusals (machine and reason) one
// source address gets an event each for in a window. The hardware address
// is the caller's to choose, so coalescing by it alone let one sender
// write an event per made-up address (issue 26: 2,000 random MACs, 2,000
// events, 1,000 rows in `netboot seen`). Past this, the source's
// refusals are counted into one summary event at the window's end
// (docs/design.md §7.4: per source).
const perSourceMachines = 16

// allSourcesMachines bounds the refusals recorded one by one in a window
// over every source together: an attacker with many addresses (issue
// 26's probe used 49) would otherwise still write perSourceMachines rows
// into `netboot seen` per address per minute. Past it, refusals are
// counted into one summary for the window. A real rack of unknown machines
// keeps retrying, so each is recorded in a later window.
const allSourcesMachines = 256

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
	id, _, ref, err := s.bootingInstance(r.Context(), mac)
	switch {
	case err != nil:
		s.Log.Error("netboot boot route", "mac", mac, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	case ref != nil && ref.code == events.RefusedUnknownMAC && s.Announce:
		s.recordMachineRefusal(r, mac, *ref)
		s.serveAnnounceScript(w, r, mac, *ref)
		return
	case ref != nil:
		s.refuseMachine(w, r, mac, *ref)
		return
	}
	if len(s.UKIs) > 0 {
		img, ukiRef, err := s.ukiFor(r.Context(), id)
		if err != nil {
			s.Log.Error("netboot boot route", "mac", mac, "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		if ukiRef == nil {
			// The template boots a signed image: iPXE chains to it, and
			// the per-boot data reaches the node outside it (ADR 0035).
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			_, _ = io.WriteString(w, ukiChain(s.Instances.Artifacts.BaseURL, mac, img.Cmdline))
			return
		}
	}
	s.serveScript(w, r, id, "BOOTIF="+macaddr.BootIF(mac), false, false)
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
// window, and the node's name; a refusal says why there is none.
func (s *Server) bootingInstance(ctx context.Context, mac string) (store.InstanceID, string, *bootRefusal, error) {
	node, err := s.Store.GetNodeByMAC(ctx, mac)
	if errors.Is(err, store.ErrNotFound) {
		return "", "", &bootRefusal{events.RefusedUnknownMAC, "no node has hardware address " + mac}, nil
	}
	if err != nil {
		return "", "", nil, fmt.Errorf("find node of %s: %w", mac, err)
	}
	ins, err := s.Store.ListInstances(ctx, store.InstanceFilter{NodeID: node.ID, Statuses: bootWindow}, store.Page{Limit: 2})
	if err != nil {
		return "", "", nil, fmt.Errorf("find booting instance of node %q: %w", node.Name, err)
	}
	// An instance being terminated expects no boot: leave it out, so the
	// machine gets a refusal script rather than a bare HTTP error.
	ins = slices.DeleteFunc(ins, func(in *store.Instance) bool { return in.TerminateRequestedAt != nil })
	switch len(ins) {
	case 0:
		return "", node.Name, &bootRefusal{events.RefusedNotBooting, fmt.Sprintf("node %s has no instance that is booting", node.Name)}, nil
	case 1:
		return ins[0].ID, node.Name, nil, nil
	}
	// Two boot windows for one machine: serving either could hand one
	// instance's token to the other's machine.
	return "", node.Name, &bootRefusal{events.RefusedNodeAmbiguous, fmt.Sprintf("node %s has more than one booting instance", node.Name)}, nil
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
	s.recordMachineRefusal(r, mac, ref)
	// 200: iPXE runs a script only from a successful response.
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, RefusalScript(ref.msg))
}

// recordMachineRefusal writes the netboot.refused event of a refusal,
// unless one was recorded for the machine and reason within the window
// or the sender (or every sender together) is past its share of them.
func (s *Server) recordMachineRefusal(r *http.Request, mac string, ref bootRefusal) {
	// Coalesce by machine, or by sender when the request named none, and
	// by sender whatever machine it names.
	src := throttle.SourceKey(r.RemoteAddr)
	who := mac
	if who == "" {
		who = src
	}
	now := s.Clock.Now()
	if !s.recent.note(who+"|"+ref.code, src, now) {
		s.Log.Debug("netboot machine refused", "mac", mac, "remote", r.RemoteAddr, "reason", ref.code)
		return
	}
	s.Log.Warn("netboot machine refused", "mac", mac, "remote", r.RemoteAddr, "reason", ref.code)
	ctx := context.WithoutCancel(r.Context())
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		_, err := events.E{Kind: events.NetbootMachineRefused, Severity: events.Medium,
			Message: fmt.Sprintf("netboot refused to %s (%s): %s", orUnknown(mac), r.RemoteAddr, ref.msg),
			Payload: events.MachineRefusedPayload{MAC: mac, Reason: ref.code, Remote: r.RemoteAddr}}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		s.Log.Warn("netboot: record machine refusal", "mac", mac, "err", err)
	}
}

func orUnknown(mac string) string {
	if mac == "" {
		return "a machine"
	}
	return mac
}

// recentRefusals remembers which refusals were recorded lately, and how
// many each source had recorded in its window.
type recentRefusals struct {
	mu      sync.Mutex
	seen    map[string]time.Time
	sources map[string]*sourceWindow
	// all is the window over every source (allSourcesMachines).
	all *sourceWindow
	// ended are windows that ended with refusals held back, for the next
	// flush to summarise.
	ended []sourceSummary
}

type sourceWindow struct {
	start, last    time.Time
	recorded, held int
}

// sourceSummary is one source's held-back refusals in one window, or, with
// allSources, those held back past allSourcesMachines.
type sourceSummary struct {
	source      string
	allSources  bool
	count       int
	first, last time.Time
}

// note reports whether a refusal for key from src is to be recorded: not
// when key was recorded within refusalWindow (a machine retrying), nor
// past src's perSourceMachines in its window, where it is counted for
// the source's summary instead.
func (rr *recentRefusals) note(key, src string, now time.Time) bool {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if t, ok := rr.seen[key]; ok && now.Sub(t) < refusalWindow {
		return false
	}
	if rr.seen == nil || len(rr.seen) >= maxRecentRefusals {
		rr.seen = make(map[string]time.Time)
	}
	sw := rr.sources[src]
	if sw != nil && now.Sub(sw.start) >= refusalWindow {
		rr.end(src, sw)
		sw = nil
	}
	if sw == nil {
		if rr.sources == nil || len(rr.sources) >= maxRecentRefusals {
			for k, old := range rr.sources {
				rr.end(k, old)
			}
			rr.sources = make(map[string]*sourceWindow)
		}
		sw = &sourceWindow{start: now}
		rr.sources[src] = sw
	}
	sw.last = now
	if sw.recorded >= perSourceMachines {
		sw.held++
		return false
	}
	if rr.all != nil && now.Sub(rr.all.start) >= refusalWindow {
		rr.endAll()
	}
	if rr.all == nil {
		rr.all = &sourceWindow{start: now}
	}
	rr.all.last = now
	if rr.all.recorded >= allSourcesMachines {
		rr.all.held++
		return false
	}
	rr.all.recorded++
	sw.recorded++
	rr.seen[key] = now
	return true
}

// endAll closes the window over every source (rr.mu held).
func (rr *recentRefusals) endAll() {
	if rr.all.held > 0 {
		rr.ended = append(rr.ended, sourceSummary{allSources: true, count: rr.all.held, first: rr.all.start, last: rr.all.last})
	}
	rr.all = nil
}

// end closes src's window (rr.mu held), keeping its summary if it held
// anything back.
func (rr *recentRefusals) end(src string, sw *sourceWindow) {
	if sw.held > 0 {
		rr.ended = append(rr.ended, sourceSummary{source: src, count: sw.held, first: sw.start, last: sw.last})
	}
	delete(rr.sources, src)
}

// flush returns the summaries of windows that ended by now (all of them
// when final) and forgets those windows.
func (rr *recentRefusals) flush(now time.Time, final bool) []sourceSummary {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	for src, sw := range rr.sources {
		if final || now.Sub(sw.start) >= refusalWindow {
			rr.end(src, sw)
		}
	}
	if rr.all != nil && (final || now.Sub(rr.all.start) >= refusalWindow) {
		rr.endAll()
	}
	out := rr.ended
	rr.ended = nil
	return out
}

// flushMachineRefusals writes one event per source whose window held
// refusals back: the count, and no hardware address (`netboot seen` lists
// the addresses that have events of their own).
func (s *Server) flushMachineRefusals(ctx context.Context, now time.Time, final bool) {
	s.flushSummaries(ctx, now, s.recent.flush(now, final), events.NetbootMachineRefused, "netboot machine refusals coalesced",
		func(sum sourceSummary) string {
			if sum.allSources {
				return fmt.Sprintf("netboot refused %d more requests from many sources between %s and %s (past %d distinct machines in a window over all sources, refusals are counted, not recorded one by one)",
					sum.count, stamp(sum.first), stamp(sum.last), allSourcesMachines)
			}
			return fmt.Sprintf("netboot refused %d more requests from %s between %s and %s (past %d distinct machines in a window, refusals from one address are counted, not recorded one by one)",
				sum.count, sum.source, stamp(sum.first), stamp(sum.last), perSourceMachines)
		})
}

// flushSummaries writes one medium event of kind per summary of what a
// window held back, with the count and the span, and the sender unless
// it sums every sender.
func (s *Server) flushSummaries(ctx context.Context, now time.Time, sums []sourceSummary, kind store.EventKind, logMsg string, message func(sourceSummary) string) {
	for _, sum := range sums {
		first, last := sum.first.UTC().Format(time.RFC3339Nano), sum.last.UTC().Format(time.RFC3339Nano)
		var payload events.Payload = events.SourceRefusalsPayload{Coalesced: true, Count: sum.count, First: first, Last: last, Remote: sum.source}
		if sum.allSources {
			payload = events.AllSourcesRefusalsPayload{AllSources: true, Coalesced: true, Count: sum.count, First: first, Last: last}
		}
		s.Log.Warn(logMsg, "remote", sum.source, "all_sources", sum.allSources, "count", sum.count)
		err := s.Store.Tx(ctx, func(q store.Queries) error {
			_, err := events.E{Kind: kind, Severity: events.Medium, Message: message(sum), Payload: payload}.Write(ctx, q, now)
			return err
		})
		if err != nil {
			s.Log.Warn("netboot: record "+logMsg, "remote", sum.source, "err", err)
		}
	}
}

// stamp is a summary's time as its messages print it.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
