// Package dashboard is the fleet's web UI. It runs inside tetherctl, on the
// operator's own machine, and talks to tetherd with the operator's own
// client identity, as `kubectl proxy` does: tetherd gains no network surface
// and the browser never holds a key. Pages are rendered on the server; live
// parts arrive over server-sent events fed by tetherd's event Watch stream.
package dashboard

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Roles, weakest first, as tetherd ranks them (docs/design.md, identities).
var roleRank = map[string]int{"viewer": 1, "operator": 2, "admin": 3}

// Config is what a dashboard needs.
type Config struct {
	Client v1.AdminServiceClient
	// Identity and Role are the caller's, read from its client certificate.
	// The role only decides which actions the pages offer; tetherd checks
	// it again on every call.
	Identity, Role string
	// Secret is the per-run URL secret; New makes one when empty.
	Secret string
	// Endpoint is tetherd's address, shown in the page header.
	Endpoint string
	Clock    clock.Clock
	Log      *slog.Logger
	// CallTimeout bounds each unary call (default 10 s).
	CallTimeout time.Duration
}

// Server serves the dashboard.
type Server struct {
	cfg    Config
	prefix string // "/t/<secret>"
	pages  map[string]*template.Template
	mux    *http.ServeMux
}

// NewSecret returns 128 random bits, hex encoded.
func NewSecret() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("dashboard: url secret: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// New builds a dashboard.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("dashboard: no admin client")
	}
	if _, ok := roleRank[cfg.Role]; !ok {
		return nil, fmt.Errorf("dashboard: identity %q has unknown role %q", cfg.Identity, cfg.Role)
	}
	if cfg.Secret == "" {
		s, err := NewSecret()
		if err != nil {
			return nil, err
		}
		cfg.Secret = s
	}
	if len(cfg.Secret) < 16 {
		return nil, fmt.Errorf("dashboard: url secret too short (%d characters, want at least 16)", len(cfg.Secret))
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 10 * time.Second
	}
	s := &Server{cfg: cfg, prefix: "/t/" + cfg.Secret}
	if err := s.parseTemplates(); err != nil {
		return nil, err
	}
	s.routes()
	return s, nil
}

// Path is the secret-bearing path of a page, e.g. Path("/pools").
func (s *Server) Path(p string) string { return s.prefix + p }

// URL is the dashboard's address on a listener at addr.
func (s *Server) URL(addr string) string { return "http://" + addr + s.prefix + "/" }

func (s *Server) routes() {
	m := http.NewServeMux()
	static, _ := fs.Sub(assets, "static")
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /{$}", s.fleetPage)
	m.HandleFunc("GET /fragment/fleet", s.fleetFragment)
	m.HandleFunc("GET /instances", s.instancesPage)
	m.HandleFunc("GET /instances/{id}", s.instancePage)
	m.HandleFunc("GET /instances/{id}/fragment", s.instanceFragment)
	m.HandleFunc("GET /instances/{id}/confirm", s.confirmInstanceAction)
	m.HandleFunc("POST /instances/{id}/{action}", s.instanceAction)
	m.HandleFunc("GET /pools", s.poolsPage)
	m.HandleFunc("GET /fragment/pools", s.poolsFragment)
	m.HandleFunc("GET /pools/{name}", s.poolPage)
	m.HandleFunc("GET /pools/{name}/fragment", s.poolFragment)
	m.HandleFunc("GET /pools/{name}/confirm", s.confirmPoolAction)
	m.HandleFunc("POST /pools/{name}/{action}", s.poolAction)
	m.HandleFunc("GET /tasks/new", s.newTaskPage)
	m.HandleFunc("POST /tasks", s.createTask)
	m.HandleFunc("GET /tasks/{id}", s.taskPage)
	m.HandleFunc("GET /tasks/{id}/fragment", s.taskFragment)
	m.HandleFunc("GET /events", s.eventsPage)
	m.HandleFunc("GET /sse/events", s.sseEvents)
	m.HandleFunc("GET /sse/console/{id}", s.sseConsole)
	s.mux = m
}

// ServeHTTP checks the URL secret, then the origin of any action, then
// hands the request to the pages.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := s.strip(r.URL.Path)
	if !ok {
		http.Error(w, "403 forbidden: this dashboard's address carries a per-run secret; use the URL tetherctl printed", http.StatusForbidden)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !sameOrigin(r) {
		http.Error(w, "403 forbidden: cross-origin request", http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	// same-origin, not no-referrer: with no-referrer a browser sends "Origin: null"
	// on form posts, and the origin check needs the real one. The secret in
	// the path so never leaves this origin.
	w.Header().Set("Referrer-Policy", "same-origin")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	r2 := r.Clone(r.Context())
	r2.URL.Path = rest
	r2.URL.RawPath = ""
	s.mux.ServeHTTP(w, r2)
}

// strip removes the secret prefix, comparing it in constant time.
func (s *Server) strip(p string) (string, bool) {
	const head = "/t/"
	if !strings.HasPrefix(p, head) {
		return "", false
	}
	secret, rest, _ := strings.Cut(p[len(head):], "/")
	if subtle.ConstantTimeCompare([]byte(secret), []byte(s.cfg.Secret)) != 1 {
		return "", false
	}
	return "/" + rest, true
}

// sameOrigin refuses form posts from other sites: browsers send Origin on
// every POST, and a page elsewhere cannot forge it.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		// Non-browser clients (curl, tests) send none; they need the secret anyway.
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// can reports whether the caller's role reaches need.
func (s *Server) can(need string) bool { return roleRank[s.cfg.Role] >= roleRank[need] }
