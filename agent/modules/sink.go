package modules

import (
	"hash"
	"io"
	"sync"
)

// sink hashes and writes chunks on two goroutines of its own, so that on a
// multi-core node hashing, writing to the cache and receiving (decrypting)
// the next chunk overlap instead of taking turns. The hash state lives
// across resumed streams: nothing is re-read after a cut.
type sink struct {
	hashCh  chan []byte
	writeCh chan []byte
	wg      sync.WaitGroup
	once    sync.Once

	mu   sync.Mutex
	werr error
}

// sinkDepth is how many chunks may wait per stage; chunks are a few
// hundred KiB, so this bounds memory to a few MiB.
const sinkDepth = 8

func newSink(w io.Writer, h hash.Hash) *sink {
	s := &sink{hashCh: make(chan []byte, sinkDepth), writeCh: make(chan []byte, sinkDepth)}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for b := range s.hashCh {
			h.Write(b)
		}
	}()
	go func() {
		defer s.wg.Done()
		for b := range s.writeCh {
			if s.err() != nil {
				continue // drain
			}
			if _, err := w.Write(b); err != nil {
				s.mu.Lock()
				s.werr = err
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// write queues b; b must not be modified afterwards (gRPC hands each
// message its own buffer, and both stages only read it).
func (s *sink) write(b []byte) error {
	if err := s.err(); err != nil {
		return err
	}
	if len(b) > 0 {
		s.hashCh <- b
		s.writeCh <- b
	}
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
