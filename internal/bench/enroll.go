// Package bench is Tether's load generator: the same code drives the Go
// benchmarks (in-process) and cmd/tether-bench (against a running tetherd,
// so server CPU can be read from its own process).
package bench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Result is one measured run.
type Result struct {
	N        int
	Errors   int
	Elapsed  time.Duration
	P50, P99 time.Duration
	// FirstError explains Errors.
	FirstError error
}

// Rate is operations per second.
func (r Result) Rate() float64 { return float64(r.N-r.Errors) / r.Elapsed.Seconds() }

// Enrollment is a pre-made token and CSR: minted before the timed phase.
type Enrollment struct {
	Token  string
	CSRPEM string
}

// PrepareEnrollments provisions n external instances of node and makes an
// Ed25519 CSR for each, in parallel.
func PrepareEnrollments(ctx context.Context, admin v1.AdminServiceClient, node string, n int) ([]Enrollment, error) {
	out := make([]Enrollment, n)
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				resp, err := admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: node, Provider: "external"})
				if err == nil {
					out[i].Token = resp.BootstrapToken
					out[i].CSRPEM, err = NewCSR()
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("prepare enrollment %d: %w", i, err)
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return out, firstErr
}

// NewCSR makes a fresh Ed25519 key and a bare CSR, as the agent does.
func NewCSR() (string, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), nil
}

// EnrollLoad runs the enrollments with c concurrent clients. With
// handshake, every enrollment opens its own connection (a booting node
// does); otherwise each client keeps one connection alive.
func EnrollLoad(ctx context.Context, dial func() (*grpc.ClientConn, error), es []Enrollment, c int, handshake bool) (Result, error) {
	lat := make([]time.Duration, len(es))
	failed := make([]error, len(es))
	var next atomic.Int64
	conns := make([]*grpc.ClientConn, c)
	if !handshake {
		for i := range conns {
			conn, err := dial()
			if err != nil {
				return Result{}, err
			}
			defer conn.Close()
			conns[i] = conn
			// Finish the TLS handshake before the clock starts: kept-alive
			// means every timed call finds its connection ready.
			if err := ready(ctx, conn); err != nil {
				return Result{}, err
			}
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < c; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(es) {
					return
				}
				t0 := time.Now()
				conn := conns[w]
				if handshake {
					var err error
					if conn, err = dial(); err != nil {
						failed[i] = err
						continue
					}
				}
				_, err := v1.NewEnrollmentServiceClient(conn).Enroll(ctx, &v1.EnrollRequest{Token: es[i].Token, CsrPem: es[i].CSRPEM})
				if handshake {
					conn.Close()
				}
				lat[i], failed[i] = time.Since(t0), err
			}
		}(w)
	}
	wg.Wait()
	return summarize(lat, failed, time.Since(start)), nil
}

func summarize(lat []time.Duration, failed []error, elapsed time.Duration) Result {
	r := Result{N: len(lat), Elapsed: elapsed}
	ok := make([]time.Duration, 0, len(lat))
	for i, d := range lat {
		if failed[i] != nil {
			r.Errors++
			if r.FirstError == nil {
				r.FirstError = failed[i]
			}
			continue
		}
		ok = append(ok, d)
	}
	r.P50, r.P99 = Percentile(ok, 0.50), Percentile(ok, 0.99)
	return r
}

// Percentile of durations (sorts a copy).
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// ready connects conn and waits until it can carry calls.
func ready(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		if st == connectivity.Shutdown || !conn.WaitForStateChange(ctx, st) {
			return fmt.Errorf("connection to %s never became ready (last state %s)", conn.Target(), st)
		}
	}
	return nil
}
