package tftp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/guard"
)

// Defaults of the server's bounds (docs/reliability.md, "Listener limits").
const (
	// DefaultMaxTransfers is the transfers served at once: each holds a
	// loader file open, so this is TFTP's share of the descriptor budget.
	DefaultMaxTransfers = 64
	// DefaultMaxPerSource is the transfers one address may hold at once.
	DefaultMaxPerSource = 8
	// DefaultTimeout is how long a sent block waits for its ACK.
	DefaultTimeout = time.Second
	// DefaultRetries is how often a block is resent to a peer that has
	// acknowledged an earlier one (a lossy link).
	DefaultRetries = 5
	// DefaultMaxTransferTime ends a transfer that a peer drags out by
	// acknowledging each block just before its timeout.
	DefaultMaxTransferTime = 2 * time.Minute
)

// unansweredRetries is how often the first packet of a transfer is resent
// to a peer that has acknowledged nothing: once. A request's source
// address can be forged, and every resend to it is traffic towards
// someone who never asked (issue 26: three 65 KB blocks for a 40-byte
// request).
const unansweredRetries = 1

// Server is a read-only TFTP server of the loaders, on one UDP port for
// every transfer.
type Server struct {
	Loaders Loaders
	Log     *slog.Logger
	// Clock times resends and transfer deadlines (nil: the real clock).
	Clock clock.Clock
	// Panics records a panic in a datagram's handling or a transfer,
	// which then ends alone (nil: recovered, not counted).
	Panics *guard.Panics
	// Bounds; zero means the Default* above.
	MaxTransfers, MaxPerSource int
	Timeout                    time.Duration
	Retries                    int
	MaxTransferTime            time.Duration

	mu        sync.Mutex
	transfers map[netip.AddrPort]chan []byte
	perSource map[netip.Addr]int
}

func (s *Server) defaults() {
	if s.Clock == nil {
		s.Clock = clock.Real{}
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if s.MaxTransfers <= 0 {
		s.MaxTransfers = DefaultMaxTransfers
	}
	if s.MaxPerSource <= 0 {
		s.MaxPerSource = DefaultMaxPerSource
	}
	if s.Timeout <= 0 {
		s.Timeout = DefaultTimeout
	}
	if s.Retries <= 0 {
		s.Retries = DefaultRetries
	}
	if s.MaxTransferTime <= 0 {
		s.MaxTransferTime = DefaultMaxTransferTime
	}
	s.transfers = map[netip.AddrPort]chan []byte{}
	s.perSource = map[netip.Addr]int{}
}

// Serve serves on conn until ctx ends, then waits for its transfers.
func (s *Server) Serve(ctx context.Context, conn *net.UDPConn) error {
	s.mu.Lock()
	s.defaults()
	s.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One byte over the largest request, so that an oversized one is
	// seen as such instead of cut to size.
	buf := make([]byte, maxRequest+1)
	for {
		n, peer, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("tftp: read: %w", err)
		}
		s.datagram(tctx, conn, peer, buf[:n], &wg)
	}
}

// Transfers is how many transfers are in progress (tests, logs).
func (s *Server) Transfers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.transfers)
}

// datagram handles one datagram: to its transfer if its peer has one,
// otherwise as a new request.
func (s *Server) datagram(ctx context.Context, conn sender, peer netip.AddrPort, b []byte, wg *sync.WaitGroup) {
	defer s.Panics.Recover("tftp")
	s.mu.Lock()
	ch, busy := s.transfers[peer]
	s.mu.Unlock()
	if busy {
		select {
		case ch <- append([]byte(nil), b...):
		default: // the transfer is behind: a dropped ACK is resent by its peer
		}
		return
	}
	req, err := ParseRequest(b)
	if err != nil {
		// No answer: the source may be forged, and an error datagram to it
		// is traffic towards someone who never asked.
		s.Log.Debug("tftp: datagram dropped", "remote", peer.String(), "err", err)
		return
	}
	reply := func(code uint16, msg string) { _, _ = conn.WriteToUDPAddrPort(packetError(code, msg), peer) }
	if req.Write {
		s.Log.Debug("tftp: write refused", "remote", peer.String(), "name", clip(req.Name))
		reply(errAccessViolation, "read-only server")
		return
	}
	f, err := s.Loaders.Open(req.Name)
	if err != nil {
		s.Log.Debug("tftp: refused", "remote", peer.String(), "name", clip(req.Name), "err", err)
		reply(errFileNotFound, "not found")
		return
	}
	ch, ok := s.admit(peer)
	if !ok {
		f.Close()
		s.Log.Debug("tftp: busy", "remote", peer.String(), "max_transfers", s.MaxTransfers, "max_per_source", s.MaxPerSource)
		reply(errUndefined, "server busy, retry later")
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer s.release(peer)
		defer f.Close()
		defer s.Panics.Recover("tftp")
		s.transfer(ctx, conn, peer, req, f, ch)
	}()
}

