package bench

import (
	"bufio"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// IdentityFile keeps a shard's enrolled identities between runs, one JSON
// line per agent, so that a second run against the same data dir (a
// before/after comparison, a reconnect storm) connects at once instead of
// spending minutes enrolling again. Node certificates live 24 h, so a
// file is good for a day of runs.
type IdentityFile struct {
	mu   sync.Mutex
	f    *os.File
	path string
}

type identityLine struct {
	InstanceID string `json:"instance_id"`
	CertDER    []byte `json:"cert_der"`
	KeySeed    []byte `json:"ed25519_seed"`
}

// OpenIdentities reads the identities already in path (creating it if
// missing) and keeps it open for Save.
func OpenIdentities(path string) (*IdentityFile, []*SimAgent, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("identities: %w", err)
	}
	agents, err := readIdentities(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("identities %s: %w", path, err)
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("identities %s: %w", path, err)
	}
	return &IdentityFile{f: f, path: path}, agents, nil
}

func readIdentities(r io.Reader) ([]*SimAgent, error) {
	var out []*SimAgent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var l identityLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if l.InstanceID == "" || len(l.CertDER) == 0 || len(l.KeySeed) != ed25519.SeedSize {
			return nil, fmt.Errorf("line %d: want instance_id, cert_der and a %d-byte ed25519_seed", n, ed25519.SeedSize)
		}
		out = append(out, &SimAgent{InstanceID: l.InstanceID,
			Cert: tls.Certificate{Certificate: [][]byte{l.CertDER}, PrivateKey: ed25519.NewKeyFromSeed(l.KeySeed)}})
	}
	return out, sc.Err()
}

// Save appends an enrolled agent.
func (f *IdentityFile) Save(a *SimAgent) error {
	key, ok := a.Cert.PrivateKey.(ed25519.PrivateKey)
	if !ok || len(a.Cert.Certificate) == 0 {
		return errors.New("identities: agent has no ed25519 key or certificate")
	}
	b, err := json.Marshal(identityLine{InstanceID: a.InstanceID, CertDER: a.Cert.Certificate[0], KeySeed: key.Seed()})
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	return nil
}

// Close closes the file.
func (f *IdentityFile) Close() error { return f.f.Close() }

// Path is the file's path.
func (f *IdentityFile) Path() string { return f.path }
