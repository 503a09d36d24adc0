package agent

import (
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/agent/enroll"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// connHolder owns the mTLS connection to the control plane. A TLS session
// keeps the certificate it was opened with, so after a renewal the holder
// dials a fresh connection for new calls and closes the old one once calls
// in flight have had time to finish (a download cut by the close resumes on
// the new connection).
type connHolder struct {
	mgr   *enroll.Manager
	grace time.Duration

	mu     sync.Mutex
	conn   *grpc.ClientConn
	client tetherv1.AgentServiceClient
	closed bool
}

func newConnHolder(mgr *enroll.Manager, grace time.Duration) (*connHolder, error) {
	h := &connHolder{mgr: mgr, grace: grace}
	return h, h.redial()
}

// Client returns a client on the current connection.
func (h *connHolder) Client() tetherv1.AgentServiceClient {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.client
}

func (h *connHolder) redial() error {
	conn, err := h.mgr.Dial(true)
	if err != nil {
		return err
	}
	h.mu.Lock()
	old := h.conn
	if h.closed {
		h.mu.Unlock()
		conn.Close()
		return nil
	}
	h.conn, h.client = conn, tetherv1.NewAgentServiceClient(conn)
	h.mu.Unlock()
	if old != nil {
		time.AfterFunc(h.grace, func() { old.Close() })
	}
	return nil
}

func (h *connHolder) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.conn != nil {
		h.conn.Close()
	}
}
