package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// SimAgent is a simulated agent: an enrolled identity and one Connect
// stream, as a real agent holds.
type SimAgent struct {
	InstanceID string
	Cert       tls.Certificate
	conn       *grpc.ClientConn
	stream     v1.AgentService_ConnectClient
	sendMu     sync.Mutex
	online     atomic.Bool
	// spread is the reconnection window from the last Settings, in ns
	// (written by the stream's receiver, read by the run loop).
	spread atomic.Int64
}

// EnrollAgents provisions and enrolls n external instances of node.
func EnrollAgents(ctx context.Context, admin v1.AdminServiceClient, enroll v1.EnrollmentServiceClient, node string, n int) ([]*SimAgent, error) {
	out := make([]*SimAgent, n)
	var next atomic.Int64
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				a, err := enrollOne(ctx, admin, enroll, node, nil)
				if err != nil {
					select {
					case errs <- fmt.Errorf("agent %d: %w", i, err):
					default:
					}
					return
				}
				out[i] = a
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
		return out, nil
	}
}

// enrollOne provisions an instance and enrolls it; retry (nil: never)
// says whether to send the same enrollment again after a refusal.
func enrollOne(ctx context.Context, admin v1.AdminServiceClient, enroll v1.EnrollmentServiceClient, node string,
	retry func(attempt int, err error) bool) (*SimAgent, error) {
	resp, err := admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: node, Provider: "external"})
	if err != nil {
		return nil, err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, err
	}
	req := &v1.EnrollRequest{Token: resp.BootstrapToken,
		CsrPem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))}
	er, err := enroll.Enroll(ctx, req)
	for attempt := 0; err != nil && retry != nil && retry(attempt, err); attempt++ {
		er, err = enroll.Enroll(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode([]byte(er.CertificatePem))
	return &SimAgent{InstanceID: er.InstanceId, Cert: tls.Certificate{Certificate: [][]byte{block.Bytes}, PrivateKey: key}}, nil
}

// Connect opens the agent's stream on its own connection and sends the
// first (ready) heartbeat. onMsg sees every control message.
func (a *SimAgent) Connect(ctx context.Context, dial func(*tls.Certificate) (*grpc.ClientConn, error), onMsg func(*SimAgent, *v1.ControlMessage)) error {
	conn, err := dial(&a.Cert)
	if err != nil {
		return err
	}
	s, err := v1.NewAgentServiceClient(conn).Connect(ctx)
	if err != nil {
		conn.Close()
		return err
	}
	a.conn, a.stream = conn, s
	if err := a.Heartbeat(v1.AgentPhase_AGENT_PHASE_READY); err != nil {
		return err
	}
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				return
			}
			if onMsg != nil {
				onMsg(a, m)
			}
		}
	}()
	return nil
}

// Heartbeat sends one heartbeat.
func (a *SimAgent) Heartbeat(phase v1.AgentPhase) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
		Phase: phase, AgentVersion: "bench", BootId: "bench"}}})
}

// Finish reports a task done (so its lease does not lapse during a run).
func (a *SimAgent) Finish(taskID string) error {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	return a.stream.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_TaskUpdate{TaskUpdate: &v1.TaskUpdate{
		TaskId: taskID, Status: v1.TaskStatus_TASK_STATUS_SUCCEEDED, Result: &v1.TaskResult{}}}})
}

// Close ends the stream and the connection.
func (a *SimAgent) Close() {
	if a.stream != nil {
		_ = a.stream.CloseSend()
	}
	if a.conn != nil {
		a.conn.Close()
	}
}

// PushLatency creates n exec tasks, spread over the agents, one at a time,
// and measures from just before CreateTask to the assignment arriving on
// the agent's stream.
func PushLatency(ctx context.Context, admin v1.AdminServiceClient, agents []*SimAgent, arrived map[string]chan time.Time, n int) (Result, error) {
	lat := make([]time.Duration, 0, n)
	failed := make([]error, 0)
	start := time.Now()
	for i := 0; i < n; i++ {
		a := agents[i%len(agents)]
		t0 := time.Now()
		_, err := admin.CreateTask(ctx, &v1.CreateTaskRequest{InstanceId: a.InstanceID, Kind: v1.TaskKind_TASK_KIND_EXEC,
			Exec: &v1.ExecPayload{Argv: []string{"true"}}})
		if err != nil {
			failed = append(failed, err)
			continue
		}
		select {
		case t1 := <-arrived[a.InstanceID]:
			lat = append(lat, t1.Sub(t0))
		case <-time.After(10 * time.Second):
			failed = append(failed, fmt.Errorf("task for %s never arrived", a.InstanceID))
		}
	}
	r := Result{N: n, Errors: len(failed), Elapsed: time.Since(start), P50: Percentile(lat, 0.5), P99: Percentile(lat, 0.99)}
	if len(failed) > 0 {
		r.FirstError = failed[0]
	}
	return r, nil
}
