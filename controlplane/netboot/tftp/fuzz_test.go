package tftp

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/internal/guard"
)

// recorder is a socket that keeps what is sent.
type recorder struct {
	mu   sync.Mutex
	sent [][]byte
}

func (r *recorder) WriteToUDPAddrPort(b []byte, _ netip.AddrPort) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = append(r.sent, append([]byte(nil), b...))
	return len(b), nil
}

// FuzzTFTPDatagram sends a fuzzed datagram, then the same bytes again (as
// if the peer continued its transfer with them), through the server's own
// entry point for every datagram it reads. Whatever arrives: no panic,
// not even a recovered one; nothing sent larger than a negotiated block;
// at most the first packet and one resend to a peer that acknowledged
// nothing; and no transfer left behind.
func FuzzTFTPDatagram(f *testing.F) {
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "undionly.kpxe"), make([]byte, 3000), 0o644); err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{
		{0, 1}, {0, 2}, {0, 1, 0}, {0, 4, 0, 0}, {0, 5, 0, 0, 0},
		[]byte("\x00\x01undionly.kpxe\x00octet\x00"),
		[]byte("\x00\x01undionly.kpxe\x00octet\x00blksize\x007\x00"),
		[]byte("\x00\x01undionly.kpxe\x00octet\x00blksize\x0065464\x00tsize\x000\x00"),
		[]byte("\x00\x02undionly.kpxe\x00octet\x00"),
		[]byte("\x00\x01../etc/passwd\x00netascii\x00"),
	} {
		f.Add(seed)
	}
	panics := guard.New(prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	peer := netip.MustParseAddrPort("192.0.2.1:2000")
	f.Fuzz(func(t *testing.T, d []byte) {
		s := &Server{Loaders: Loaders{Dir: dir}, Panics: panics, Timeout: time.Millisecond}
		s.defaults()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		conn := &recorder{}
		s.datagram(ctx, conn, peer, d, &wg)
		s.datagram(ctx, conn, peer, d, &wg)
		wg.Wait() // the peer never acknowledges: the transfer ends on its own
		cancel()
		if n := testutil.ToFloat64(panics.Count.WithLabelValues("tftp")); n != 0 {
			t.Fatalf("%q: a panic was recovered", d)
		}
		if s.Transfers() != 0 {
			t.Fatalf("%q: a transfer outlived its peer's silence", d)
		}
		if len(conn.sent) > 2+unansweredRetries {
			t.Fatalf("%q: %d packets sent to a peer that acknowledged nothing", d, len(conn.sent))
		}
		for _, p := range conn.sent {
			if len(p) > 4+DefaultBlockSize {
				t.Fatalf("%q: a %d-byte packet to a peer that acknowledged nothing", d, len(p))
			}
		}
	})
}
