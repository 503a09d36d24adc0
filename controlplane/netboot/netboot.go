// Package netboot serves what a machine netbooting over iPXE fetches: the
// kernel and initramfs, content addressed, and a per-instance iPXE script
// whose kernel command line carries the enrollment data (docs/design.md §3.2:
// tether.url, tether.token, tether.ca).
//
// The script holds a one-time token, so it is served once per boot: the
// first fetch in a boot window (provisioning, starting or rebooting) gets a
// freshly issued token, and every later fetch until the instance's next
// boot is refused with 410 Gone and an event. Whether this boot's script
// was served is read from the event log under the instance's row lock, so
// the rule holds across restarts and replicas. Tokens are never logged:
// they appear in the response body and nowhere else.
//
// Nobody authenticates to this server, so it serves scripts only to
// instances whose provider netboots them (providers.Netbooter), limits
// script requests per source address, and coalesces repeated refusals
// into one event per window. It belongs on a trusted provisioning
// network all the same.
package netboot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/controlplane/connlimit"
	"github.com/tetherfleet/tether/controlplane/events"
	"github.com/tetherfleet/tether/controlplane/instances"
	"github.com/tetherfleet/tether/controlplane/lifecycle"
	"github.com/tetherfleet/tether/controlplane/modules"
	"github.com/tetherfleet/tether/controlplane/netboot/tftp"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/throttle"
	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/guard"
	"github.com/tetherfleet/tether/providers"
)

// Server serves netboot files over HTTP.
type Server struct {
	Store     store.Store
	Clock     clock.Clock
	Log       *slog.Logger
	Instances *instances.Service
	// Limiter rate-limits script requests per source address (nil: no
	// limit); RateLimited, if set, counts the requests it refuses.
	Limiter     *throttle.Limiter
	RateLimited prometheus.Counter
	// Refusals coalesces repeated refusals of one instance to one source
	// into one event per window (nil: a window of RefusalWindow).
	Refusals *throttle.Coalescer

	// Announce boots an unknown hardware address into the agent in
	// announce mode instead of refusing it, and takes its announcements
	// on AnnouncePath (announce.go, docs/adr/0030).
	Announce bool

	// Loaders, when its Dir is set, serves the iPXE loaders under
	// /loaders/ for UEFI HTTP Boot (loaders.go).
	Loaders tftp.Loaders
	// UKIs are the signed unified kernel images by template (tetherd
	// --uki, uki.go): a machine whose template has one boots it, over
	// UEFI HTTP Boot or chained from iPXE.
	UKIs UKIs

	// Panics records a panic in a request's handler, which then answers
	// 500 alone (nil: recovered, not counted).
	Panics *guard.Panics
	// Limits on the port's connections; zero means the defaults below.
	// ConnectionsRefused counts the ones closed by the caps (may be nil).
	MaxConns, MaxConnsPerSource int
	IdleTimeout                 time.Duration
	ConnectionsRefused          *prometheus.CounterVec

	recent    recentRefusals // coalesces boot-route refusals (boot.go)
	announced recentRefusals // coalesces announcements (announce.go)

	once sync.Once
}

// The netboot port's share of the descriptor budget (docs/reliability.md,
// "Listener limits"): it comes out of tetherd's --fd-reserve, so it is a
// fraction of it: 256 connections, and as many artifact files open while
// they are served, is half of the default 1,024. A machine holds one or
// two connections while it boots;
// past a source's share its oldest connection is closed for the new one,
// so a flood from an address machines share (QEMU user networking's
// 127.0.0.1, a NAT) cannot lock them out. An idle keep-alive connection is
// closed after DefaultIdleTimeout (issue 26: 1,500 were held for 75 s).
const (
	DefaultMaxConns          = 256
	DefaultMaxConnsPerSource = 64
	DefaultIdleTimeout       = 30 * time.Second
)

// RefusalWindow is the default coalescing window of refusal events.
const RefusalWindow = time.Minute

func (s *Server) refusals() *throttle.Coalescer {
	s.once.Do(func() {
		if s.Refusals == nil {
			s.Refusals = throttle.NewCoalescer(RefusalWindow, 0)
		}
	})
	return s.Refusals
}

// ScriptPath is where an instance's iPXE script is served; chain to it
// from a machine's boot loader: `chain http://HOST:PORT/ipxe/<instance id>`.
func ScriptPath(instanceID string) string { return "/ipxe/" + instanceID }

