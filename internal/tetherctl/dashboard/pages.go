package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	P        string // the secret-bearing path prefix
	Identity string
	Role     string
	Endpoint string
	Operate  bool // the role may drive instances, pools and tasks
	Now      time.Time
	Data     any
	// Live names an SSE feed that makes the page refresh its fragment.
	Live     string
	Fragment string
}

func (s *Server) parseTemplates() error {
	funcs := template.FuncMap{
		"state":      stateName,
		"poolState":  poolStateName,
		"poolStatus": poolStatusName,
		"phase":      phaseName,
		"taskStatus": taskStatusName,
		"taskKind":   taskKindName,
		"certKind":   func(k v1.CertificateKind) string { return lower(k.String(), "CERTIFICATE_KIND_") },
		"severity":   severityName,
		"when":       when,
		"ago":        func(t *timestamppb.Timestamp) string { return ago(t, s.cfg.Clock.Now()) },
		"presence":   func(p *v1.AgentPresence) string { return presence(p, s.cfg.Clock.Now()) },
		"short":      short,
		"str":        func(b []byte) string { return string(b) },
		"join":       strings.Join,
		"ms":         func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) },
		"query":      url.QueryEscape,
		"payload":    payloadString,
		"instStates": func() []string { return names(instanceStates, stateName) },
		"list":       func(xs ...string) []string { return xs },
		"rows": func(p string, evs []*v1.FleetEvent) any {
			return struct {
				P      string
				Events []*v1.FleetEvent
			}{p, evs}
		},
	}
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/parts.html")
	if err != nil {
		return fmt.Errorf("dashboard: parse layout: %w", err)
	}
	s.pages = map[string]*template.Template{}
	for _, name := range []string{"fleet", "instances", "instance", "pools", "pool", "confirm", "result", "task_new", "task", "events", "error"} {
		t, err := template.Must(layout.Clone()).ParseFS(assets, "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("dashboard: parse %s: %w", name, err)
		}
		s.pages[name] = t
	}
	return nil
}

func names[T any](xs []T, f func(T) string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

func when(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05")
}

func ago(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "never"
	}
	d := now.Sub(t.AsTime()).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}

func short(s string) string {
	if len(s) > 19 {
		return s[:19] + "…"
	}
	return s
}

func (s *Server) base(title, nav string) page {
	return page{Title: title, Nav: nav, P: s.prefix, Identity: s.cfg.Identity, Role: s.cfg.Role,
		Endpoint: s.cfg.Endpoint, Operate: s.can("operator"), Now: s.cfg.Clock.Now()}
}

// render executes a page (or, when frag is set, only its "fragment"
// template) into a buffer first, so a template error never sends half a page.
func (s *Server) render(w http.ResponseWriter, name string, p page, frag bool) {
	var buf bytes.Buffer
	entry := "layout.html"
	if frag {
		entry = "fragment"
	}
	if err := s.pages[name].ExecuteTemplate(&buf, entry, p); err != nil {
		s.cfg.Log.Error("dashboard: render", "page", name, "err", err)
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page with the server's words. A gRPC status keeps
// its code: PermissionDenied stays 403, NotFound 404.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	code := http.StatusBadGateway
	msg := err.Error()
	if st, ok := status.FromError(err); ok {
		msg = st.Code().String() + ": " + st.Message()
		switch st.Code() {
		case codes.PermissionDenied, codes.Unauthenticated:
			code = http.StatusForbidden
		case codes.NotFound:
			code = http.StatusNotFound
		case codes.InvalidArgument, codes.FailedPrecondition, codes.AlreadyExists, codes.ResourceExhausted:
			code = http.StatusBadRequest
		}
	}
	var bad badInput
	if errors.As(err, &bad) {
		code, msg = http.StatusBadRequest, bad.Error()
	}
	w.WriteHeader(code)
	p := s.base("Error", "")
	p.Data = struct{ What, Msg string }{what, msg}
	s.render(w, "error", p, false)
}

type badInput struct{ error }

func (s *Server) call(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.CallTimeout)
}

func (s *Server) fleetPage(w http.ResponseWriter, r *http.Request) { s.fleetView(w, r, false) }
func (s *Server) fleetFragment(w http.ResponseWriter, r *http.Request) {
	s.fleetView(w, r, true)
}

func (s *Server) fleetView(w http.ResponseWriter, r *http.Request, frag bool) {
	ctx, cancel := s.call(r)
	defer cancel()
	sum, err := s.fleet(ctx)
	if err != nil {
		s.fail(w, r, "fleet", err)
		return
	}
	p := s.base("Fleet", "fleet")
	p.Data, p.Live, p.Fragment = sum, s.prefix+"/sse/events", s.prefix+"/fragment/fleet"
	s.render(w, "fleet", p, frag)
}

