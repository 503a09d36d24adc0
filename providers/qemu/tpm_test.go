package qemu

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/providers"
	"github.com/tetherfleet/tether/providers/internal/operr"
	"github.com/tetherfleet/tether/providers/qemu/qemutest"
)

// requireSwtpm skips loudly when the TPM tools are missing.
func requireSwtpm(t *testing.T) {
	t.Helper()
	if err := checkTPMTools(); err != nil {
		qemutest.SkipLoudly(t, "%v", err)
	}
}

var ekHashRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func TestBuildArgvTPM(t *testing.T) {
	p := pathsFor("/s", "i-1")
	tpmArgs := []string{
		"-chardev", "socket,id=chrtpm,path=/s/i-1/swtpm.sock",
		"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
		"-device", "tpm-crb,tpmdev=tpm0",
	}
	for _, tc := range []struct {
		name string
		boot BootMode
		tpm  bool
	}{
		{"direct with TPM", BootDirect, true},
		{"direct without TPM", BootDirect, false},
		{"bios netboot with TPM: the firmware measures the boot", BootBIOS, true},
		{"uefi netboot with TPM", BootUEFI, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := buildArgv(launchSpec{Binary: "q", InstanceID: "i-1", Accel: "tcg", MemoryMiB: 512, CPUs: 1, Paths: p,
				Kernel: "k", Initramfs: "r", Boot: tc.boot, TPM: tc.tpm, OVMFCode: "/c"})
			i := slices.Index(argv, "-tpmdev")
			if !tc.tpm {
				if i >= 0 || strings.Contains(strings.Join(argv, " "), "tpm") {
					t.Fatalf("argv without TPM mentions one: %q", argv)
				}
				return
			}
			if i < 2 || !slices.Equal(argv[i-2:i+4], tpmArgs) {
				t.Fatalf("argv lacks the TPM options %q:\n%q", tpmArgs, argv)
			}
			// tpm-crb needs q35.
			if m := slices.Index(argv, "-M"); m < 0 || argv[m+1] != "q35" {
				t.Fatalf("machine is not q35: %q", argv)
			}
		})
	}
}

func TestBuildArgvInstanceAndTokenless(t *testing.T) {
	p := pathsFor("/s", "i-1")
	base := launchSpec{Binary: "q", InstanceID: "i-1", Accel: "tcg", MemoryMiB: 512, CPUs: 1, Paths: p, Kernel: "k", Initramfs: "r",
		URL: "https://10.0.2.2:7443", CA: "sha256:00ff"}
	for _, tc := range []struct {
		name      string
		instance  string
		withToken bool
		want      []string
		notWant   []string
	}{
		{"token and instance", "0b7e3c56-7b2c-4d1e-9d0a-6d1f2c3b4a59", true,
			[]string{"name=opt/tether/instance,string=0b7e3c56-7b2c-4d1e-9d0a-6d1f2c3b4a59", "name=opt/tether/token,file=/s/i-1/fw_cfg-token"}, nil},
		{"tokenless: instance, url and ca, no token", "i-1", false,
			[]string{"name=opt/tether/instance,string=i-1", "name=opt/tether/url,string=https://10.0.2.2:7443", "name=opt/tether/ca,string=sha256:00ff"},
			[]string{"opt/tether/token"}},
		{"no instance id: no entry", "", true, []string{"name=opt/tether/token,"}, []string{"opt/tether/instance"}},
		{"comma escaped", "a,b", false, []string{"name=opt/tether/instance,string=a,,b"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base
			s.Instance, s.WithToken = tc.instance, tc.withToken
			argv := buildArgv(s)
			joined := strings.Join(argv, " ")
			for _, w := range tc.want {
				if i := slices.IndexFunc(argv, func(a string) bool { return strings.HasPrefix(a, w) }); i < 1 || argv[i-1] != "-fw_cfg" {
					t.Errorf("argv lacks -fw_cfg %s: %s", w, joined)
				}
			}
			for _, nw := range tc.notWant {
				if strings.Contains(joined, nw) {
					t.Errorf("argv has %s: %s", nw, joined)
				}
			}
		})
	}
}