var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Handler returns the HTTP routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ipxe/boot", s.boot)
	// GET patterns match HEAD too: UEFI HTTP Boot asks the size first.
	mux.HandleFunc("GET /uki/boot", s.ukiBoot)
	mux.HandleFunc("GET /uki/handoff", s.ukiHandoff)
	mux.HandleFunc("POST "+AnnouncePath, s.announce)
	mux.HandleFunc("GET /loaders/{name}", s.loader)
	mux.HandleFunc("GET /ipxe/{id}", s.script)
	mux.HandleFunc("GET /artifacts/{digest}", s.artifact)
	return mux
}

// Serve serves on lis until ctx ends, within the connection limits.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	maxConns, perSource, idle := s.MaxConns, s.MaxConnsPerSource, s.IdleTimeout
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	if perSource <= 0 {
		perSource = DefaultMaxConnsPerSource
	}
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	// Nobody authenticates here: every connection counts against its
	// source for its whole life.
	lis = connlimit.Wrap(lis, connlimit.Options{MaxConns: maxConns, MaxPendingPerSource: perSource, ShedPerSource: true,
		Refused: s.ConnectionsRefused, Log: s.Log, Clock: s.Clock})
	srv := &http.Server{
		Handler:           s.recovering(s.Handler()),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       idle,
		// net/http's own error log could quote a request; ours is slog.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	shutdown := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			s.Log.Warn("netboot server shutdown: requests cut", "err", err)
		}
	}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		<-ctx.Done()
		shutdown()
	}()
	err := srv.Serve(lis)
	if errors.Is(err, http.ErrServerClosed) {
		// Serve returns as soon as Shutdown starts; the requests still in
		// flight use the store, so wait until Shutdown has waited for them.
		<-shut
		return nil
	}
	shutdown()
	return err
}

