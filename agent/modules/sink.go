package modules

import (
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/mem"
)

// sink hashes and writes chunks on two goroutines of its own, so that on a
// multi-core node hashing, writing to the cache and receiving (decrypting)
// the next chunk overlap instead of taking turns. The hash state lives
// across resumed streams: nothing is re-read after a cut.
//
// Chunks arrive in gRPC's receive buffers (see chunkCodec) and are written
// from there to their offset in the file, so after decryption each byte is
// copied once more, by the kernel into the page cache.
type sink struct {
	file    *os.File
	hashCh  chan mem.BufferSlice
	writeCh chan piece
	wg      sync.WaitGroup
	once    sync.Once

	mu   sync.Mutex
	werr error
}

type piece struct {
	off  int64
	data mem.BufferSlice
}

// sinkDepth is how many chunks may wait per stage; chunks are a few
// hundred KiB, so this bounds memory to a few MiB.
const sinkDepth = 8

func newSink(file *os.File, h hash.Hash) *sink {
	s := &sink{file: file, hashCh: make(chan mem.BufferSlice, sinkDepth), writeCh: make(chan piece, sinkDepth)}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for d := range s.hashCh {
			for _, b := range d {
				h.Write(b.ReadOnlyData())
			}
			d.Free()
		}
	}()
	go func() {
		defer s.wg.Done()
		for p := range s.writeCh {
			if s.err() == nil { // else drain
				if err := writeAt(s.file, p.data, p.off); err != nil {
					s.mu.Lock()
					s.werr = err
					s.mu.Unlock()
				}
			}
			p.data.Free()
		}
	}()
	return s
}

// write queues data for offset off of the file. It takes over the caller's
// reference to data, even when it fails.
func (s *sink) write(off int64, data mem.BufferSlice) error {
	if err := s.err(); err != nil {
		data.Free()
		return err
	}
	if data.Len() == 0 {
		data.Free()
		return nil
	}
	data.Ref() // one reference per stage
	s.hashCh <- data
	s.writeCh <- piece{off, data}
	return nil
}

func (s *sink) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.werr
}

// close waits for queued chunks and returns the first write error. The
// hash is complete once close returns.
func (s *sink) close() error {
	s.once.Do(func() {
		close(s.hashCh)
		close(s.writeCh)
	})
	s.wg.Wait()
	return s.err()
}

// writeAt writes data at off with one pwritev per chunk rather than a
// write per HTTP/2 frame (16 KiB): 16 times fewer system calls.
func writeAt(file *os.File, data mem.BufferSlice, off int64) error {
	iov := make([][]byte, 0, len(data))
	for _, b := range data {
		iov = append(iov, b.ReadOnlyData())
	}
	rc, err := file.SyscallConn()
	if err != nil {
		return fmt.Errorf("write at offset %d: %w", off, err)
	}
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		werr = pwritev(int(fd), iov, off)
		return true
	}); err != nil {
		return fmt.Errorf("write at offset %d: %w", off, err)
	}
	return werr
}

// pwritev writes all of iov at off, continuing after short writes.
func pwritev(fd int, iov [][]byte, off int64) error {
	const iovMax = 1024 // the kernel's limit per call
	for {
		// Drop empty slices: a call with nothing to write returns 0.
		for len(iov) > 0 && len(iov[0]) == 0 {
			iov = iov[1:]
		}
		if len(iov) == 0 {
			return nil
		}
		n, err := unix.Pwritev(fd, iov[:min(len(iov), iovMax)], off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err == nil && n == 0 {
			err = io.ErrShortWrite
		}
		if err != nil {
			return fmt.Errorf("write at offset %d: %w", off, err)
		}
		off += int64(n)
		for n > 0 {
			k := min(n, len(iov[0]))
			iov[0], n = iov[0][k:], n-k
			if len(iov[0]) == 0 {
				iov = iov[1:]
			}
		}
	}
}
