package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// An action is one button: what it asks, what it needs, and the call.
type action struct {
	Verb    string
	Needs   string // the least role; tetherd checks again
	Reason  bool   // the form asks for a reason
	Extra   string // another input: "target" for resize, "by"/"for" for acquire
	Danger  bool
	Explain string
}

var instanceActionSet = map[string]action{
	"stop":      {Verb: "stop", Needs: "operator", Explain: "The machine is shut down; the instance stays."},
	"start":     {Verb: "start", Needs: "operator", Explain: "The machine boots again with a fresh one-time token."},
	"reboot":    {Verb: "reboot", Needs: "operator", Explain: "The machine restarts with a fresh one-time token."},
	"terminate": {Verb: "terminate", Needs: "operator", Danger: true, Explain: "The machine is destroyed, its certificates revoked. This cannot be undone."},
	"hold":      {Verb: "hold", Needs: "operator", Reason: true, Explain: "A hold refuses start, reboot and terminate until it is lifted."},
	"unhold":    {Verb: "unhold", Needs: "operator", Explain: "Lift the operations hold."},
	"cordon":    {Verb: "cordon", Needs: "operator", Reason: true, Explain: "Mark the instance unschedulable; a ready pool member is fenced."},
	"uncordon":  {Verb: "uncordon", Needs: "operator", Explain: "Clear the cordon marker."},
}

var poolActionSet = map[string]action{
	"acquire":  {Verb: "acquire", Needs: "operator", Extra: "claim", Explain: "Claim the oldest ready member."},
	"release":  {Verb: "release", Needs: "operator", Extra: "instance", Explain: "Return a claimed member; by default it is recycled."},
	"drain":    {Verb: "drain", Needs: "operator", Danger: true, Explain: "Stop replenishing and terminate every ready member; claimed members run out their work."},
	"pause":    {Verb: "pause", Needs: "operator", Explain: "Stop replenishment and acquisition; members are kept."},
	"activate": {Verb: "activate", Needs: "operator", Explain: "Resume replenishment and acquisition."},
	"resize":   {Verb: "resize", Needs: "operator", Extra: "target", Explain: "Set the pool's target size."},
}

type confirmData struct {
	Kind, Target, Action string
	A                    action
	Post                 string
	Default              string
}

type resultData struct {
	Kind, Target, Action string
	OK                   bool
	Code                 string
	Message              string
	Body                 string
	Back                 string
}

func (s *Server) confirmInstanceAction(w http.ResponseWriter, r *http.Request) {
	s.confirm(w, r, "instance", r.PathValue("id"), instanceActionSet, "/instances/")
}

func (s *Server) confirmPoolAction(w http.ResponseWriter, r *http.Request) {
	s.confirm(w, r, "pool", r.PathValue("name"), poolActionSet, "/pools/")
}

func (s *Server) confirm(w http.ResponseWriter, r *http.Request, kind, target string, set map[string]action, base string) {
	name := r.URL.Query().Get("action")
	a, ok := set[name]
	if !ok {
		s.fail(w, r, kind+" "+target, badInput{fmt.Errorf("unknown action %q", name)})
		return
	}
	if !s.can(a.Needs) {
		s.forbidden(w, r, a)
		return
	}
	p := s.base("Confirm "+name, "")
	p.Data = confirmData{Kind: kind, Target: target, Action: name, A: a,
		Post: s.prefix + base + url.PathEscape(target) + "/" + name, Default: r.URL.Query().Get("value")}
	s.render(w, "confirm", p, false)
}

// forbidden answers an action the caller's role cannot take. The page
// offered no button for it, so this is a forged or stale request.
func (s *Server) forbidden(w http.ResponseWriter, r *http.Request, a action) {
	w.WriteHeader(http.StatusForbidden)
	p := s.base("Forbidden", "")
	p.Data = struct{ What, Msg string }{a.Verb, fmt.Sprintf("%s needs role %s; identity %s has role %s", a.Verb, a.Needs, s.cfg.Identity, s.cfg.Role)}
	s.render(w, "error", p, false)
}

