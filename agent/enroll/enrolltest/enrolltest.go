// Package enrolltest is a fake control plane for the agent's tests: a CA,
// a TLS server on loopback with EnrollmentService and AgentService, and
// knobs to make it misbehave (cut a download, serve wrong bytes, script the
// Connect stream). It stands in for the real control plane, which the
// agent packages may not import.
package enrolltest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tetherfleet/tether/internal/modulewire"
	"github.com/tetherfleet/tether/pki"
	tetherv1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// CA is a throwaway certificate authority.
type CA struct {
	Cert        *x509.Certificate
	Key         ed25519.PrivateKey
	Fingerprint string
	PEM         string
}

var serial = struct {
	sync.Mutex
	n int64
}{n: 1}

func nextSerial() *big.Int {
	serial.Lock()
	defer serial.Unlock()
	serial.n++
	return big.NewInt(serial.n)
}

// NewCA makes a CA valid from an hour ago for ten years.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, Key: key, Fingerprint: pki.Fingerprint(der), PEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// ServerCert issues a server certificate for names (DNS names or IPs).
func (ca *CA) ServerCert(t testing.TB, names ...string) *x509.Certificate {
	t.Helper()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	cert, _ := ca.serverCertFor(t, pub, names)
	return cert
}

func (ca *CA) serverCertFor(t testing.TB, pub ed25519.PublicKey, names []string) (*x509.Certificate, []byte) {
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: "tetherd"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, der
}

// IssueNode signs a node certificate for pub naming instanceID.
func (ca *CA) IssueNode(pub any, instanceID string, notBefore, notAfter time.Time) (*x509.Certificate, error) {
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: instanceID},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{pki.InstanceURI(instanceID)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// PEMOf encodes a certificate.
func PEMOf(c *x509.Certificate) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}

// Digest is "sha256:<hex>" of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Server is the fake control plane. Exported fields may be set before the
// first call and, under Lock, while it runs.
type Server struct {
	tetherv1.UnimplementedEnrollmentServiceServer
	tetherv1.UnimplementedAgentServiceServer

	CA   *CA
	Addr string // 127.0.0.1:PORT
	URL  string // https://127.0.0.1:PORT

	sync.Mutex
	// Now is the server's clock, also used to check client certificates.
	Now func() time.Time
	// Lifetime of issued certificates (default 24 h).
	Lifetime time.Duration
	// Tokens maps an unused bootstrap token to its instance.
	Tokens map[string]string
	Spent  map[string]bool
	// Enrollments and Renewals count successful calls.
	Enrollments, Renewals int
	// RenewErr, when set, fails Renew with it.
	RenewErr error

	// Assignment is what GetAssignment returns (InstanceId filled in).
	Assignment *tetherv1.Assignment
	// Blobs are module contents by digest.
	Blobs map[string][]byte
	// ChunkSize of FetchModule (default 256 KiB).
	ChunkSize int
	// CutAfter, when > 0, makes the next CutTimes FetchModule streams fail
	// after sending that many bytes.
	CutAfter int64
	CutTimes int
	// FetchOffsets records the offset of every FetchModule call.
	FetchOffsets []int64
	// ConnectHandler, when set, handles the Connect stream.
	ConnectHandler func(instanceID string, stream tetherv1.AgentService_ConnectServer) error

	names    []string
	grpcOpts []grpc.ServerOption
	leafOnly bool
	serverCA *CA
	grpc     *grpc.Server
}

// Option adjusts a Server before it starts.
type Option func(*Server)

// WithServerNames sets the names on the server certificate (default
// 127.0.0.1 and localhost).
func WithServerNames(names ...string) Option {
	return func(s *Server) { s.names = names }
}

// WithGRPCOptions adds server options (buffer and window sizes for
// benchmarks).
func WithGRPCOptions(opts ...grpc.ServerOption) Option {
	return func(s *Server) { s.grpcOpts = append(s.grpcOpts, opts...) }
}