// recovering answers 500 for a handler that panicked, logged and counted.
// net/http would recover too, but silently (its error log is off) and by
// cutting the connection; http.ErrAbortHandler is its own signal and
// passes through.
func (s *Server) recovering(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				_ = s.Panics.Note("netboot http", v)
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// refusal is an answer other than the script, with an HTTP status.
type refusal struct {
	code int
	msg  string
}

func (r *refusal) Error() string { return r.msg }

// bootWindow are the states in which a machine is expected to boot.
var bootWindow = []lifecycle.State{lifecycle.Provisioning, lifecycle.Starting, lifecycle.Rebooting}

func (s *Server) script(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !validID.MatchString(id) {
		http.Error(w, "not an instance id", http.StatusBadRequest)
		return
	}
	if !s.allow(w, r) {
		return
	}
	// The machine's address is unknown here: iPXE fills it in from the
	// interface it booted from.
	s.serveScript(w, r, store.InstanceID(id), "BOOTIF=01-${netX/mac:hexhyp}", true, false)
}

// allow applies the per-source rate limit of the unauthenticated script
// routes, answering 429 itself when the source is over it.
func (s *Server) allow(w http.ResponseWriter, r *http.Request) bool {
	if s.Limiter.Allow(throttle.SourceKey(r.RemoteAddr)) {
		return true
	}
	if s.RateLimited != nil {
		s.RateLimited.Inc()
	}
	w.Header().Set("Retry-After", "5")
	http.Error(w, "too many script requests from this address; retry in a few seconds", http.StatusTooManyRequests)
	return false
}

// serveScript serves instance id's one-time script; bootIF is the BOOTIF=
// argument that tells the agent which interface to configure first. byID
// is the /ipxe/{id} route, which anyone can name an instance on: it serves
// only instances whose provider boots them over the network. The MAC route
// is bound to the node's hardware address instead (boot.go).
//
// handoff serves the per-boot data of a machine that booted its
// template's signed image (uki.go) instead of a script: the same one-time
// rule, the same token, without the boot lines the image already holds.
func (s *Server) serveScript(w http.ResponseWriter, r *http.Request, id store.InstanceID, bootIF string, byID, handoff bool) {
	ctx := r.Context()
	now := s.Clock.Now()
	var body string
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		in, err := q.LockInstance(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return &refusal{http.StatusNotFound, "no such instance"}
		}
		if err != nil {
			return err
		}
		if byID && !providers.Netboots(s.Instances.Machines[in.Provider]) {
			return &refusal{http.StatusForbidden, fmt.Sprintf("instance %s is booted by the %s provider, which does not boot machines over the network: "+
				"its iPXE script is not served", id, in.Provider)}
		}
		st := in.Status
		inWindow := false
		for _, b := range bootWindow {
			inWindow = inWindow || st == b
		}
		if !inWindow || in.TerminateRequestedAt != nil {
			return &refusal{http.StatusConflict, fmt.Sprintf("instance %s is %s: no boot is expected", id, st)}
		}
		served, err := servedThisBoot(ctx, q, id)
		if err != nil {
			return err
		}
		if served {
			what := "script"
			if handoff {
				what = "hand-off"
			}
			return &refusal{http.StatusGone, fmt.Sprintf("the %s of instance %s was already served for this boot", what, id)}
		}
		var boot providers.Boot
		if !handoff {
			// The hand-off's machine booted its image already.
			node, err := q.GetNodeByID(ctx, in.NodeID)
			if err != nil {
				return err
			}
			tpl, err := q.GetTemplateByID(ctx, node.TemplateID)
			if err != nil {
				return err
			}
			if boot, err = s.Instances.Artifacts.Boot(tpl); err != nil {
				return &refusal{http.StatusServiceUnavailable, fmt.Sprintf("no boot artifacts: %v", err)}
			}
			if boot.KernelURL == "" {
				return &refusal{http.StatusServiceUnavailable, "the netboot server's base URL is not configured"}
			}
		}
		tok, err := s.Instances.BootToken(ctx, q, in, now)
		if err != nil {
			return err
		}
		what := "iPXE script"
		if handoff {
			what, body = "per-boot hand-off", Handoff(id.String(), tok)
		} else {
			// A netbooted machine has no static address: the agent asks
			// DHCP, on the interface it booted from first.
			body = Script(boot.KernelURL, boot.InitramfsURL, WithSigners(boot.KernelArgs+" ip=dhcp "+bootIF, boot.Signers), s.Instances.AgentURL, tok, id.String(), s.Instances.Fingerprint())
		}
		_, err = events.E{Kind: events.NetbootServed, InstanceID: id,
			Message: fmt.Sprintf("%s served to %s (instance %s)", what, r.RemoteAddr, st),
			Payload: events.ScriptServedPayload{Remote: r.RemoteAddr, Status: string(st)}}.Write(ctx, q, now)
		return err
	})
	var ref *refusal
	switch {
	case errors.As(err, &ref):
		if ref.code == http.StatusNotFound {
			s.Log.Info("netboot script refused", "instance", id, "remote", r.RemoteAddr, "status", ref.code, "reason", ref.msg)
		} else {
			s.refused(ctx, id, r.RemoteAddr, ref)
		}
		http.Error(w, ref.msg, ref.code)
		return
	case err != nil:
		s.Log.Error("netboot script", "instance", id, "remote", r.RemoteAddr, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	s.Log.Info("netboot script served", "instance", id, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, body)
}

// servedThisBoot reports whether the instance's script was served since
// it last changed state: each boot window begins with a transition.
func servedThisBoot(ctx context.Context, q store.Queries, id store.InstanceID) (bool, error) {
	latest := func(kind store.EventKind) (int64, error) {
		evs, err := q.ListEvents(ctx, store.EventFilter{Kind: kind, InstanceID: id}, store.Page{Limit: 1})
		if err != nil || len(evs) == 0 {
			return 0, err
		}
		return evs[0].ID, nil
	}
	served, err := latest(events.NetbootServed)
	if err != nil || served == 0 {
		return false, err
	}
	entered, err := latest(events.InstanceTransition)
	if err != nil {
		return false, err
	}
	return served > entered, nil
}

// refusedFetch is what the first refusal of a window recorded, for the
// summary of the rest.
type refusedFetch struct {
	id             store.InstanceID
	remote, reason string
	status         int
}

// refused leaves the trail of a refused fetch: a second fetch in one boot
// may be someone else's attempt at the token. Refusals of one instance to
// one source are coalesced: one event per window, then one with the count.
func (s *Server) refused(ctx context.Context, id store.InstanceID, remote string, ref *refusal) {
	now := s.Clock.Now()
	write, held := s.refusals().Note(id.String()+"/"+throttle.SourceKey(remote), now, refusedFetch{id, remote, ref.msg, ref.code})
	if !write {
		return
	}
	s.Log.Warn("netboot script refused", "instance", id, "remote", remote, "status", ref.code, "reason", ref.msg)
	ctx = context.WithoutCancel(ctx) // the client may have hung up already
	if held.Count > 0 {
		s.summary(ctx, held, now)
	}
	s.writeRefusal(ctx, id, now, fmt.Sprintf("iPXE script refused to %s: %s", remote, ref.msg), ref.code,
		events.ScriptRefusedPayload{Count: 1, Reason: ref.msg, Remote: remote, Status: ref.code})
}

// summary writes what a window held back: one event with the count.
func (s *Server) summary(ctx context.Context, sum throttle.Summary, now time.Time) {
	f, _ := sum.Info.(refusedFetch)
	msg := fmt.Sprintf("iPXE script refused to %s %d more times from %s to %s: %s", f.remote, sum.Count,
		sum.First.UTC().Format(time.RFC3339), sum.Last.UTC().Format(time.RFC3339), f.reason)
	s.Log.Warn("netboot script refusals coalesced", "instance", f.id, "remote", f.remote, "count", sum.Count, "reason", f.reason)
	s.writeRefusal(ctx, f.id, now, msg, f.status, events.ScriptRefusalsPayload{Coalesced: true, Count: sum.Count,
		First: sum.First.UTC().Format(time.RFC3339Nano), Last: sum.Last.UTC().Format(time.RFC3339Nano), Reason: f.reason, Remote: f.remote, Status: f.status})
}

// writeRefusal writes a netboot.script_refused event of a refusal with
// HTTP status.
func (s *Server) writeRefusal(ctx context.Context, id store.InstanceID, now time.Time, msg string, status int, payload events.Payload) {
	sev := events.Medium
	if status == http.StatusGone {
		sev = events.High // a second fetch in one boot may be someone after the token
	}
	err := s.Store.Tx(ctx, func(q store.Queries) error {
		_, err := events.E{Kind: events.NetbootRefused, Severity: sev, InstanceID: id, Message: msg, Payload: payload}.Write(ctx, q, now)
		return err
	})
	if err != nil {
		s.Log.Warn("netboot: record refusal", "instance", id, "err", err)
	}
}

// FlushRefusals writes the summaries of the refusal windows that have
// ended (all of them when final, at shutdown), so that a burst that
// stopped is still on record with its count.
func (s *Server) FlushRefusals(ctx context.Context, final bool) {
	now := s.Clock.Now()
	for _, sum := range s.refusals().Flush(now, final) {
		s.summary(ctx, sum, now)
	}
	s.flushMachineRefusals(ctx, now, final)
	s.flushAnnouncements(ctx, now, final)
}

// Script is an instance's iPXE script. Template arguments come before the
// tether.* parameters, which the agent reads by name. An empty token is a
// tokenless boot: the script names the instance, whose TPM proves it, and
// carries no secret.
func Script(kernelURL, initramfsURL, kernelArgs, agentURL, token, instanceID, caFingerprint string) string {
	// A line break in template arguments would be a second iPXE command.
	args := strings.Join(strings.Fields(kernelArgs), " ")
	cmdline := "initrd=initramfs"
	if args != "" {
		cmdline += " " + args
	}
	cmdline += " tether.url=" + agentURL
	if token != "" {
		cmdline += " tether.token=" + token
	} else {
		cmdline += " tether.instance=" + instanceID
	}
	cmdline += " tether.ca=" + caFingerprint
	return "#!ipxe\n" +
		"kernel " + kernelURL + " " + cmdline + "\n" +
		"initrd --name initramfs " + initramfsURL + "\n" +
		"boot\n"
}

// artifact serves a kernel or initramfs blob. Only digests that are boot
// artifacts are served: modules are for enrolled agents only, over mTLS.
func (s *Server) artifact(w http.ResponseWriter, r *http.Request) {
	digest := r.PathValue("digest")
	if _, err := modules.ParseDigest(digest); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ok, err := s.isArtifact(r.Context(), digest)
	if err != nil {
		s.Log.Error("netboot artifact", "digest", digest, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	if !ok {
		http.Error(w, "not a boot artifact", http.StatusNotFound)
		return
	}
	f, err := s.Instances.Artifacts.Blobs.Open(digest)
	if err != nil {
		http.Error(w, "artifact missing from the blob store", http.StatusNotFound)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	// Content addressed: the bytes behind a digest never change.
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	http.ServeContent(w, r, "", time.Time{}, f)
}

func (s *Server) isArtifact(ctx context.Context, digest string) (bool, error) {
	a := s.Instances.Artifacts
	if a.IsArtifact(digest, nil) {
		return true, nil
	}
	page := store.Page{Limit: store.MaxPageSize}
	for {
		ts, err := s.Store.ListTemplates(ctx, page)
		if err != nil {
			return false, err
		}
		if a.IsArtifact(digest, ts) {
			return true, nil
		}
		if len(ts) < page.Limit {
			return false, nil
		}
		page.After = ts[len(ts)-1].Name
	}
}