func (s *Server) instanceAction(w http.ResponseWriter, r *http.Request) {
	id, name := r.PathValue("id"), r.PathValue("action")
	a, ok := instanceActionSet[name]
	if !ok {
		s.fail(w, r, "instance "+id, badInput{fmt.Errorf("unknown action %q", name)})
		return
	}
	if !s.can(a.Needs) {
		s.forbidden(w, r, a)
		return
	}
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, "instance "+id, badInput{err})
		return
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	c := s.cfg.Client
	ctx, cancel := s.call(r)
	defer cancel()
	act := map[string]func(context.Context) (proto.Message, error){
		"stop": func(ctx context.Context) (proto.Message, error) {
			return c.StopInstance(ctx, &v1.InstanceActionRequest{Id: id})
		},
		"start": func(ctx context.Context) (proto.Message, error) {
			return c.StartInstance(ctx, &v1.InstanceActionRequest{Id: id})
		},
		"reboot": func(ctx context.Context) (proto.Message, error) {
			return c.RebootInstance(ctx, &v1.InstanceActionRequest{Id: id})
		},
		"terminate": func(ctx context.Context) (proto.Message, error) {
			return c.TerminateInstance(ctx, &v1.InstanceActionRequest{Id: id})
		},
		"unhold": func(ctx context.Context) (proto.Message, error) {
			return c.UnholdInstance(ctx, &v1.InstanceActionRequest{Id: id})
		},
		"uncordon": func(ctx context.Context) (proto.Message, error) {
			return c.UncordonInstance(ctx, &v1.InstanceActionRequest{Id: id})
		},
		"hold": func(ctx context.Context) (proto.Message, error) {
			return c.HoldInstance(ctx, &v1.HoldInstanceRequest{Id: id, Reason: reason})
		},
		"cordon": func(ctx context.Context) (proto.Message, error) {
			return c.CordonInstance(ctx, &v1.CordonInstanceRequest{Id: id, Reason: reason})
		},
	}[name]
	resp, err := act(ctx)
	s.result(w, "instance", id, name, resp, err, s.prefix+"/instances/"+url.PathEscape(id))
}

func (s *Server) poolAction(w http.ResponseWriter, r *http.Request) {
	pool, name := r.PathValue("name"), r.PathValue("action")
	a, ok := poolActionSet[name]
	if !ok {
		s.fail(w, r, "pool "+pool, badInput{fmt.Errorf("unknown action %q", name)})
		return
	}
	if !s.can(a.Needs) {
		s.forbidden(w, r, a)
		return
	}
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, "pool "+pool, badInput{err})
		return
	}
	f := r.PostForm
	c := s.cfg.Client
	ctx, cancel := s.call(r)
	defer cancel()
	var resp proto.Message
	var err error
	switch name {
	case "acquire":
		resp, err = c.AcquirePoolMember(ctx, &v1.AcquirePoolMemberRequest{PoolName: pool,
			AcquiredBy: strings.TrimSpace(f.Get("by")), AcquiredFor: strings.TrimSpace(f.Get("for"))})
	case "release":
		resp, err = c.ReleasePoolMember(ctx, &v1.ReleasePoolMemberRequest{InstanceId: strings.TrimSpace(f.Get("instance"))})
	case "drain":
		resp, err = c.DrainPool(ctx, &v1.PoolActionRequest{Name: pool})
	case "pause":
		resp, err = c.PausePool(ctx, &v1.PoolActionRequest{Name: pool})
	case "activate":
		resp, err = c.ActivatePool(ctx, &v1.PoolActionRequest{Name: pool})
	case "resize":
		n, perr := strconv.Atoi(strings.TrimSpace(f.Get("target")))
		if perr != nil || n < 0 {
			s.fail(w, r, "pool "+pool, badInput{fmt.Errorf("target %q: want a whole number, 0 or more", f.Get("target"))})
			return
		}
		resp, err = c.UpdatePool(ctx, &v1.UpdatePoolRequest{Name: pool, UpdateMask: []string{"target_size"}, TargetSize: int32(n)})
	}
	s.result(w, "pool", pool, name, resp, err, s.prefix+"/pools/"+url.PathEscape(pool))
}

