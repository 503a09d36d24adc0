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
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tetherfleet/tether/pki"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Result is one measured run.
type Result struct {
	N        int
	Errors   int
	Elapsed  time.Duration
	P50, P99 time.Duration
	// ClientCPU is what the load generator itself spent in the timed
	// phase: on a shared machine it is taken from the server.
	ClientCPU time.Duration
	// FirstError explains Errors.
	FirstError error
}

// Rate is operations per second.
func (r Result) Rate() float64 { return float64(r.N-r.Errors) / r.Elapsed.Seconds() }

// Enrollment is a pre-made request, minted before the timed phase: Request
// is the EnrollRequest already encoded, so the timed phase only sends it.
type Enrollment struct {
	Token      string
	CSRPEM     string
	InstanceID string
	Key        ed25519.PublicKey
	request    []byte
}

// PrepareEnrollments provisions n external instances of node and makes an
// Ed25519 CSR for each, in parallel.
func PrepareEnrollments(ctx context.Context, admin v1.AdminServiceClient, node string, n int) ([]Enrollment, error) {
	out := make([]Enrollment, n)
	err := parallel(n, func(i int) error {
		resp, err := admin.ProvisionInstance(ctx, &v1.ProvisionInstanceRequest{Node: node, Provider: "external"})
		if err != nil {
			return err
		}
		pub, csr, err := newCSR()
		if err != nil {
			return err
		}
		out[i] = Enrollment{Token: resp.BootstrapToken, CSRPEM: csr, InstanceID: resp.GetInstance().GetId(), Key: pub}
		out[i].request, err = proto.Marshal(&v1.EnrollRequest{Token: out[i].Token, CsrPem: csr})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("prepare enrollment: %w", err)
	}
	return out, nil
}

// RetokenEnrollments gives the instances of earlier enrollments a fresh
// token and key each, so that repeated runs enroll the same instances
// again instead of growing the fleet (every booting instance costs the
// liveness loop a row per tick, which would tilt later runs).
func RetokenEnrollments(ctx context.Context, admin v1.AdminServiceClient, prev []Enrollment) ([]Enrollment, error) {
	out := make([]Enrollment, len(prev))
	err := parallel(len(prev), func(i int) error {
		resp, err := admin.CreateBootstrapToken(ctx, &v1.CreateBootstrapTokenRequest{InstanceId: prev[i].InstanceID})
		if err != nil {
			return err
		}
		pub, csr, err := newCSR()
		if err != nil {
			return err
		}
		out[i] = Enrollment{Token: resp.Token, CSRPEM: csr, InstanceID: prev[i].InstanceID, Key: pub}
		out[i].request, err = proto.Marshal(&v1.EnrollRequest{Token: out[i].Token, CsrPem: csr})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("prepare enrollment: %w", err)
	}
	return out, nil
}

// NewCSR makes a fresh Ed25519 key and a bare CSR, as the agent does.
func NewCSR() (string, error) {
	_, csr, err := newCSR()
	return csr, err
}

func newCSR() (ed25519.PublicKey, string, error) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, "", err
	}
	return pub, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), nil
}

// rawCodec sends bytes that are already an encoded message and keeps the
// answer's bytes as they came: the load generator's own encoding and
// decoding are then not in the timed phase (answers are decoded and
// checked after it). It calls itself "proto" because that is what the
// server must see.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot send %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot decode into %T", v)
	}
	*b = data.Materialize()
	return nil
}

// enrollMethod is EnrollmentService.Enroll's full name.
var enrollMethod = v1.EnrollmentService_Enroll_FullMethodName

// EnrollLoad runs the enrollments with c concurrent clients. With
// handshake, every enrollment opens its own connection (a booting node
// does); otherwise each client keeps one connection alive. Every answer is
// checked after the clock stops: a certificate for the CSR's key naming
// the instance.
func EnrollLoad(ctx context.Context, dial func() (*grpc.ClientConn, error), es []Enrollment, c int, handshake bool) (Result, error) {
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
	for i := range es {
		if es[i].request == nil {
			b, err := proto.Marshal(&v1.EnrollRequest{Token: es[i].Token, CsrPem: es[i].CSRPEM})
			if err != nil {
				return Result{}, fmt.Errorf("encode enrollment %d: %w", i, err)
			}
			es[i].request = b
		}
	}
	answers := make([][]byte, len(es))
	codec := grpc.ForceCodecV2(rawCodec{})
	var sample Sample
	sample.Start()
	lat, failed, elapsed := runWorkers(len(es), c, func(w, i int) error {
		conn := conns[w]
		if handshake {
			var err error
			if conn, err = dial(); err != nil {
				return err
			}
			defer conn.Close()
		}
		return conn.Invoke(ctx, enrollMethod, &es[i].request, &answers[i], codec)
	})
	r := summarize(lat, failed, elapsed)
	r.ClientCPU = sample.Stop()
	for i := range es {
		if failed[i] != nil {
			continue
		}
		if err := checkEnrolled(answers[i], es[i]); err != nil {
			return r, err
		}
	}
	return r, nil
}

// checkEnrolled decodes an answer and checks that it is a certificate for
// the enrollment's key naming its instance.
func checkEnrolled(answer []byte, e Enrollment) error {
	var resp v1.EnrollResponse
	if err := proto.Unmarshal(answer, &resp); err != nil {
		return fmt.Errorf("enrollment answer: %w", err)
	}
	crt, err := parseCertPEM([]byte(resp.CertificatePem))
	if err != nil {
		return fmt.Errorf("enrollment answer: %w", err)
	}
	if e.Key != nil && !e.Key.Equal(crt.PublicKey) {
		return fmt.Errorf("enrollment of %s: the certificate does not carry the CSR's key", e.InstanceID)
	}
	if e.InstanceID != "" && (len(crt.URIs) != 1 || crt.URIs[0].String() != pki.InstanceURI(e.InstanceID).String()) {
		return fmt.Errorf("enrollment of %s: the certificate names %v", e.InstanceID, crt.URIs)
	}
	return nil
}

// runWorkers runs fn(worker, i) for every i in [0,n) on c goroutines and
// times each call. Nothing is allocated per call.
func runWorkers(n, c int, fn func(w, i int) error) ([]time.Duration, []error, time.Duration) {
	lat := make([]time.Duration, n)
	failed := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				failed[i] = fn(w, i)
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	return lat, failed, time.Since(start)
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

// MaxFailedShare is the share of a run's operations that may fail before
// its figures mean nothing: a rate of the few that got through measures
// the refusals, not the server.
const MaxFailedShare = 0.01

// Check reports a run whose failures pass MaxFailedShare, saying why when
// the cause is known. A tetherd with default flags limits enrollments per
// source address (20/s, a burst of 200), and a load generator is one
// source: it is told which flags lift the limit.
func (r Result) Check() error {
	if r.N == 0 || float64(r.Errors) <= MaxFailedShare*float64(r.N) {
		return nil
	}
	why := fmt.Sprintf("%d of %d operations failed (first: %v)", r.Errors, r.N, r.FirstError)
	if status.Code(r.FirstError) == codes.ResourceExhausted {
		return fmt.Errorf("%s: tetherd's per-source limits refused them; for a load test from one host start it with "+
			"--unauthenticated-rate=-1 --max-unauthenticated-per-source=-1 (or run `make bench-peers`, which starts its own tetherd)", why)
	}
	return errors.New(why)
}