// WithLeafOnly makes the server present only its leaf, not the CA.
func WithLeafOnly() Option { return func(s *Server) { s.leafOnly = true } }

// WithServerCA signs the server certificate by another CA than the one that
// issues node certificates (an impostor).
func WithServerCA(ca *CA) Option { return func(s *Server) { s.serverCA = ca } }

// Start runs a fake control plane on a loopback port until the test ends.
func Start(t testing.TB, ca *CA, opts ...Option) *Server {
	t.Helper()
	s := &Server{
		CA:        ca,
		Now:       time.Now,
		Lifetime:  24 * time.Hour,
		Tokens:    map[string]string{},
		Spent:     map[string]bool{},
		Blobs:     map[string][]byte{},
		ChunkSize: 256 << 10,
		names:     []string{"127.0.0.1", "localhost"},
	}
	for _, o := range opts {
		o(s)
	}
	signer := ca
	if s.serverCA != nil {
		signer = s.serverCA
	}
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	_, der := signer.serverCertFor(t, pub, s.names)
	chain := [][]byte{der, signer.Cert.Raw}
	if s.leafOnly {
		chain = chain[:1]
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	tlsCfg := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: key}},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
		MinVersion:   tls.VersionTLS13,
		Time:         func() time.Time { s.Lock(); defer s.Unlock(); return s.Now() },
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = lis.Addr().String()
	s.URL = "https://" + s.Addr
	s.grpc = grpc.NewServer(append([]grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		// FetchModule sends without copying, as tetherd's does.
		grpc.ForceServerCodecV2(modulewire.NewCodec(encoding.GetCodecV2(grpcproto.Name))),
	}, s.grpcOpts...)...)
	tetherv1.RegisterEnrollmentServiceServer(s.grpc, s)
	tetherv1.RegisterAgentServiceServer(s.grpc, s)
	go s.grpc.Serve(lis)
	t.Cleanup(s.Stop)
	return s
}

// Stop closes every connection at once.
func (s *Server) Stop() { s.grpc.Stop() }

// AddToken registers an unused token for instanceID and returns it.
func (s *Server) AddToken(instanceID string) string {
	tok, _, err := pki.NewToken()
	if err != nil {
		panic(err)
	}
	s.Lock()
	s.Tokens[tok] = instanceID
	s.Unlock()
	return tok
}

func (s *Server) Enroll(_ context.Context, req *tetherv1.EnrollRequest) (*tetherv1.EnrollResponse, error) {
	s.Lock()
	defer s.Unlock()
	inst, ok := s.Tokens[req.GetToken()]
	if !ok || s.Spent[req.GetToken()] {
		return nil, status.Error(codes.Unauthenticated, "bootstrap token unknown, expired or already used")
	}
	csr, err := parseCSR(req.GetCsrPem())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "csr_pem: %v", err)
	}
	now := s.Now()
	cert, err := s.CA.IssueNode(csr.PublicKey, inst, now.Add(-time.Minute), now.Add(s.Lifetime))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.Spent[req.GetToken()] = true
	s.Enrollments++
	return &tetherv1.EnrollResponse{InstanceId: inst, CertificatePem: PEMOf(cert), CaPem: s.CA.PEM, NotAfter: timestamppb.New(cert.NotAfter)}, nil
}

func parseCSR(p string) (*x509.CertificateRequest, error) {
	blk, _ := pem.Decode([]byte(p))
	if blk == nil || blk.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("no CERTIFICATE REQUEST block")
	}
	csr, err := x509.ParseCertificateRequest(blk.Bytes)
	if err != nil {
		return nil, err
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, err
	}
	if _, ok := csr.PublicKey.(ed25519.PublicKey); !ok {
		return nil, errors.New("want an Ed25519 key")
	}
	if len(csr.URIs)+len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses) > 0 || csr.Subject.String() != "" {
		return nil, errors.New("the CSR must not name anything")
	}
	return csr, nil
}

