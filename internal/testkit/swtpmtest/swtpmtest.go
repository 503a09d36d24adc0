// Package swtpmtest runs a software TPM 2.0 (swtpm) for a test: its own
// state, EK certificate and local CA in the test's temporary directory,
// nothing global touched. Tests that need it skip loudly without swtpm.
package swtpmtest

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Require skips t, naming what is missing, unless swtpm and swtpm_setup
// are installed.
func Require(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"swtpm", "swtpm_setup", "swtpm_localca"} {
		if _, err := exec.LookPath(bin); err != nil {
			msg := fmt.Sprintf("SKIP (software TPM): %s is not installed (apt-get install swtpm swtpm-tools)", bin)
			fmt.Fprintln(os.Stderr, msg)
			t.Skip(msg)
		}
	}
}

// Setup manufactures a TPM state in dir (created if need be): EKs and their
// certificates signed by a local CA in dir/ca, written as swtpm_setup
// does for a VM. It returns the DER of the RSA EK certificate.
func Setup(dir string) ([]byte, error) {
	for _, d := range []string{filepath.Join(dir, "state"), filepath.Join(dir, "ca"), filepath.Join(dir, "certs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"localca.conf":    fmt.Sprintf("statedir = %[1]s/ca\nsigningkey = %[1]s/ca/signkey.pem\nissuercert = %[1]s/ca/issuercert.pem\ncertserial = %[1]s/ca/certserial\n", dir),
		"localca.options": "--platform-manufacturer Tether\n--platform-version 2.1\n--platform-model test\n",
		"setup.conf": fmt.Sprintf("create_certs_tool = %s\ncreate_certs_tool_config = %[2]s/localca.conf\ncreate_certs_tool_options = %[2]s/localca.options\nactive_pcr_banks = sha256\n",
			"swtpm_localca", dir),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command("swtpm_setup", "--tpm2", "--tpmstate", filepath.Join(dir, "state"), "--create-ek-cert", "--create-platform-cert",
		"--config", filepath.Join(dir, "setup.conf"), "--write-ek-cert-files", filepath.Join(dir, "certs"), "--overwrite")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("swtpm_setup: %w\n%s", err, lastLines(out, 8))
	}
	der, err := os.ReadFile(filepath.Join(dir, "certs", "ek-rsa2048.crt"))
	if err != nil {
		return nil, fmt.Errorf("swtpm_setup wrote no RSA EK certificate: %w", err)
	}
	return der, nil
}

// TPM is a running swtpm.
type TPM struct {
	Dir string
	// EKCert is the RSA EK certificate swtpm_setup wrote.
	EKCert *x509.Certificate
	sock   string
	cmd    *exec.Cmd
}

// Start manufactures a fresh TPM in a temporary directory and runs it
// until t ends.
func Start(t testing.TB) *TPM {
	t.Helper()
	Require(t)
	// Unix socket paths are short; t.TempDir's can be too long.
	dir, err := os.MkdirTemp("", "swtpm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return StartIn(t, dir)
}

// StartIn runs a TPM whose state lives in dir, manufacturing it first if
// dir holds none: two StartIn on one dir are the same TPM.
func StartIn(t testing.TB, dir string) *TPM {
	t.Helper()
	Require(t)
	if _, err := os.Stat(filepath.Join(dir, "certs", "ek-rsa2048.crt")); err != nil {
		if _, err := Setup(dir); err != nil {
			t.Fatal(err)
		}
	}
	der, err := os.ReadFile(filepath.Join(dir, "certs", "ek-rsa2048.crt"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("swtpm's EK certificate: %v", err)
	}
	sock := filepath.Join(dir, "tpm.sock")
	os.Remove(sock)
	cmd := exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+filepath.Join(dir, "state"),
		"--server", "type=unixio,path="+sock, "--ctrl", "type=unixio,path="+filepath.Join(dir, "ctrl.sock"),
		"--flags", "not-need-init,startup-clear")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start swtpm: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	// swtpm creates its socket before it serves; wait for it to accept,
	// or for it to die.
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("swtpm exited: %v\n%s", err, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("swtpm did not listen on %s within 10 s: %s", sock, stderr.String())
		}
	}
	return &TPM{Dir: dir, EKCert: cert, sock: sock, cmd: cmd}
}

// Dial opens a command channel to the TPM. swtpm serves one at a time.
func (s *TPM) Dial(t testing.TB) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", s.sock)
	if err != nil {
		t.Fatalf("dial swtpm: %v", err)
	}
	return c
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