type instancesData struct {
	F    instanceFilter
	Rows []*v1.Instance
	Next string
	More url.Values
}

func (s *Server) instancesPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := instanceFilter{State: q.Get("state"), Node: q.Get("node"), Pool: q.Get("pool"), Provider: q.Get("provider"),
		Text: q.Get("q"), Page: q.Get("page"), Size: 100}
	if n, err := strconv.Atoi(q.Get("size")); err == nil && n > 0 && n <= 1000 {
		f.Size = n
	}
	ctx, cancel := s.call(r)
	defer cancel()
	rows, next, err := s.instancePageRows(ctx, f)
	if err != nil {
		if _, perr := parseState(f.State); perr != nil {
			err = badInput{perr}
		}
		s.fail(w, r, "instances", err)
		return
	}
	more := url.Values{}
	for k, v := range q {
		more[k] = v
	}
	more.Set("page", next)
	p := s.base("Instances", "instances")
	p.Data = instancesData{F: f, Rows: rows, Next: next, More: more}
	s.render(w, "instances", p, false)
}

type instanceData struct {
	In       *v1.Instance
	Timeline template.HTML
	Certs    []*v1.Certificate
	Tasks    []*v1.Task
	Events   []*v1.FleetEvent
	Actions  []string
}

// instanceActions are offered per state; tetherd decides in the end.
func instanceActions(in *v1.Instance) []string {
	if in.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		return nil
	}
	acts := []string{"stop", "start", "reboot", "terminate"}
	if in.Hold {
		acts = append(acts, "unhold")
	} else {
		acts = append(acts, "hold")
	}
	if in.Cordon == nil {
		acts = append(acts, "cordon")
	} else {
		acts = append(acts, "uncordon")
	}
	return acts
}

func (s *Server) instanceData(r *http.Request) (*instanceData, error) {
	ctx, cancel := s.call(r)
	defer cancel()
	id := r.PathValue("id")
	in, err := s.cfg.Client.GetInstance(ctx, &v1.GetInstanceRequest{Id: id})
	if err != nil {
		return nil, err
	}
	d := &instanceData{In: in, Actions: instanceActions(in)}
	evs, err := s.cfg.Client.ListEvents(ctx, &v1.ListEventsRequest{InstanceId: id, PageSize: 200})
	if err != nil {
		return nil, fmt.Errorf("events of %s: %w", id, err)
	}
	d.Events = evs.Events
	// Certificates need the admin role; a viewer's page shows none rather
	// than failing.
	if certs, err := s.cfg.Client.ListCertificates(ctx, &v1.ListCertificatesRequest{InstanceId: id, PageSize: 100}); err == nil {
		d.Certs = certs.Certificates
	} else if status.Code(err) != codes.PermissionDenied {
		return nil, fmt.Errorf("certificates of %s: %w", id, err)
	}
	tasks, err := s.cfg.Client.ListTasks(ctx, &v1.ListTasksRequest{InstanceId: id, PageSize: 50})
	if err != nil {
		return nil, fmt.Errorf("tasks of %s: %w", id, err)
	}
	d.Tasks = tasks.Tasks
	d.Timeline = timelineSVG(bootMarks(in, d.Events, s.cfg.Clock.Now()))
	return d, nil
}

func (s *Server) instancePage(w http.ResponseWriter, r *http.Request)     { s.instanceView(w, r, false) }
func (s *Server) instanceFragment(w http.ResponseWriter, r *http.Request) { s.instanceView(w, r, true) }

func (s *Server) instanceView(w http.ResponseWriter, r *http.Request, frag bool) {
	d, err := s.instanceData(r)
	if err != nil {
		s.fail(w, r, "instance "+r.PathValue("id"), err)
		return
	}
	p := s.base("Instance "+d.In.Id, "instances")
	p.Data = d
	p.Live = s.prefix + "/sse/events?instance=" + url.QueryEscape(d.In.Id)
	p.Fragment = s.prefix + "/instances/" + url.PathEscape(d.In.Id) + "/fragment"
	s.render(w, "instance", p, frag)
}

type poolsData struct{ Pools []*v1.Pool }

func (s *Server) poolsPage(w http.ResponseWriter, r *http.Request)     { s.poolsView(w, r, false) }
func (s *Server) poolsFragment(w http.ResponseWriter, r *http.Request) { s.poolsView(w, r, true) }

