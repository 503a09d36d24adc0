package enroll_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent/tpm"
	"github.com/tetherfleet/tether/controlplane/enroll"
	"github.com/tetherfleet/tether/controlplane/store"
	"github.com/tetherfleet/tether/controlplane/store/sqlite"
	"github.com/tetherfleet/tether/internal/testkit/swtpmtest"
	"github.com/tetherfleet/tether/pki"
	"github.com/tetherfleet/tether/pki/attestation"
)

// BenchmarkEnrollTokenVsAttested runs token and attested enrollments side
// by side, at 1, 16 and 64 clients, against one SQLite store. Each
// attested client is a swtpm of its own (copies of one manufactured
// state: one EK, bound to the node). It reports enrollments per second and
// the time spent in the control plane's calls per enrollment (server-ms:
// at one client that is its CPU, with more it includes waiting for the
// store and the other calls), and this process's CPU per enrollment
// (cpu-ms: the control plane, the clients' Go side and the runtime's
// spinning while clients wait for their TPM; the TPM's own work is in the
// swtpm processes and not counted). CSRs are made before the timer.
func BenchmarkEnrollTokenVsAttested(b *testing.B) {
	swtpmtest.Require(b)
	proto := b.TempDir()
	if _, err := swtpmtest.Setup(proto); err != nil {
		b.Fatal(err)
	}
	for _, clients := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("token/clients=%d", clients), func(b *testing.B) { benchToken(b, clients) })
		b.Run(fmt.Sprintf("attested/clients=%d", clients), func(b *testing.B) { benchAttested(b, proto, clients) })
	}
}

func benchStore(b *testing.B, ekHashes []string) *attestEnv {
	st, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "tether.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	return newAttestEnv(b, st, ekHashes, nil)
}

// instances makes n more instances on e's edge node.
func (e *attestEnv) instances(b *testing.B, n int) []*store.Instance {
	ctx := context.Background()
	out := make([]*store.Instance, n)
	for i := range out {
		in := &store.Instance{NodeID: e.edge.ID, Status: e.inst.Status, Provider: "qemu", CreatedAt: e.clk.Now(), UpdatedAt: e.clk.Now()}
		if err := e.st.CreateInstance(ctx, in); err != nil {
			b.Fatal(err)
		}
		out[i] = in
	}
	return out
}

func csrs(b *testing.B, n int) []string {
	out := make([]string, n)
	for i := range out {
		_, out[i] = csrPEM(b)
	}
	return out
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// run spreads b.N operations over clients goroutines and reports the
// rate and the CPU per operation.
func run(b *testing.B, clients int, op func(client, i int) (time.Duration, error)) {
	var next atomic.Int64
	var server atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	cpu0, t0 := cpuTime(), time.Now()
	b.ResetTimer()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				d, err := op(c, i)
				if err != nil {
					errs <- err
					return
				}
				server.Add(int64(d))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	wall, cpu := time.Since(t0), cpuTime()-cpu0
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
	b.ReportMetric(float64(b.N)/wall.Seconds(), "enroll/s")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(server.Load())/1e6/float64(b.N), "server-ms/op")
}

func benchToken(b *testing.B, clients int) {
	ctx := context.Background()
	e := benchStore(b, nil)
	ins := e.instances(b, b.N)
	tokens := make([]string, b.N)
	for i, in := range ins {
		tok, hash, err := pki.NewToken()
		if err != nil {
			b.Fatal(err)
		}
		if err := e.st.CreateToken(ctx, &store.Token{Hash: hash, InstanceID: in.ID, ExpiresAt: e.clk.Now().Add(time.Hour), CreatedAt: e.clk.Now()}); err != nil {
			b.Fatal(err)
		}
		tokens[i] = tok
	}
	cs := csrs(b, b.N)
	run(b, clients, func(_, i int) (time.Duration, error) {
		t0 := time.Now()
		_, err := e.svc.Enroll(ctx, tokens[i], cs[i])
		return time.Since(t0), err
	})
}

func benchAttested(b *testing.B, proto string, clients int) {
	ctx := context.Background()
	tpms := make([]*tpm.TPM, clients)
	var ekHash string
	for c := range tpms {
		dir, err := os.MkdirTemp("", "swtpm")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		if out, err := exec.Command("cp", "-a", proto+"/.", dir).CombinedOutput(); err != nil {
			b.Fatalf("copy the TPM state: %v %s", err, out)
		}
		sw := swtpmtest.StartIn(b, dir)
		t, err := tpm.OpenChannel(sw.Dial(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { t.Close() })
		tpms[c] = t
	}
	ek, err := tpms[0].EK()
	if err != nil {
		b.Fatal(err)
	}
	if ekHash, err = attestation.EKHashDER(ek.PublicDER); err != nil {
		b.Fatal(err)
	}
	e := benchStore(b, []string{ekHash})
	ins := e.instances(b, b.N)
	cs := csrs(b, b.N)
	run(b, clients, func(c, i int) (time.Duration, error) {
		t := tpms[c]
		ak, err := t.NewAK()
		if err != nil {
			return 0, err
		}
		defer ak.Close()
		t0 := time.Now()
		a, ch, err := e.svc.BeginAttested(ctx, enroll.Begin{InstanceID: ins[i].ID, CSRPEM: cs[i], EKPublic: ek.PublicDER, EKCertificate: ek.CertificateDER, AK: ak.Params()})
		server := time.Since(t0)
		if err != nil {
			return 0, err
		}
		secret, err := ak.Activate(ch)
		if err != nil {
			return 0, err
		}
		block, _ := pem.Decode([]byte(cs[i]))
		ev, err := ak.Quote(attestation.Nonce(a.ID, secret, block.Bytes))
		if err != nil {
			return 0, err
		}
		t1 := time.Now()
		_, err = e.svc.FinishAttested(ctx, a, secret, ev)
		return server + time.Since(t1), err
	})
}