// The instance id reaches fw_cfg through the provider, and a boot without a
// token writes no token file and no token entry.
func TestRecorderTokenlessBootWithTPM(t *testing.T) {
	p, err := newProvider(Config{Mode: ModeRecorder, StateDir: "/s", TPM: true}, noKVM)
	if err != nil {
		t.Fatal(err)
	}
	b := testBoot("")
	b.Enrollment.InstanceID = "i-1"
	if _, err := p.Provision(context.Background(), providers.Spec{InstanceID: "i-1", Node: "node-a", Boot: b}); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(context.Background(), "i-1"); err != nil {
		t.Fatal(err)
	}
	rec := p.Recorded()
	joined := strings.Join(rec[0].Argv, " ")
	for _, w := range []string{"name=opt/tether/instance,string=i-1", "-tpmdev emulator,id=tpm0,chardev=chrtpm", "-device tpm-crb,tpmdev=tpm0"} {
		if !strings.Contains(joined, w) {
			t.Errorf("argv lacks %q: %s", w, joined)
		}
	}
	if strings.Contains(joined, "opt/tether/token") || strings.Contains(strings.Join(rec[0].Steps, "|"), "fw_cfg-token") {
		t.Errorf("tokenless boot has a token entry or file: %s %q", joined, rec[0].Steps)
	}
	if !slices.ContainsFunc(rec[0].Steps, func(s string) bool { return strings.Contains(s, "/s/tpm/node-a") }) {
		t.Errorf("steps do not name the node's TPM: %q", rec[0].Steps)
	}
	if !slices.Contains(rec[1].Steps, "keep /s/tpm/node-a") {
		t.Errorf("terminate steps do not keep the node's TPM: %q", rec[1].Steps)
	}
}

func TestTPMRefusals(t *testing.T) {
	t.Run("instance id tpm is reserved", func(t *testing.T) {
		err := checkID(operr.Provision, tpmDirName)
		if err == nil || providers.KindOf(err) != providers.KindPermanent || !strings.Contains(err.Error(), "reserved") {
			t.Fatalf("checkID(tpm) = %v", err)
		}
	})
	t.Run("comma in the state dir", func(t *testing.T) {
		_, err := newProvider(Config{Mode: ModeRecorder, StateDir: "/a,b", TPM: true}, noKVM)
		if err == nil || !strings.Contains(err.Error(), "comma") {
			t.Fatalf("New = %v", err)
		}
	})
	t.Run("node that is no path element", func(t *testing.T) {
		p, err := newProvider(Config{Mode: ModeRecorder, StateDir: "/s", TPM: true}, noKVM)
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Provision(context.Background(), providers.Spec{InstanceID: "i-1", Node: "../etc", Boot: testBoot("t")})
		if err == nil || providers.KindOf(err) != providers.KindPermanent {
			t.Fatalf("Provision(node ../etc) = %v", err)
		}
		if _, err := p.PrepareNodeTPM("../etc"); err == nil {
			t.Fatal("PrepareNodeTPM(../etc) succeeded")
		}
	})
}

// A missing swtpm is a clear error when the provider is made, so tetherd
// refuses to start with --qemu-tpm rather than fail every boot later.
func TestMissingSwtpmIsAClearError(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := newProvider(Config{Mode: ModeReal, StateDir: shortTempDir(t), TPM: true}, noKVM)
	if err == nil || !strings.Contains(err.Error(), "swtpm") || !strings.Contains(err.Error(), "install the swtpm and swtpm-tools packages") {
		t.Fatalf("New with TPM and no swtpm = %v", err)
	}
	// Without the TPM, or in recorder mode, swtpm is not needed.
	if _, err := newProvider(Config{Mode: ModeReal, StateDir: shortTempDir(t)}, noKVM); err != nil {
		t.Fatalf("New without TPM: %v", err)
	}
	if _, err := newProvider(Config{Mode: ModeRecorder, StateDir: "/s", TPM: true}, noKVM); err != nil {
		t.Fatalf("recorder with TPM: %v", err)
	}
	if _, err := PrepareTPM(filepath.Join(t.TempDir(), "n")); err == nil || !strings.Contains(err.Error(), "swtpm") {
		t.Fatalf("PrepareTPM without swtpm = %v", err)
	}
}

