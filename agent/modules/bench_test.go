package modules

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"testing"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/agent/enroll/enrolltest"
	"github.com/tetherfleet/tether/agent/modules/fetchbench"
)

const benchModuleSize = 64 << 20

// BenchmarkFetchVerify measures fetch + streaming verification through an
// in-process fake control plane over loopback mTLS, as a node fetches, and
// reports it against in-memory SHA-256 of the same bytes (see
// fetchbench.Run). e2e.BenchmarkFetchVerifyTetherd does the same against
// the real tetherd.
//
// The server shares the machine's cores with the agent here; on a node it
// does not.
func BenchmarkFetchVerify(b *testing.B) {
	for _, chunk := range []int{256 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("chunk=%dKiB", chunk>>10), func(b *testing.B) {
			// The server writes in 256 KiB buffers, as a server streaming
			// large messages should; the agent keeps gRPC's default
			// flow-control windows (they grow with the bandwidth-delay
			// product, which a static window would cap on a long link; a
			// static 4 or 16 MiB window gained nothing here).
			e := newEnv(b, fetchbench.Dir(b), enrolltest.WithGRPCOptions(grpc.WriteBufferSize(256<<10)))
			blob := randomBytes(b, benchModuleSize)
			m := e.addModule("bench", blob)
			e.srv.Lock()
			e.srv.ChunkSize = chunk
			e.srv.Unlock()
			f := e.fetcher(b, &recorder{})
			path, _ := f.Path(m.Digest)
			fetchbench.Run(b, blob,
				func() error {
					if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
						return err
					}
					return nil
				},
				func() error {
					_, err := f.Fetch(context.Background(), m)
					return err
				})
		})
	}
}

// BenchmarkSHA256InMemory is the peer: hashing the bytes already in memory.
func BenchmarkSHA256InMemory(b *testing.B) {
	blob := randomBytes(b, benchModuleSize)
	b.SetBytes(benchModuleSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sha256.Sum256(blob)
	}
}