func (s *Server) admit(peer netip.AddrPort) (chan []byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.transfers) >= s.MaxTransfers || s.perSource[peer.Addr()] >= s.MaxPerSource {
		return nil, false
	}
	ch := make(chan []byte, 4)
	s.transfers[peer] = ch
	s.perSource[peer.Addr()]++
	return ch, true
}

func (s *Server) release(peer netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.transfers, peer)
	if s.perSource[peer.Addr()]--; s.perSource[peer.Addr()] <= 0 {
		delete(s.perSource, peer.Addr())
	}
}

// sender is the part of the socket a transfer uses (a fake in the fuzz
// target).
type sender interface {
	WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error)
}

var errPeerAborted = errors.New("the client sent an error")

// transfer sends f to peer, one block per ACK (no windows: a loader is
// small, and each block waits for its ACK before the next is read).
func (s *Server) transfer(ctx context.Context, conn sender, peer netip.AddrPort, req Request, f *os.File, acks <-chan []byte) {
	log := s.Log.With("remote", peer.String(), "name", req.Name)
	size := int64(-1)
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	neg := req.negotiate(size)
	deadline := s.Clock.Now().Add(s.MaxTransferTime)
	answered := false
	// exchange sends p until peer acknowledges block, resending after
	// each timeout: once while the peer has answered nothing, Retries
	// times after.
	exchange := func(p []byte, block uint16) error {
		retries := s.Retries
		if !answered {
			retries = unansweredRetries
		}
		for try := 0; ; try++ {
			if _, err := conn.WriteToUDPAddrPort(p, peer); err != nil {
				return fmt.Errorf("send block %d: %w", block, err)
			}
			if acked, err := s.await(ctx, acks, block); err != nil {
				return err
			} else if acked {
				answered = true
				return nil
			}
			if try >= retries {
				return fmt.Errorf("no ACK of block %d after %d sends", block, try+1)
			}
		}
	}
	if len(neg.oack) > 0 {
		if err := exchange(packetOACK(neg.oack), 0); err != nil {
			log.Debug("tftp: transfer ended", "err", err)
			return
		}
	}
	buf := make([]byte, 4+neg.blockSize)
	binary.BigEndian.PutUint16(buf, opDATA)
	for block := uint16(1); ; block++ {
		n, err := io.ReadFull(f, buf[4:])
		last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !last {
			log.Warn("tftp: read loader", "err", err)
			_, _ = conn.WriteToUDPAddrPort(packetError(errUndefined, "read error"), peer)
			return
		}
		binary.BigEndian.PutUint16(buf[2:], block)
		if err := exchange(buf[:4+n], block); err != nil {
			log.Debug("tftp: transfer ended", "err", err)
			return
		}
		if last {
			log.Info("tftp: loader sent", "bytes", size, "block_size", neg.blockSize)
			return
		}
		if s.Clock.Now().After(deadline) {
			log.Warn("tftp: transfer took too long, ended", "max", s.MaxTransferTime)
			_, _ = conn.WriteToUDPAddrPort(packetError(errUndefined, "transfer too slow"), peer)
			return
		}
	}
}

// await waits one timeout for the ACK of block: true when it came, false
// at the timeout; an error when the peer aborted or ctx ended. ACKs of
// earlier blocks are duplicates and ignored: resending on them would
// double every later block (the "sorcerer's apprentice" of RFC 1123).
func (s *Server) await(ctx context.Context, acks <-chan []byte, block uint16) (bool, error) {
	t := s.Clock.NewTimer(s.Timeout)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C():
			return false, nil
		case b := <-acks:
			got, isErr, ok := ackOf(b)
			switch {
			case !ok:
			case isErr:
				return false, errPeerAborted
			case got == block:
				return true, nil
			}
		}
	}
}