func selfSigned(t *testing.T, pub, priv any) string {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ek"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ek.crt")
	if err := os.WriteFile(path, der, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestEKHashOfCert(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		pub, priv any
	}{{"rsa", &rk.PublicKey, rk}, {"ecc", &ek.PublicKey, ek}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ekHashOfCert(selfSigned(t, tc.pub, tc.priv))
			if err != nil {
				t.Fatal(err)
			}
			der, _ := x509.MarshalPKIXPublicKey(tc.pub)
			sum := sha256.Sum256(der)
			if want := "sha256:" + hex.EncodeToString(sum[:]); got != want {
				t.Fatalf("hash = %s, want %s", got, want)
			}
		})
	}
	bad := filepath.Join(t.TempDir(), "bad.crt")
	_ = os.WriteFile(bad, []byte("not a certificate"), 0o600)
	if _, err := ekHashOfCert(bad); err == nil {
		t.Fatal("garbage certificate accepted")
	}
	if _, err := ekHashOfCert(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("missing certificate accepted")
	}
	if _, err := tpmEKHash(t.TempDir()); !os.IsNotExist(err) {
		t.Fatalf("tpmEKHash(empty dir) = %v, want not-exist", err)
	}
}

// PrepareTPM makes a TPM once: a second call keeps it (same EK), another
// directory is another TPM, and no CA private key is left behind.
func TestPrepareTPM(t *testing.T) {
	requireSwtpm(t)
	base := t.TempDir()
	dir := filepath.Join(base, "tpm", "node-a")
	h1, err := PrepareTPM(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !ekHashRE.MatchString(h1) {
		t.Fatalf("EK hash %q", h1)
	}
	h2, err := PrepareTPM(dir)
	if err != nil || h2 != h1 {
		t.Fatalf("second PrepareTPM = %s, %v; want %s", h2, err, h1)
	}
	if c := cachedEKHash(dir); c != h1 {
		t.Fatalf("cached hash %q, want %q", c, h1)
	}
	// The hash is of the certificate's key, which is the TPM's EK:
	// openssl agrees on the key inside the certificate.
	if _, err := exec.LookPath("openssl"); err == nil {
		out, err := exec.Command("sh", "-c", "openssl x509 -inform der -in "+filepath.Join(dir, ekCertFile)+" -noout -pubkey | openssl pkey -pubin -outform der | sha256sum").Output()
		if err != nil {
			t.Fatal(err)
		}
		if want := "sha256:" + strings.Fields(string(out))[0]; want != h1 {
			t.Fatalf("openssl says %s, we say %s", want, h1)
		}
	}
	other, err := PrepareTPM(filepath.Join(base, "tpm", "node-b"))
	if err != nil {
		t.Fatal(err)
	}
	if other == h1 {
		t.Fatal("two TPMs share an EK")
	}
	_ = filepath.Walk(base, func(path string, fi os.FileInfo, err error) error {
		if err == nil && strings.Contains(fi.Name(), "privkey") || fi != nil && fi.Name() == "signkey.pem" {
			t.Errorf("private key left: %s", path)
		}
		if err == nil && strings.Contains(path, ".setup-") {
			t.Errorf("setup directory left: %s", path)
		}
		return nil
	})
}

// swtpmOf returns the pid of the instance's swtpm, 0 when none runs.
func swtpmOf(stateDir, id string) int {
	return findVM(pathsFor(stateDir, id).swtpmPIDArg())
}

// The swtpm lifecycle against the fake QEMU: one swtpm per boot, started
// before QEMU (which connects to it), ended with QEMU on stop, reboot and
// terminate, also when a restarted control plane terminates a VM it did not
// start; the node's TPM, and so its EK, outlives every instance.
func TestRealTPMLifecycleWithFakeQEMU(t *testing.T) {
	requireSwtpm(t)
	var e *fakeEnv
	// Registered first, so it runs after the fake env has killed its VMs.
	t.Cleanup(func() {
		for _, id := range []string{"t-1", "t-2"} {
			if pid := swtpmOf(e.stateDir, id); pid > 0 {
				t.Errorf("swtpm of %s (pid %d) outlived the test", id, pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	e = newFakeEnv(t, fakeNormal, func(c *Config) { c.TPM = true })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodeEK, err := e.p.PrepareNodeTPM("node-a")
	if err != nil {
		t.Fatal(err)
	}
	boot := e.boot("tok-" + strings.Repeat("1", 32))
	boot.Enrollment.InstanceID = "t-1"
	m, err := e.p.Provision(ctx, providers.Spec{InstanceID: "t-1", Node: "node-a", Boot: boot})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m.Detail, "tpm ek "+nodeEK) {
		t.Fatalf("detail %q lacks the node's EK %s", m.Detail, nodeEK)
	}
	if h := e.p.TPMEKHash("t-1"); h != nodeEK {
		t.Fatalf("TPMEKHash = %q, want %s", h, nodeEK)
	}
	if h := e.p.TPMEKHash("../x"); h != "" {
		t.Fatalf("TPMEKHash(../x) = %q", h)
	}
	sw1 := swtpmOf(e.stateDir, "t-1")
	if sw1 == 0 {
		t.Fatal("no swtpm runs for the VM")
	}
	waitFor(t, 5*time.Second, "the fake QEMU to connect to swtpm", func() bool {
		return strings.Contains(e.file("t-1", fakeEventsFile), "tpm connected")
	})

	// Reboot: a new swtpm on the same state, the old one gone.
	if _, err := e.p.Reboot(ctx, "t-1", boot); err != nil {
		t.Fatal(err)
	}
	sw2 := swtpmOf(e.stateDir, "t-1")
	if sw2 == 0 || sw2 == sw1 || alive(sw1) {
		t.Fatalf("after reboot swtpm pids %d -> %d (old alive: %v)", sw1, sw2, alive(sw1))
	}
	if st := mustState(t, e.p, "t-1", providers.StateRunning); !strings.Contains(st.Detail, nodeEK) {
		t.Fatalf("EK changed across reboot: %q", st.Detail)
	}

	// Stop ends swtpm; start brings one back.
	if _, err := e.p.Stop(ctx, "t-1"); err != nil {
		t.Fatal(err)
	}
	if pid := swtpmOf(e.stateDir, "t-1"); pid != 0 || alive(sw2) {
		t.Fatalf("swtpm alive after stop: %d", pid)
	}
	if _, err := e.p.Start(ctx, "t-1", boot); err != nil {
		t.Fatal(err)
	}
	sw3 := swtpmOf(e.stateDir, "t-1")
	if sw3 == 0 {
		t.Fatal("no swtpm after start")
	}

	// A control plane restart (tetherd's Ctrl-C leaves VMs running): the
	// next one terminates a VM and a swtpm it is not parent of.
	p2, err := New(e.p.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Terminate(ctx, "t-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "swtpm to go after terminate", func() bool { return !alive(sw3) })
	if pid := swtpmOf(e.stateDir, "t-1"); pid != 0 {
		t.Fatalf("swtpm pid %d after terminate", pid)
	}
	if _, err := os.Stat(pathsFor(e.stateDir, "t-1").dir); !os.IsNotExist(err) {
		t.Fatalf("instance dir after terminate: %v", err)
	}
	if h, err := tpmEKHash(TPMDir(e.stateDir, "node-a")); err != nil || h != nodeEK {
		t.Fatalf("node TPM after terminate: %s, %v", h, err)
	}

	// The node's next instance presents the same EK; List shows no
	// machine for the tpm directory.
	if m, err := e.p.Provision(ctx, providers.Spec{InstanceID: "t-2", Node: "node-a", Boot: boot}); err != nil || !strings.Contains(m.Detail, nodeEK) {
		t.Fatalf("second instance = %+v, %v", m, err)
	}
	list, err := e.p.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "t-2" {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if err := e.p.Terminate(ctx, "t-2"); err != nil {
		t.Fatal(err)
	}
	if pid := swtpmOf(e.stateDir, "t-2"); pid != 0 {
		t.Fatalf("swtpm pid %d after terminate", pid)
	}
}

// A QEMU that refuses to start leaves no swtpm behind.
func TestRealTPMLaunchFailureLeavesNoSwtpm(t *testing.T) {
	requireSwtpm(t)
	e := newFakeEnv(t, fakeFail, func(c *Config) { c.TPM = true })
	_, err := e.p.Provision(context.Background(), providers.Spec{InstanceID: "f-1", Node: "node-f", Boot: e.boot("tok-" + strings.Repeat("2", 32))})
	if err == nil || providers.KindOf(err) != providers.KindPermanent {
		t.Fatalf("provision = %v, want a permanent error", err)
	}
	if pid := swtpmOf(e.stateDir, "f-1"); pid != 0 {
		t.Fatalf("swtpm pid %d outlived a failed launch", pid)
	}
	if strings.Contains(err.Error(), "swtpm exited") {
		t.Fatalf("error blames swtpm for QEMU's failure: %v", err)
	}
	if _, err := tpmEKHash(TPMDir(e.stateDir, "node-f")); err != nil {
		t.Fatalf("the node's TPM went with the failed launch: %v", err)
	}
}

func TestTPMFailureNamesSwtpm(t *testing.T) {
	dir := t.TempDir()
	p := pathsFor(dir, "i")
	_ = os.MkdirAll(p.dir, 0o700)
	_ = os.WriteFile(p.tpmLog, []byte("=== header\nswtpm: Could not open TPM state\n"), 0o600)
	tp := &proc{done: make(chan struct{})}
	close(tp.done)
	if err := tpmFailure(&proc{tpmDied: true}, tp, p); err == nil || !strings.Contains(err.Error(), "swtpm exited during start-up") || !strings.Contains(err.Error(), "Could not open TPM state") {
		t.Fatalf("tpmFailure = %v", err)
	}
	if err := tpmFailure(&proc{}, tp, p); err != nil {
		t.Fatalf("swtpm that died after QEMU blamed: %v", err)
	}
	if err := tpmFailure(&proc{tpmDied: true}, nil, p); err != nil {
		t.Fatalf("no TPM blamed: %v", err)
	}
}

// A launch given up on (the caller's context ends, as on tetherd's Ctrl-C
// while a boot waits for QMP) kills QEMU and its swtpm with it.
func TestRealTPMAbandonedLaunchLeavesNoSwtpm(t *testing.T) {
	requireSwtpm(t)
	e := newFakeEnv(t, fakeMute, func(c *Config) { c.TPM = true })
	if _, err := e.p.PrepareNodeTPM("node-m"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := e.p.Provision(ctx, providers.Spec{InstanceID: "m-1", Node: "node-m", Boot: e.boot("tok-" + strings.Repeat("3", 32))})
	if err == nil {
		t.Fatal("provision against a mute QEMU succeeded")
	}
	if pid := swtpmOf(e.stateDir, "m-1"); pid != 0 {
		t.Fatalf("swtpm pid %d outlived an abandoned launch", pid)
	}
}

// Two VMs of one node cannot share its TPM: the second boot is refused
// with a reason, and the first keeps running with its swtpm.
func TestRealTPMInUseByAnotherVM(t *testing.T) {
	requireSwtpm(t)
	e := newFakeEnv(t, fakeNormal, func(c *Config) { c.TPM = true })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.p.Provision(ctx, providers.Spec{InstanceID: "u-1", Node: "node-u", Boot: e.boot("tok-" + strings.Repeat("4", 32))}); err != nil {
		t.Fatal(err)
	}
	_, err := e.p.Provision(ctx, providers.Spec{InstanceID: "u-2", Node: "node-u", Boot: e.boot("tok-" + strings.Repeat("5", 32))})
	if err == nil || !strings.Contains(err.Error(), "in use by another VM") {
		t.Fatalf("second VM of the node = %v", err)
	}
	if pid := swtpmOf(e.stateDir, "u-2"); pid != 0 {
		t.Fatalf("swtpm %d started for the refused VM", pid)
	}
	mustState(t, e.p, "u-1", providers.StateRunning)
	if swtpmOf(e.stateDir, "u-1") == 0 {
		t.Fatal("the first VM lost its swtpm")
	}
	if err := e.p.Terminate(ctx, "u-1"); err != nil {
		t.Fatal(err)
	}
	if pid := swtpmOf(e.stateDir, "u-1"); pid != 0 {
		t.Fatalf("swtpm %d after terminate", pid)
	}
}