func (s *Server) poolsView(w http.ResponseWriter, r *http.Request, frag bool) {
	ctx, cancel := s.call(r)
	defer cancel()
	pools, err := s.allPools(ctx)
	if err != nil {
		s.fail(w, r, "pools", err)
		return
	}
	p := s.base("Pools", "pools")
	p.Data, p.Live, p.Fragment = poolsData{pools}, s.prefix+"/sse/events", s.prefix+"/fragment/pools"
	s.render(w, "pools", p, frag)
}

type poolData struct {
	Pool    *v1.Pool
	ByState map[string][]*v1.Instance
	States  []string
	Chart   template.HTML
	Claims  []claim
}

func (s *Server) poolPage(w http.ResponseWriter, r *http.Request)     { s.poolView(w, r, false) }
func (s *Server) poolFragment(w http.ResponseWriter, r *http.Request) { s.poolView(w, r, true) }

func (s *Server) poolView(w http.ResponseWriter, r *http.Request, frag bool) {
	ctx, cancel := s.call(r)
	defer cancel()
	name := r.PathValue("name")
	pool, err := s.cfg.Client.GetPool(ctx, &v1.GetPoolRequest{Name: name})
	if err != nil {
		s.fail(w, r, "pool "+name, err)
		return
	}
	members, err := s.allInstances(ctx, &v1.ListInstancesRequest{Pool: pool.Name})
	if err != nil {
		s.fail(w, r, "members of pool "+name, err)
		return
	}
	now := s.cfg.Clock.Now()
	since := now.Add(-time.Hour)
	evs, err := s.eventsSince(ctx, &v1.ListEventsRequest{PoolId: pool.Id}, since, 5000)
	if err != nil {
		s.fail(w, r, "events of pool "+name, err)
		return
	}
	d := poolData{Pool: pool, ByState: map[string][]*v1.Instance{}, States: names(poolStates, poolStateName),
		Chart: countsSVG(poolHistory(pool.Counts, evs, since, now), since, now), Claims: claimHistory(evs, now)}
	for _, m := range members {
		if m.Status == v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
			continue
		}
		k := poolStateName(m.PoolState)
		d.ByState[k] = append(d.ByState[k], m)
	}
	p := s.base("Pool "+pool.Name, "pools")
	p.Data = d
	p.Live = s.prefix + "/sse/events?pool=" + url.QueryEscape(pool.Id)
	p.Fragment = s.prefix + "/pools/" + url.PathEscape(pool.Name) + "/fragment"
	s.render(w, "pool", p, frag)
}

type eventsData struct {
	Kind, Instance, Pool, Correlation, Severity string
	Events                                      []*v1.FleetEvent
	Next                                        string
	More                                        url.Values
	Query                                       string
}

func (s *Server) eventsPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := eventsData{Kind: q.Get("kind"), Instance: q.Get("instance"), Pool: q.Get("pool"),
		Correlation: q.Get("correlation"), Severity: q.Get("severity")}
	sev, err := parseSeverity(d.Severity)
	if err != nil {
		s.fail(w, r, "events", badInput{err})
		return
	}
	ctx, cancel := s.call(r)
	defer cancel()
	resp, err := s.cfg.Client.ListEvents(ctx, &v1.ListEventsRequest{Kind: d.Kind, InstanceId: d.Instance, PoolId: d.Pool,
		CorrelationId: d.Correlation, MinSeverity: sev, PageSize: 100, PageToken: q.Get("page")})
	if err != nil {
		s.fail(w, r, "events", err)
		return
	}
	d.Events, d.Next = resp.Events, resp.NextPageToken
	d.More = url.Values{}
	for k, v := range q {
		d.More[k] = v
	}
	d.More.Set("page", d.Next)
	live := url.Values{}
	for k, v := range map[string]string{"kind": d.Kind, "instance": d.Instance, "pool": d.Pool, "correlation": d.Correlation, "severity": d.Severity} {
		if v != "" {
			live.Set(k, v)
		}
	}
	p := s.base("Events", "events")
	// The events page appends rows itself rather than reloading a fragment.
	d.Query = live.Encode()
	p.Data, p.Live = d, s.prefix+"/sse/events?"+d.Query
	s.render(w, "events", p, false)
}

// presence says whether a replica holds the agent's stream (design §2.10),
// as tetherctl instance list does.
func presence(p *v1.AgentPresence, now time.Time) string {
	switch {
	case p == nil:
		return "never connected"
	case p.Connected:
		return "connected to replica " + p.Replica
	case p.LostAt != nil:
		return "lost " + ago(p.LostAt, now)
	}
	return "not connected"
}
