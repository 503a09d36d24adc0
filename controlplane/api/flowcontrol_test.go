package api_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// serverFrame is what the client read of one frame the server sent.
type serverFrame struct {
	typ      http2.FrameType
	flags    http2.Flags
	stream   uint32
	settings map[http2.SettingID]uint32 // SETTINGS (not ACK)
	incr     uint32                     // WINDOW_UPDATE
}

func (f serverFrame) String() string {
	if f.typ == http2.FrameWindowUpdate {
		return fmt.Sprintf("%v stream %d +%d", f.typ, f.stream, f.incr)
	}
	return fmt.Sprintf("%v stream %d flags %#x", f.typ, f.stream, uint8(f.flags))
}

// frameLog parses the plaintext the server sends on one connection.
type frameLog struct {
	mu      sync.Mutex
	frames  []serverFrame
	err     error // why parsing stopped
	changed chan struct{}
}

func (l *frameLog) add(f serverFrame, err error) {
	l.mu.Lock()
	if err != nil {
		l.err = err
	} else {
		l.frames = append(l.frames, f)
	}
	l.mu.Unlock()
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// parse reads frames until r ends. The server-to-client direction has no
// preface: the first frame is the server's SETTINGS.
func (l *frameLog) parse(r io.Reader) {
	fr := http2.NewFramer(io.Discard, r)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			l.add(serverFrame{}, err)
			io.Copy(io.Discard, r) // keep the connection's reads flowing
			return
		}
		h := f.Header()
		sf := serverFrame{typ: h.Type, flags: h.Flags, stream: h.StreamID}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				sf.settings = map[http2.SettingID]uint32{}
				f.ForeachSetting(func(s http2.Setting) error { sf.settings[s.ID] = s.Val; return nil })
			}
		case *http2.WindowUpdateFrame:
			sf.incr = f.Increment
		}
		l.add(sf, nil)
	}
}

// waitFor returns the frames once one satisfies done.
func (l *frameLog) waitFor(ctx context.Context, t *testing.T, done func(serverFrame) bool) []serverFrame {
	t.Helper()
	for {
		l.mu.Lock()
		frames, err := append([]serverFrame(nil), l.frames...), l.err
		l.mu.Unlock()
		for _, f := range frames {
			if done(f) {
				return frames
			}
		}
		if err != nil {
			t.Fatalf("parsing the server's frames stopped: %v (frames %v)", err, frames)
		}
		select {
		case <-l.changed:
		case <-ctx.Done():
			t.Fatalf("%v (frames %v)", ctx.Err(), frames)
		}
	}
}

// teeCreds is TLS whose connections copy the plaintext they read into w.
type teeCreds struct {
	credentials.TransportCredentials
	w *io.PipeWriter
}

func (c teeCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	return teeConn{Conn: conn, w: c.w}, info, nil
}

func (c teeCreds) Clone() credentials.TransportCredentials {
	return teeCreds{TransportCredentials: c.TransportCredentials.Clone(), w: c.w}
}

type teeConn struct {
	net.Conn
	w *io.PipeWriter
}

func (c teeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.w.Write(p[:n])
	}
	if err != nil {
		c.w.CloseWithError(err)
	}
	return n, err
}

// The server's fixed flow-control windows keep gRPC's bandwidth-delay
// estimator off: with it on, a DATA frame the server reads while none of
// its pings is out (every heartbeat on a quiet agent connection) is
// answered with a WINDOW_UPDATE and a PING. Heartbeats must cost the
// server no frame at all.
func TestHeartbeatsAreAnsweredWithNoFrames(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "fc")
	_, cert := enrolled(t, cp, fleet.Node)

	pr, pw := io.Pipe()
	log := &frameLog{changed: make(chan struct{}, 1)}
	go log.parse(pr)
	// The client's own estimator is off too, so the server sends no PING
	// acks either: every frame it sends is its own or an answer to a call.
	conn := cp.Dial(&cert, grpc.WithTransportCredentials(teeCreds{TransportCredentials: credentials.NewTLS(cp.TLS(&cert)), w: pw}),
		grpc.WithStaticStreamWindowSize(1<<20), grpc.WithStaticConnWindowSize(1<<20))
	agent := v1.NewAgentServiceClient(conn)
	s, err := agent.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetSettings() == nil {
		t.Fatalf("first message %v, %v; want settings", m, err)
	}
	for i := range 5 {
		if err := s.Send(&v1.AgentMessage{Msg: &v1.AgentMessage_Heartbeat{Heartbeat: &v1.Heartbeat{
			Phase: v1.AgentPhase_AGENT_PHASE_READY, UptimeSeconds: int64(i), AgentVersion: "v1", Addresses: []string{"10.0.2.15"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	// What orders this after the heartbeats: the client writes its frames
	// in the order they were sent, the server reads a connection's frames
	// in order on one goroutine and queues a PING (and its WINDOW_UPDATE)
	// for its writer before it reads the next frame, and the writer sends
	// control frames in the order queued. So any frame answering a
	// heartbeat is on the wire before this call's answer, which ends its
	// stream: the only stream that ends in this test.
	if _, err := agent.GetAssignment(ctx, &v1.GetAssignmentRequest{}); err != nil {
		t.Fatal(err)
	}
	frames := log.waitFor(ctx, t, func(f serverFrame) bool {
		return (f.typ == http2.FrameHeaders && f.flags.Has(http2.FlagHeadersEndStream)) ||
			(f.typ == http2.FrameData && f.flags.Has(http2.FlagDataEndStream))
	})

	var windowUpdates []serverFrame
	for _, f := range frames {
		switch f.typ {
		case http2.FrameSettings, http2.FrameHeaders, http2.FrameData:
		case http2.FrameWindowUpdate:
			windowUpdates = append(windowUpdates, f)
		default:
			// PING above all: keepalive pings are 2 minutes apart, so a
			// PING here is the estimator's.
			t.Errorf("the server sent %v", f)
		}
	}
	// The windows: 1 MiB announced for streams, and the connection's raised
	// from HTTP/2's 64 KiB to 1 MiB once, at the start. Five heartbeats are
	// far below the quarter window that would call for another update.
	if f := frames[0]; f.typ != http2.FrameSettings || f.settings == nil || f.settings[http2.SettingInitialWindowSize] != 1<<20 {
		t.Errorf("first frame %v settings %v; want SETTINGS with INITIAL_WINDOW_SIZE 1 MiB", f, f.settings)
	}
	if len(windowUpdates) != 1 || windowUpdates[0].stream != 0 || windowUpdates[0].incr != 1<<20-65535 {
		t.Errorf("window updates %v; want one raising the connection's window to 1 MiB", windowUpdates)
	}
	if t.Failed() {
		t.Logf("all frames: %v", frames)
	}
}
