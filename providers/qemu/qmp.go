package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// errQMPUnreachable means nothing listens on the QMP socket: the file is
// missing or stale. For a live process that means QEMU is still starting.
var errQMPUnreachable = errors.New("qmp socket not listening")

// errQMPTimeout means QEMU accepted the connection but did not answer in
// time: it is wedged, busy, or another client holds its single QMP slot.
var errQMPTimeout = errors.New("qmp did not answer in time")

// qmpRun connects to the QMP socket, runs cmds in order on one connection and
// returns each raw answer. The whole exchange is bounded by timeout and ctx.
//
// go-qemu's SocketMonitor has no deadlines of its own, so the exchange runs in
// a goroutine; on expiry we Disconnect, which closes the connection and
// unblocks the library's pending read, so no goroutine outlives the call.
func qmpRun(ctx context.Context, sock string, timeout time.Duration, cmds ...string) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dialTimeout := timeout
	if dl, ok := ctx.Deadline(); ok {
		dialTimeout = time.Until(dl)
	}
	mon, err := qmp.NewSocketMonitor("unix", sock, dialTimeout)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: %v", errQMPUnreachable, err)
		}
		return nil, fmt.Errorf("qmp dial %s: %w", sock, err)
	}

	type result struct {
		out [][]byte
		err error
	}
	var (
		mu        sync.Mutex
		abandoned bool
	)
	done := make(chan result, 1)
	go func() {
		err := mon.Connect()
		mu.Lock()
		gaveUp := abandoned
		mu.Unlock()
		if err != nil || gaveUp {
			// A failed Connect leaves no reader goroutine, so this only
			// closes the connection; after a late success it also stops
			// the reader the library started.
			_ = mon.Disconnect()
			if err == nil {
				err = errQMPTimeout
			}
			done <- result{err: fmt.Errorf("qmp greeting: %w", err)}
			return
		}
		var outs [][]byte
		for _, c := range cmds {
			b, _ := json.Marshal(qmp.Command{Execute: c})
			// QMP is a stream of JSON values; the newline makes each
			// command a line, which line-based peers rely on.
			b = append(b, '\n')
			out, err := mon.Run(b)
			if err != nil {
				_ = mon.Disconnect()
				done <- result{out: outs, err: fmt.Errorf("qmp %s: %w", c, err)}
				return
			}
			outs = append(outs, out)
		}
		_ = mon.Disconnect()
		done <- result{out: outs}
	}()

	select {
	case r := <-done:
		return r.out, r.err
	case <-ctx.Done():
		mu.Lock()
		abandoned = true
		mu.Unlock()
		// Closing the connection is the only way to unblock the library's
		// read; the goroutine then finishes on its own.
		_ = mon.Disconnect()
		<-done
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w (%s)", errQMPTimeout, timeout)
		}
		return nil, ctx.Err()
	}
}

// quitLost reports whether err is only QEMU closing the connection before it
// answered quit, which is QEMU doing what it was asked.
func quitLost(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// vmStatus is the part of query-status we read.
type vmStatus struct {
	Status  string `json:"status"`
	Running bool   `json:"running"`
}

func parseQueryStatus(raw []byte) (vmStatus, error) {
	var r struct {
		Return *vmStatus `json:"return"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return vmStatus{}, fmt.Errorf("query-status answer: %w", err)
	}
	if r.Return == nil {
		return vmStatus{}, fmt.Errorf("query-status answer has no return: %s", raw)
	}
	return *r.Return, nil
}