// InstanceOf returns the instance a verified client certificate names.
func InstanceOf(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", status.Error(codes.Unauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 {
		return "", status.Error(codes.Unauthenticated, "a node certificate is required")
	}
	id, err := pki.IdentityOf(ti.State.VerifiedChains[0][0])
	if err != nil || id.Kind != pki.KindInstance {
		return "", status.Error(codes.PermissionDenied, "not a node certificate")
	}
	return id.Name, nil
}

func (s *Server) Renew(ctx context.Context, req *tetherv1.RenewRequest) (*tetherv1.RenewResponse, error) {
	inst, err := InstanceOf(ctx)
	if err != nil {
		return nil, err
	}
	s.Lock()
	defer s.Unlock()
	if s.RenewErr != nil {
		return nil, s.RenewErr
	}
	csr, err := parseCSR(req.GetCsrPem())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "csr_pem: %v", err)
	}
	now := s.Now()
	cert, err := s.CA.IssueNode(csr.PublicKey, inst, now.Add(-time.Minute), now.Add(s.Lifetime))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.Renewals++
	return &tetherv1.RenewResponse{CertificatePem: PEMOf(cert), CaPem: s.CA.PEM, NotAfter: timestamppb.New(cert.NotAfter)}, nil
}

func (s *Server) GetAssignment(ctx context.Context, _ *tetherv1.GetAssignmentRequest) (*tetherv1.Assignment, error) {
	inst, err := InstanceOf(ctx)
	if err != nil {
		return nil, err
	}
	s.Lock()
	defer s.Unlock()
	if s.Assignment == nil {
		return &tetherv1.Assignment{InstanceId: inst}, nil
	}
	a := proto.Clone(s.Assignment).(*tetherv1.Assignment)
	a.InstanceId = inst
	return a, nil
}

func (s *Server) FetchModule(req *tetherv1.FetchModuleRequest, stream tetherv1.AgentService_FetchModuleServer) error {
	if _, err := InstanceOf(stream.Context()); err != nil {
		return err
	}
	s.Lock()
	blob, ok := s.Blobs[req.GetDigest()]
	chunk := s.ChunkSize
	cut := int64(-1)
	if s.CutTimes > 0 && s.CutAfter > 0 {
		s.CutTimes--
		cut = s.CutAfter
	}
	s.FetchOffsets = append(s.FetchOffsets, req.GetOffset())
	s.Unlock()
	if !ok {
		return status.Errorf(codes.NotFound, "module %s not assigned", req.GetDigest())
	}
	off := req.GetOffset()
	if off < 0 || off > int64(len(blob)) {
		return status.Errorf(codes.OutOfRange, "offset %d outside 0..%d", off, len(blob))
	}
	// Blobs are never modified in place (a test swaps in another slice), so
	// chunks can alias them.
	send := func(off, end, size int64) error {
		return stream.SendMsg(&modulewire.Chunk{Offset: off, Data: mem.SliceBuffer(blob[off:end]), Size: size})
	}
	var sent int64
	first := true
	for off < int64(len(blob)) || first {
		end := min(off+int64(chunk), int64(len(blob)))
		if cut >= 0 && sent+(end-off) > cut {
			end = off + (cut - sent)
			if end > off {
				if err := send(off, end, int64(len(blob))); err != nil {
					return err
				}
			}
			return status.Error(codes.Unavailable, "stream cut by the test")
		}
		var size int64
		if first {
			size, first = int64(len(blob)), false
		}
		if err := send(off, end, size); err != nil {
			return err
		}
		sent += end - off
		off = end
	}
	return nil
}

func (s *Server) Connect(stream tetherv1.AgentService_ConnectServer) error {
	inst, err := InstanceOf(stream.Context())
	if err != nil {
		return err
	}
	s.Lock()
	h := s.ConnectHandler
	s.Unlock()
	if h == nil {
		// Default: swallow everything the agent sends.
		for {
			if _, err := stream.Recv(); err != nil {
				return nil
			}
		}
	}
	return h(inst, stream)
}