var resultJSON = protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}

// result shows tetherd's answer word for word: the code and message of a
// refusal, or the response it returned.
func (s *Server) result(w http.ResponseWriter, kind, target, act string, resp proto.Message, err error, back string) {
	d := resultData{Kind: kind, Target: target, Action: act, Back: back, OK: err == nil, Code: "OK"}
	if err != nil {
		st := status.Convert(err)
		d.Code, d.Message = st.Code().String(), st.Message()
		w.WriteHeader(httpCode(st.Code()))
	} else if resp != nil {
		b, merr := resultJSON.Marshal(resp)
		if merr != nil {
			d.Body = "(response could not be shown: " + merr.Error() + ")"
		} else {
			d.Body = string(b)
		}
	}
	p := s.base(kind+" "+act, "")
	p.Data = d
	s.render(w, "result", p, false)
}

func (s *Server) newTaskPage(w http.ResponseWriter, r *http.Request) {
	if !s.can("operator") {
		s.forbidden(w, r, action{Verb: "create task", Needs: "operator"})
		return
	}
	p := s.base("New task", "")
	p.Data = struct{ Instance string }{r.URL.Query().Get("instance")}
	s.render(w, "task_new", p, false)
}

func (s *Server) createTask(w http.ResponseWriter, r *http.Request) {
	if !s.can("operator") {
		s.forbidden(w, r, action{Verb: "create task", Needs: "operator"})
		return
	}
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, "task", badInput{err})
		return
	}
	inst := strings.TrimSpace(r.PostForm.Get("instance"))
	argv := strings.Fields(r.PostForm.Get("argv"))
	if len(argv) == 0 {
		s.fail(w, r, "task", badInput{fmt.Errorf("command: give the program and its arguments, separated by spaces")})
		return
	}
	timeout := 0
	if t := strings.TrimSpace(r.PostForm.Get("timeout")); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 {
			s.fail(w, r, "task", badInput{fmt.Errorf("timeout %q: want a duration such as 30s", t)})
			return
		}
		timeout = int(d / time.Second)
	}
	ctx, cancel := s.call(r)
	defer cancel()
	task, err := s.cfg.Client.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: inst, Kind: v1.TaskKind_TASK_KIND_EXEC,
		Exec: &v1.ExecPayload{Argv: argv, TimeoutSeconds: int32(timeout)}})
	if err != nil {
		s.result(w, "task", inst, "create", nil, err, s.prefix+"/instances/"+url.PathEscape(inst))
		return
	}
	http.Redirect(w, r, s.prefix+"/tasks/"+url.PathEscape(task.Id), http.StatusSeeOther)
}

func (s *Server) taskPage(w http.ResponseWriter, r *http.Request)     { s.taskView(w, r, false) }
func (s *Server) taskFragment(w http.ResponseWriter, r *http.Request) { s.taskView(w, r, true) }

func (s *Server) taskView(w http.ResponseWriter, r *http.Request, frag bool) {
	ctx, cancel := s.call(r)
	defer cancel()
	t, err := s.cfg.Client.GetTask(ctx, &v1.GetTaskRequest{Id: r.PathValue("id")})
	if err != nil {
		s.fail(w, r, "task "+r.PathValue("id"), err)
		return
	}
	p := s.base("Task "+t.Id, "")
	p.Data = t
	done := slices.Contains([]v1.TaskStatus{v1.TaskStatus_TASK_STATUS_SUCCEEDED, v1.TaskStatus_TASK_STATUS_FAILED,
		v1.TaskStatus_TASK_STATUS_CANCELLED}, t.Status)
	if !done {
		// Task progress is not in the event log, so a running task's page
		// asks again on a short timer (see app.js) instead of an SSE feed.
		p.Live = "poll"
	}
	p.Fragment = s.prefix + "/tasks/" + url.PathEscape(t.Id) + "/fragment"
	s.render(w, "task", p, frag)
}
