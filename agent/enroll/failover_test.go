package enroll

import (
	"context"
	mrand "math/rand/v2"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	"github.com/tetherfleet/tether/pki"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// liveAddr is a loopback port that accepts connections and holds them
// until the test ends.
func liveAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return l.Addr().String()
}

// deadAddr is a loopback port nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// refuser accepts connections and closes them at once, as a control plane
// past its connection budget does.
func refuser(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted = &atomic.Int64{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), accepted
}

func TestSplitURLs(t *testing.T) {
	tests := []struct {
		in      string
		want    []Endpoint
		wantErr string
	}{
		{"https://cp:7443", []Endpoint{{"cp:7443", "cp"}}, ""},
		{"https://a:1,https://b", []Endpoint{{"a:1", "a"}, {"b:443", "b"}}, ""},
		{"https://a:1, https://10.0.0.2:2", []Endpoint{{"a:1", "a"}, {"10.0.0.2:2", "10.0.0.2"}}, ""},
		{"https://a:1,http://b:2", nil, `"http://b:2"`},
		{"https://a:1,", nil, `""`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := SplitURLs(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("%v, %v; want %v", got, err, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("endpoint %d = %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// The dialer skips a control plane that is down, pausing (the jitter)
// before the next, starts the next dial with the one that answered, and
// when none answers names every one in its error.
func TestFailoverDialOrder(t *testing.T) {
	dead, live := deadAddr(t), liveAddr(t)
	var pauses atomic.Int64
	f := &Failover{Endpoints: []Endpoint{{dead, "127.0.0.1"}, {live, "127.0.0.1"}},
		Pause: func() time.Duration { pauses.Add(1); return 0 }}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	c, err := f.DialContext(ctx, "ignored")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if ec := c.(*endpointConn); ec.ep.Target != live || pauses.Load() != 1 {
		t.Fatalf("reached %s after %d pauses, want %s after 1", ec.ep.Target, pauses.Load(), live)
	}
	c, err = f.DialContext(ctx, "ignored")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if pauses.Load() != 1 {
		t.Fatalf("the second dial paused (%d pauses in all): it should start with the control plane that answered", pauses.Load())
	}

	down := &Failover{Endpoints: []Endpoint{{deadAddr(t), "a"}, {deadAddr(t), "b"}}, Pause: func() time.Duration { return 0 }}
	_, err = down.DialContext(ctx, "ignored")
	for _, ep := range down.Endpoints {
		if err == nil || !strings.Contains(err.Error(), ep.Target) {
			t.Fatalf("error %v does not name %s", err, ep.Target)
		}
	}
}

// An agent given three control planes, the first down and the second
// refusing connections at accept time, enrolls with the third, checking
// that one's name on its certificate.
func TestManagerMovesToTheNextControlPlane(t *testing.T) {
	ca := enrolltest.NewCA(t, "tether test CA")
	good := enrolltest.Start(t, ca, enrolltest.WithServerNames("localhost"))
	refusing, accepted := refuser(t)
	_, port, _ := net.SplitHostPort(good.Addr)
	// The good one is reached as localhost: its certificate names only that.
	urls := "https://" + deadAddr(t) + ",https://" + refusing + ",https://localhost:" + port
	logs := newLogs()
	m, err := New(Config{StateDir: t.TempDir(), URL: urls, CAFingerprint: pki.Fingerprint(ca.Cert.Raw), Logf: logs.Logf,
		Delay: func(int) time.Duration { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	if m.failover == nil {
		t.Fatal("three URLs, yet no failover")
	}
	m.failover.Pause = func() time.Duration { return 0 }
	m.failover.Shuffle = func(int, func(i, j int)) {} // the refusing one second, as listed
	token := good.AddToken("i-failover")
	conn, err := m.Dial(false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// WaitForReady: the call waits while gRPC reconnects through the
	// dialer, as the agent's own retries would.
	id, err := m.Enroll(ctx, waitingClient{tetherv1.NewEnrollmentServiceClient(conn)}, token)
	if err != nil {
		t.Fatalf("never enrolled through the third control plane: %v\nlogs: %v", err, logs.lines)
	}
	if id.InstanceID != "i-failover" || accepted.Load() == 0 {
		t.Fatalf("enrolled as %q; the refusing control plane saw %d connections", id.InstanceID, accepted.Load())
	}
	logs.waitFor(t, "refused the connection")
}

type waitingClient struct {
	tetherv1.EnrollmentServiceClient
}

func (w waitingClient) Enroll(ctx context.Context, in *tetherv1.EnrollRequest, opts ...grpc.CallOption) (*tetherv1.EnrollResponse, error) {
	return w.EnrollmentServiceClient.Enroll(ctx, in, append(opts, grpc.WaitForReady(true))...)
}

// The pause between control planes is timed by the injected clock: the
// dial to the second one waits until the clock has moved by the pause.
func TestFailoverPauseUsesTheClock(t *testing.T) {
	clk := newFakeClock(time.Now())
	const pause = 700 * time.Millisecond
	f := &Failover{Endpoints: []Endpoint{{deadAddr(t), "127.0.0.1"}, {liveAddr(t), "127.0.0.1"}},
		Pause: func() time.Duration { return pause }, Clock: clk}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dialled := make(chan error, 1)
	go func() {
		c, err := f.DialContext(ctx, "ignored")
		if err == nil {
			c.Close()
		}
		dialled <- err
	}()
	if d := clk.nextWait(t); d != pause {
		t.Fatalf("the failover waits %v, want its pause %v", d, pause)
	}
	select {
	case err := <-dialled:
		t.Fatalf("dialled the next control plane before the pause passed (err %v)", err)
	default:
	}
	clk.Advance(pause)
	if err := <-dialled; err != nil {
		t.Fatal(err)
	}
}

// Every agent walks the endpoints from the first given, then the others in
// an order of its own: the agents of a replica that went away spread over
// the rest instead of landing on the one listed after it.
func TestFailoverOrderSpreadsTheAgents(t *testing.T) {
	eps := []Endpoint{{"a:1", "a"}, {"b:1", "b"}, {"c:1", "c"}, {"d:1", "d"}}
	const agents = 3000
	second := map[int]int{}
	for i := 0; i < agents; i++ {
		r := mrand.New(mrand.NewPCG(uint64(i), 1))
		f := &Failover{Endpoints: eps, Shuffle: r.Shuffle}
		order := f.order()
		if order[0] != 0 {
			t.Fatalf("agent %d starts on endpoint %d, want the first given", i, order[0])
		}
		seen := map[int]bool{}
		for _, k := range order {
			seen[k] = true
		}
		if len(seen) != len(eps) {
			t.Fatalf("agent %d walks %v: not every endpoint once", i, order)
		}
		second[order[1]]++
	}
	for k := 1; k < len(eps); k++ {
		if share := float64(second[k]) / agents; share < 0.28 || share > 0.39 {
			t.Errorf("endpoint %d is next after the first for %.2f of the agents, want about 1/3", k, share)
		}
	}
}
