package qemu

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The TPM of a VM belongs to its node, as a real machine's TPM belongs to
// the machine: the node's next instance presents the same EK, which is how
// an operator registers a node once (node update --ek). Its state lives in
// STATE/tpm/NODE and outlives every instance of the node.
const tpmDirName = "tpm"

// Files of one node's TPM directory (PrepareTPM).
const (
	tpmStateSubdir = "state"           // swtpm's --tpmstate dir
	ekCertFile     = "ek-rsa2048.crt"  // DER, written by swtpm_setup
	ekHashFile     = "ek.sha256"       // EKHash of ekCertFile, for Detail
	setupLogFile   = "swtpm_setup.log" // what swtpm_setup said
)

// Binaries the TPM needs (Debian's swtpm and swtpm-tools).
const (
	swtpmBinary      = "swtpm"
	swtpmSetupBinary = "swtpm_setup"
	swtpmLocalCA     = "swtpm_localca"
)

// tpmSetupTimeout bounds one swtpm_setup run (about a second here: an RSA
// and an ECC EK, a local CA and two certificates).
const tpmSetupTimeout = 60 * time.Second

// TPMDir is the directory of a node's TPM in a qemu state directory.
func TPMDir(stateDir, node string) string { return filepath.Join(stateDir, tpmDirName, node) }

// checkTPMTools reports the first TPM tool missing from PATH, as a message
// that says what to install.
func checkTPMTools() error {
	for _, b := range []string{swtpmBinary, swtpmSetupBinary, swtpmLocalCA} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Errorf("qemu: --qemu-tpm needs %s (install the swtpm and swtpm-tools packages): %w", b, err)
		}
	}
	return nil
}

// PrepareTPM makes dir a TPM 2.0 with an EK and an EK certificate
// (swtpm_setup), unless it is one already, and returns the EK hash:
// "sha256:" + hex of SHA-256 over the PKIX DER of the RSA EK's public key,
// read from the EK certificate. An existing TPM is kept as it is, so its
// EK never changes; a fresh directory is another TPM.
//
// The TPM is built in a sibling directory and renamed into place, so dir
// exists only complete: a setup that dies half-way leaves no TPM that
// lacks its certificate, and two concurrent calls agree on one TPM.
func PrepareTPM(dir string) (string, error) {
	return prepareTPM(context.Background(), dir)
}

func prepareTPM(ctx context.Context, dir string) (string, error) {
	if h, err := tpmEKHash(dir); err == nil {
		return h, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err := checkTPMTools(); err != nil {
		return "", err
	}
	if strings.Contains(dir, ",") {
		// swtpm's option strings cannot quote a comma.
		return "", fmt.Errorf("tpm dir %s: a path with a comma cannot be handed to swtpm", dir)
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("tpm dir: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".setup-")
	if err != nil {
		return "", fmt.Errorf("tpm dir: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after a successful rename too
	if err := runSwtpmSetup(ctx, tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		// Someone else's setup won the race: theirs is the TPM.
		if h, herr := tpmEKHash(dir); herr == nil {
			return h, nil
		}
		return "", fmt.Errorf("tpm dir: %w", err)
	}
	return tpmEKHash(dir)
}

// runSwtpmSetup manufactures a TPM in dir. Its configuration is written
// into dir (a local CA per TPM), so nothing global (/etc, /var/lib,
// $HOME) is read or touched.
func runSwtpmSetup(ctx context.Context, dir string) error {
	localca, err := exec.LookPath(swtpmLocalCA)
	if err != nil {
		return fmt.Errorf("swtpm_localca: %w", err)
	}
	ca := filepath.Join(dir, "ca")
	state := filepath.Join(dir, tpmStateSubdir)
	for _, d := range []string{ca, state} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("tpm dir: %w", err)
		}
	}
	setupConf := filepath.Join(dir, "swtpm_setup.conf")
	caConf := filepath.Join(dir, "swtpm-localca.conf")
	caOpts := filepath.Join(dir, "swtpm-localca.options")
	files := map[string]string{
		setupConf: "create_certs_tool = " + localca + "\n" +
			"create_certs_tool_config = " + caConf + "\n" +
			"create_certs_tool_options = " + caOpts + "\n" +
			"active_pcr_banks = sha256\n",
		caConf: "statedir = " + ca + "\n" +
			"signingkey = " + filepath.Join(ca, "signkey.pem") + "\n" +
			"issuercert = " + filepath.Join(ca, "issuercert.pem") + "\n" +
			"certserial = " + filepath.Join(ca, "certserial") + "\n",
		caOpts: "--platform-manufacturer Tether\n--platform-version 2.1\n--platform-model QEMU\n",
	}
	for p, c := range files {
		if err := os.WriteFile(p, []byte(c), 0o600); err != nil {
			return fmt.Errorf("swtpm_setup config: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, tpmSetupTimeout)
	defer cancel()
	logPath := filepath.Join(dir, setupLogFile)
	cmd := exec.CommandContext(ctx, swtpmSetupBinary,
		"--tpm2", "--tpmstate", state,
		"--create-ek-cert", "--create-platform-cert", "--lock-nvram",
		"--config", setupConf,
		"--write-ek-cert-files", dir,
		"--not-overwrite",
		"--logfile", logPath)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(logPath)
		return fmt.Errorf("swtpm_setup: %w: %s", err, tail(strings.TrimSpace(string(out)+"\n"+string(log)), 2048))
	}
	// The CA's keys signed this TPM's certificates and nothing else will
	// use them: no private key is left lying around.
	for _, f := range []string{"signkey.pem", "swtpm-localca-rootca-privkey.pem"} {
		removeQuietly(filepath.Join(ca, f))
	}
	h, err := ekHashOfCert(filepath.Join(dir, ekCertFile))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, ekHashFile), []byte(h+"\n"), 0o600); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	return nil
}

// tpmEKHash returns the EK hash of a prepared TPM; a directory that is no
// TPM is os.ErrNotExist.
func tpmEKHash(dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, tpmStateSubdir)); err != nil {
		return "", err
	}
	return ekHashOfCert(filepath.Join(dir, ekCertFile))
}

// ekHashOfCert is EKHash of the public key of a DER EK certificate.
func ekHashOfCert(path string) (string, error) {
	der, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("EK certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", fmt.Errorf("EK certificate %s: %w", path, err)
	}
	return EKHash(cert.PublicKey)
}

// EKHash is "sha256:" + hex(SHA-256(PKIX DER of the public key)), the form
// in which nodes name their EK (tetherctl node update --ek).
func EKHash(pub any) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("EK public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// cachedEKHash reads the hash PrepareTPM recorded, for a machine's Detail:
// it is asked on every Status and must not parse a certificate each time.
func cachedEKHash(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, ekHashFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
