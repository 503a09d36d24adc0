package bench

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.step.sm/crypto/jose"
)

// StepCA is a throwaway step-ca set up the way `step ca init
// --deployment-type standalone` sets one up (a P-256 root and
// intermediate, a JWK provisioner with an ES256 key, badger with synced
// writes), written without the step CLI: the benchmark mints the
// provisioner's one-time tokens itself, as a client of step-ca would.
type StepCA struct {
	Dir    string
	Addr   string // host:port step-ca listens on
	Config string // path of ca.json
	Roots  *x509.CertPool

	provisioner string
	signer      jose.Signer
}

// StepCAProvisioner is the name of the JWK provisioner InitStepCA writes.
const StepCAProvisioner = "bench"

// InitStepCA writes a fresh CA into dir (which must not hold one) for a
// step-ca listening on addr.
func InitStepCA(dir, addr string) (*StepCA, error) {
	for _, sub := range []string{"certs", "secrets", "config", "db"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("step-ca dir: %w", err)
		}
	}
	now := time.Now()
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("step-ca root key: %w", err)
	}
	root, err := selfSign(&x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "bench Root CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true, MaxPathLen: 1,
	}, nil, rootKey, rootKey)
	if err != nil {
		return nil, err
	}
	intKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("step-ca intermediate key: %w", err)
	}
	inter, err := selfSign(&x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "bench Intermediate CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true,
		MaxPathLen: 0, MaxPathLenZero: true,
	}, root, intKey, rootKey)
	if err != nil {
		return nil, err
	}
	intDER, err := x509.MarshalECPrivateKey(intKey)
	if err != nil {
		return nil, fmt.Errorf("step-ca intermediate key: %w", err)
	}
	jwk, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", "", 0)
	if err != nil {
		return nil, fmt.Errorf("step-ca provisioner key: %w", err)
	}
	pub := jwk.Public()
	pubJSON, err := json.Marshal(&pub)
	if err != nil {
		return nil, fmt.Errorf("step-ca provisioner key: %w", err)
	}
	p := func(parts ...string) string { return filepath.Join(append([]string{dir}, parts...)...) }
	cfg := map[string]any{
		"root": p("certs", "root_ca.crt"), "federatedRoots": nil,
		"crt": p("certs", "intermediate_ca.crt"), "key": p("secrets", "intermediate_ca_key"),
		"address": addr, "insecureAddress": "", "dnsNames": []string{"127.0.0.1"},
		// What step ca init writes: a text log line per request, and badger
		// (SyncWrites on by default) for used tokens and issued certificates.
		"logger": map[string]any{"format": "text"},
		"db":     map[string]any{"type": "badgerv2", "dataSource": p("db"), "badgerFileLoadingMode": ""},
		"authority": map[string]any{"provisioners": []any{map[string]any{
			"type": "JWK", "name": StepCAProvisioner, "key": json.RawMessage(pubJSON),
			"claims": map[string]any{"defaultTLSCertDuration": "24h"},
		}}},
		"commonName": "bench",
	}
	cfgJSON, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("step-ca config: %w", err)
	}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{p("certs", "root_ca.crt"), pemOf("CERTIFICATE", root.Raw), 0o644},
		{p("certs", "intermediate_ca.crt"), pemOf("CERTIFICATE", inter.Raw), 0o644},
		{p("secrets", "intermediate_ca_key"), pemOf("EC PRIVATE KEY", intDER), 0o600},
		{p("config", "ca.json"), cfgJSON, 0o600},
	} {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return nil, fmt.Errorf("step-ca files: %w", err)
		}
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jwk.Key},
		new(jose.SignerOptions).WithType("JWT").WithHeader("kid", jwk.KeyID))
	if err != nil {
		return nil, fmt.Errorf("step-ca token signer: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	return &StepCA{Dir: dir, Addr: addr, Config: p("config", "ca.json"), Roots: roots, provisioner: StepCAProvisioner, signer: signer}, nil
}

func selfSign(tpl, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey) (*x509.Certificate, error) {
	if parent == nil {
		parent = tpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("step-ca certificate %s: %w", tpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return n
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// SignURL is step-ca's sign endpoint; tokens name it as their audience.
func (s *StepCA) SignURL() string { return "https://" + s.Addr + "/1.0/sign" }

type ottClaims struct {
	jose.Claims
	SANs []string `json:"sans"`
}

// Mint makes the one-time token a step client makes for a certificate of
// name: an ES256 JWT from the provisioner's key with a random jti.
func (s *StepCA) Mint(name string, now time.Time, ttl time.Duration) (string, error) {
	jti := make([]byte, 32)
	if _, err := rand.Read(jti); err != nil {
		return "", err
	}
	return jose.Signed(s.signer).Claims(ottClaims{Claims: jose.Claims{
		Issuer: s.provisioner, Subject: name, Audience: jose.Audience{s.SignURL()}, ID: hex.EncodeToString(jti),
		IssuedAt: jose.NewNumericDate(now), NotBefore: jose.NewNumericDate(now), Expiry: jose.NewNumericDate(now.Add(ttl)),
	}, SANs: []string{name}}).CompactSerialize()
}

// StepRequest is a prepared step-ca sign request: the body and the key the
// certificate must carry.
type StepRequest struct {
	Name string
	Body []byte
	Key  ed25519.PublicKey
}

// PrepareStep makes n Ed25519 CSRs (a common name and one DNS name, as a
// step client asks) and their tokens and bodies.
func (s *StepCA) PrepareStep(prefix string, n int) ([]StepRequest, error) {
	out := make([]StepRequest, n)
	now := time.Now()
	err := parallel(n, func(i int) error {
		name := fmt.Sprintf("%s-%05d.nodes.bench.internal", prefix, i)
		pub, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
			Subject: pkix.Name{CommonName: name}, DNSNames: []string{name}}, key)
		if err != nil {
			return err
		}
		ott, err := s.Mint(name, now, 5*time.Minute)
		if err != nil {
			return err
		}
		body, err := json.Marshal(map[string]string{"csr": string(pemOf("CERTIFICATE REQUEST", der)), "ott": ott})
		if err != nil {
			return err
		}
		out[i] = StepRequest{Name: name, Body: body, Key: pub}
		return nil
	})
	return out, err
}

// parallel runs f(0..n-1) on a few goroutines; the first error wins.
func parallel(n int, f func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var first error
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
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("prepare %d: %w", i, err)
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// StepClient is the HTTPS client of a step-ca: HTTP/1.1, one kept-alive
// connection per worker, or a new connection per request.
type StepClient struct {
	ca     *StepCA
	client *http.Client
	tr     *http.Transport
}

// NewStepClient trusts only the step-ca root.
func (s *StepCA) NewStepClient(maxConns int, newConnEach bool) *StepClient {
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: s.Roots, MinVersion: tls.VersionTLS12},
		MaxIdleConns:        2 * maxConns,
		MaxIdleConnsPerHost: 2 * maxConns,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true,
		DisableKeepAlives:   newConnEach,
		// An empty map keeps the transport on HTTP/1.1: one connection per
		// worker, as the reference driver measured (HTTP/2 changed nothing).
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	return &StepClient{ca: s, tr: tr, client: &http.Client{Transport: tr, Timeout: time.Minute}}
}

// Close drops the idle connections.
func (c *StepClient) Close() { c.tr.CloseIdleConnections() }

// Health waits for step-ca to answer /health, until ctx ends.
func (c *StepClient) Health(ctx context.Context) error {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+c.ca.Addr+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := c.client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("step-ca at %s never became healthy: %w", c.ca.Addr, err)
		// A poll on an external process that is starting up.
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// open makes sure c connections are open and idle before the clock starts.
func (c *StepClient) open(ctx context.Context, n int) {
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+c.ca.Addr+"/health", nil)
			if err != nil {
				return
			}
			if resp, err := c.client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
}

// StepLoad posts the prepared requests with c workers and checks every
// answer after the clock stops (its certificate carries the CSR's key and
// name; every 50th chains to the root).
func StepLoad(ctx context.Context, cl *StepClient, rs []StepRequest, c int, newConnEach bool) (Result, error) {
	if !newConnEach {
		cl.open(ctx, c)
	}
	url := cl.ca.SignURL()
	bodies := make([][]byte, len(rs))
	var sample Sample
	sample.Start()
	lat, failed, elapsed := runWorkers(len(rs), c, func(w, i int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(rs[i].Body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := cl.client.Do(req)
		if err != nil {
			return err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
			return fmt.Errorf("step-ca answered %s: %s", resp.Status, bytes.TrimSpace(b))
		}
		bodies[i] = b
		return nil
	})
	r := summarize(lat, failed, elapsed)
	r.ClientCPU = sample.Stop()
	for i := range rs {
		if failed[i] != nil {
			continue
		}
		if err := checkStepAnswer(bodies[i], rs[i], cl.ca.Roots, i%50 == 0); err != nil {
			return r, err
		}
	}
	return r, nil
}

func checkStepAnswer(body []byte, r StepRequest, roots *x509.CertPool, chain bool) error {
	var sr struct {
		Crt       string   `json:"crt"`
		CertChain []string `json:"certChain"`
	}
	if err := json.Unmarshal(body, &sr); err != nil {
		return fmt.Errorf("step-ca answer for %s: %w", r.Name, err)
	}
	crt, err := parseCertPEM([]byte(sr.Crt))
	if err != nil {
		return fmt.Errorf("step-ca answer for %s: %w", r.Name, err)
	}
	if !r.Key.Equal(crt.PublicKey) || len(crt.DNSNames) != 1 || crt.DNSNames[0] != r.Name {
		return fmt.Errorf("step-ca answer for %s: the certificate does not carry the CSR's key and name", r.Name)
	}
	if !chain {
		return nil
	}
	inter := x509.NewCertPool()
	for _, s := range sr.CertChain {
		if c, err := parseCertPEM([]byte(s)); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := crt.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: r.Name,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("step-ca certificate for %s does not chain to the root: %w", r.Name, err)
	}
	return nil
}

func parseCertPEM(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no CERTIFICATE PEM block")
	}
	return x509.ParseCertificate(blk.Bytes)
}
