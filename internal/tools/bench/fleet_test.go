package bench_test

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent/session"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	"github.com/tetherfleet/tether/internal/tools/bench"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// A small fleet: every agent enrolls its own identity, opens its own
// connection from its loopback source address, and heartbeats; tetherd
// sees each stream from the address the agent was given.
func TestFleetConnectsEveryAgentFromItsSource(t *testing.T) {
	cp := testcp.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fleet := cp.SeedFleet(ctx, "edge")
	srcs := []net.IP{net.ParseIP("127.0.0.2"), net.ParseIP("127.0.0.3")}
	seen := make(chan string, 64)
	dial := func(src net.IP, cert *tls.Certificate) (*grpc.ClientConn, error) {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
		return grpc.NewClient(cp.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cp.TLS(cert))),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err == nil {
					seen <- c.LocalAddr().(*net.TCPAddr).IP.String()
				}
				return c, err
			}))
	}
	const n = 6
	ids, known, err := bench.OpenIdentities(filepath.Join(t.TempDir(), "ids.jsonl"))
	if err != nil || len(known) != 0 {
		t.Fatalf("identities: %d known, %v", len(known), err)
	}
	// progress hears of every stream accepted and heartbeat sent: the
	// waits below block on it instead of polling the counts.
	progress := make(chan struct{}, 1)
	tick := func() {
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	f := bench.StartFleet(ctx, bench.FleetOptions{Agents: n, Offset: 1, EnrollRate: 100, Heartbeat: 50 * time.Millisecond,
		Sources: srcs, Dial: dial, Admin: cp.Admin, Enroll: v1.NewEnrollmentServiceClient(cp.Dial(nil)), Node: fleet.Node, Save: ids.Save,
		Progress: tick})
	// Each agent sends a heartbeat on connecting and more on its schedule.
	for st := f.Stats(); f.Connected() < n || st.Sent < 3*n; st = f.Stats() {
		select {
		case <-progress:
		case <-ctx.Done():
			t.Fatalf("fleet never got going: %+v", st)
		}
	}
	lat, errs, first := f.PushProbe(ctx, 4)
	if len(lat) != 4 || errs != 0 {
		t.Fatalf("push probe: %d latencies, %d errors (first %v); want 4 tasks delivered", len(lat), errs, first)
	}
	f.Stop()
	st := f.Stats()
	if st.Enrolled != n || st.Errors != 0 || st.Connected != 0 {
		t.Fatalf("stats after stop %+v: want %d enrolled, no errors, none connected", st, n)
	}
	if c := connects(st.Timeline); c != n {
		t.Fatalf("timeline %v counts %d connects, want %d", st.Timeline, c, n)
	}
	if err := ids.Close(); err != nil {
		t.Fatal(err)
	}
	bySrc := map[string]int{}
	for len(seen) > 0 {
		bySrc[<-seen]++
	}
	if bySrc["127.0.0.2"] != n/2 || bySrc["127.0.0.3"] != n/2 {
		t.Fatalf("connections by source %v, want %d from each of 127.0.0.2 and 127.0.0.3", bySrc, n/2)
	}
	ins, err := cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: 100})
	if err != nil || len(ins.Instances) != n {
		t.Fatalf("instances %d, %v; want one enrolled identity per agent (%d)", len(ins.GetInstances()), err, n)
	}

	// A second run reuses the saved identities: no enrollment, no new
	// instance, every agent connected.
	ids, known, err = bench.OpenIdentities(ids.Path())
	if err != nil || len(known) != n {
		t.Fatalf("identities read back: %d, %v; want %d", len(known), err, n)
	}
	defer ids.Close()
	again := bench.StartFleet(ctx, bench.FleetOptions{Agents: n, EnrollRate: 100, Dial: dial, Admin: cp.Admin,
		Enroll: v1.NewEnrollmentServiceClient(cp.Dial(nil)), Node: fleet.Node, Known: known, Save: ids.Save, Progress: tick,
		MaxConnecting: 2})
	for again.Connected() < n {
		select {
		case <-progress:
		case <-ctx.Done():
			t.Fatalf("second run never connected: %+v", again.Stats())
		}
	}
	again.Stop()
	if st := again.Stats(); st.Reused != n || st.Enrolled != 0 || st.Errors != 0 {
		t.Fatalf("second run %+v: want %d reused identities, none enrolled, no errors", st, n)
	}
	if ins, err := cp.Admin.ListInstances(ctx, &v1.ListInstancesRequest{PageSize: 100}); err != nil || len(ins.Instances) != n {
		t.Fatalf("instances after the second run %d, %v; want still %d", len(ins.GetInstances()), err, n)
	}
}

func connects(tl []bench.Second) int {
	n := 0
	for _, s := range tl {
		n += s.Connects
	}
	return n
}

// flakyEnroll fails its first calls as a connection cut mid-call does.
type flakyEnroll struct {
	v1.EnrollmentServiceClient
	mu    sync.Mutex
	fails int
}

func (f *flakyEnroll) Enroll(ctx context.Context, in *v1.EnrollRequest, opts ...grpc.CallOption) (*v1.EnrollResponse, error) {
	f.mu.Lock()
	fail := f.fails > 0
	f.fails--
	f.mu.Unlock()
	if fail {
		return nil, status.Error(codes.Unavailable, "error reading from server: EOF")
	}
	return f.EnrollmentServiceClient.Enroll(ctx, in, opts...)
}

// An enrollment cut by the transport is retried, as the real agent
// retries it, and counted as a failed attempt: every agent still connects.
func TestFleetRetriesAnEnrollmentTheTransportCut(t *testing.T) {
	cp := testcp.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fleet := cp.SeedFleet(ctx, "edge")
	dial := func(_ net.IP, cert *tls.Certificate) (*grpc.ClientConn, error) {
		return grpc.NewClient(cp.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cp.TLS(cert))))
	}
	progress := make(chan struct{}, 1)
	const n = 3
	f := bench.StartFleet(ctx, bench.FleetOptions{Agents: n, EnrollRate: 100, Dial: dial, Admin: cp.Admin, Node: fleet.Node,
		Enroll:  &flakyEnroll{EnrollmentServiceClient: v1.NewEnrollmentServiceClient(cp.Dial(nil)), fails: 2},
		Backoff: session.Backoff{Base: time.Millisecond, Cap: time.Millisecond},
		Progress: func() {
			select {
			case progress <- struct{}{}:
			default:
			}
		}})
	for f.Connected() < n {
		select {
		case <-progress:
		case <-ctx.Done():
			t.Fatalf("fleet never connected: %+v", f.Stats())
		}
	}
	f.Stop()
	if st := f.Stats(); st.Enrolled != n || st.Errors != 2 {
		t.Fatalf("stats %+v: want %d enrolled and the 2 cut attempts counted", st, n)
	}
}
