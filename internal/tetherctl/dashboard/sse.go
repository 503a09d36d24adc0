package dashboard

import (
	"encoding/json"
	"fmt"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

func httpCode(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.PermissionDenied, codes.Unauthenticated:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.InvalidArgument, codes.FailedPrecondition, codes.AlreadyExists, codes.ResourceExhausted, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unavailable, codes.DeadlineExceeded:
		return http.StatusServiceUnavailable
	default:
		return http.StatusBadGateway
	}
}

// sseStart readies an event stream. Errors after this point are sent as
// an "error" event, because the status line is already gone.
func sseStart(w http.ResponseWriter) (http.Flusher, bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return nil, false
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// A first comment tells the browser the stream is open.
	fmt.Fprint(w, ": open\n\n")
	f.Flush()
	return f, true
}

func sseSend(w http.ResponseWriter, f http.Flusher, event string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	f.Flush()
	return nil
}

// liveEvent is what a page gets for each fleet event.
type liveEvent struct {
	ID          string `json:"id"`
	Kind        string `json:"kind"`
	Severity    string `json:"severity"`
	Instance    string `json:"instance,omitempty"`
	Pool        string `json:"pool,omitempty"`
	Correlation string `json:"correlation,omitempty"`
	Message     string `json:"message"`
	At          string `json:"at"`
}

func toLive(e *v1.FleetEvent) liveEvent {
	return liveEvent{ID: e.Id, Kind: e.Kind, Severity: severityName(e.Severity), Instance: e.InstanceId, Pool: e.PoolId,
		Correlation: e.CorrelationId, Message: e.Message, At: when(e.CreatedAt)}
}

// sseEvents relays tetherd's event Watch stream, with the events page's filters.
func (s *Server) sseEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sev, err := parseSeverity(q.Get("severity"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	stream, err := s.cfg.Client.WatchEvents(r.Context(), &v1.WatchEventsRequest{Kind: q.Get("kind"), InstanceId: q.Get("instance"),
		PoolId: q.Get("pool"), CorrelationId: q.Get("correlation"), MinSeverity: sev})
	if err != nil {
		http.Error(w, "watch events: "+err.Error(), httpCode(status.Code(err)))
		return
	}
	f, ok := sseStart(w)
	if !ok {
		return
	}
	for {
		e, err := stream.Recv()
		if err != nil {
			if r.Context().Err() == nil {
				s.cfg.Log.Warn("dashboard: event watch ended", "err", err)
				_ = sseSend(w, f, "error", status.Convert(err).Message())
			}
			return
		}
		if err := sseSend(w, f, "fleet", toLive(e)); err != nil {
			return // the browser went away
		}
	}
}

// sseConsole follows an instance's console, starting from its last 16 KiB.
func (s *Server) sseConsole(w http.ResponseWriter, r *http.Request) {
	stream, err := s.cfg.Client.GetInstanceConsole(r.Context(), &v1.GetInstanceConsoleRequest{Id: r.PathValue("id"), Follow: true, TailBytes: 16 << 10})
	if err != nil {
		http.Error(w, "console: "+err.Error(), httpCode(status.Code(err)))
		return
	}
	f, ok := sseStart(w)
	if !ok {
		return
	}
	for {
		c, err := stream.Recv()
		if err != nil {
			if r.Context().Err() == nil {
				_ = sseSend(w, f, "error", status.Convert(err).Message())
			}
			return
		}
		if err := sseSend(w, f, "console", string(c.Data)); err != nil {
			return
		}
	}
}
