package qemu

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/providers"
)

const testToken = "tok-SECRET-0123456789abcdef"

func testBoot(token string) providers.Boot {
	return providers.Boot{
		KernelPath:    "/boot/vmlinuz",
		InitramfsPath: "/boot/initramfs.cpio",
		KernelArgs:    " tether.debug=1 ",
		Enrollment: providers.Enrollment{
			ControlPlaneURL: "https://10.0.2.2:7443",
			Token:           token,
			CAFingerprint:   "sha256:00ff",
		},
	}
}

func noKVM() (bool, string)  { return false, "test: no kvm" }
func yesKVM() (bool, string) { return true, "test: kvm" }

func TestParseMode(t *testing.T) {
	tests := []struct {
		in      string
		want    Mode
		wantErr bool
	}{
		{"real", ModeReal, false},
		{"recorder", ModeRecorder, false},
		{"disabled", ModeDisabled, false},
		{"", "", true},
		{"local", "", true},
		{"Real", "", true},
		{"real ", "", true},
	}
	for _, tt := range tests {
		got, err := ParseMode(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "real, recorder or disabled") {
			t.Errorf("ParseMode(%q) error %q does not list the valid modes", tt.in, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"unknown mode", Config{Mode: "local", StateDir: "/x"}, "unknown mode"},
		{"no state dir", Config{Mode: ModeReal}, "StateDir is required"},
		{"recorder needs state dir", Config{Mode: ModeRecorder}, "StateDir is required"},
		{"bad accel", Config{Mode: ModeRecorder, StateDir: "/x", Accel: "hvf"}, "unknown accel"},
		{"negative memory", Config{Mode: ModeRecorder, StateDir: "/x", MemoryMiB: -1}, "negative"},
		{"disabled needs nothing", Config{Mode: ModeDisabled}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newProvider(tt.cfg, noKVM)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}

	c, err := Config{Mode: ModeRecorder, StateDir: "/x"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Binary != "qemu-system-x86_64" || c.MemoryMiB != 512 || c.CPUs != 1 || c.Accel != "auto" ||
		c.StopGrace != 30*time.Second || c.Logger == nil || c.Clock == nil {
		t.Fatalf("defaults = %+v", c)
	}
}

func TestBuildArgvGolden(t *testing.T) {
	p := pathsFor("/var/lib/tether/qemu", "inst-1")
	got := buildArgv(launchSpec{
		Binary:     "/usr/bin/qemu-system-x86_64",
		InstanceID: "inst-1",
		Accel:      "tcg",
		MemoryMiB:  512,
		CPUs:       1,
		Paths:      p,
		Kernel:     "/boot/vmlinuz",
		Initramfs:  "/boot/initramfs.cpio",
		KernelArgs: " tether.debug=1 ",
		URL:        "https://10.0.2.2:7443",
		CA:         "sha256:00ff",
		WithToken:  true,
	})
	want := []string{
		"/usr/bin/qemu-system-x86_64",
		"-name", "guest=tether-inst-1",
		"-M", "q35",
		"-accel", "tcg",
		"-cpu", "max,aes=off",
		"-m", "512",
		"-smp", "1",
		"-nodefaults",
		"-nographic",
		"-no-reboot",
		"-netdev", "user,id=n0",
		"-device", "virtio-net-pci,netdev=n0",
		"-device", "virtio-rng-pci",
		"-kernel", "/boot/vmlinuz",
		"-initrd", "/boot/initramfs.cpio",
		"-append", "console=ttyS0 panic=-1 ip=10.0.2.15::10.0.2.2:255.255.255.0::eth0:off tether.debug=1",
		"-chardev", "file,id=ser0,path=/var/lib/tether/qemu/inst-1/console.log,append=on",
		"-serial", "chardev:ser0",
		"-qmp", "unix:/var/lib/tether/qemu/inst-1/qmp.sock,server=on,wait=off",
		"-fw_cfg", "name=opt/tether/url,string=https://10.0.2.2:7443",
		"-fw_cfg", "name=opt/tether/ca,string=sha256:00ff",
		"-fw_cfg", "name=opt/tether/token,file=/var/lib/tether/qemu/inst-1/fw_cfg-token",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("argv mismatch\n got: %q\nwant: %q", got, want)
	}
}

func TestBuildArgvEscapesAndOmits(t *testing.T) {
	p := pathsFor("/srv/a,b", "i")
	argv := buildArgv(launchSpec{Binary: "q", InstanceID: "i", Accel: "kvm", MemoryMiB: 1024, CPUs: 2, Paths: p, Kernel: "k", Initramfs: "r"})
	joined := strings.Join(argv, " ")
	for _, want := range []string{"path=/srv/a,,b/i/console.log,append=on", "unix:/srv/a,,b/i/qmp.sock,server=on", "-accel kvm", "-m 1024", "-smp 2"} {
		if !strings.Contains(joined, want) {
			t.Errorf("argv lacks %q: %s", want, joined)
		}
	}
	if strings.Contains(joined, "fw_cfg") {
		t.Errorf("empty enrollment still produced fw_cfg entries: %s", joined)
	}
	if got := argv[slices.Index(argv, "-append")+1]; got != baseKernelArgs {
		t.Errorf("append = %q, want base args only", got)
	}
}

func TestRedact(t *testing.T) {
	got := redact([]string{"a", "x=" + testToken, "b"}, testToken, "")
	if strings.Contains(strings.Join(got, " "), testToken) || got[1] != "x=<redacted>" {
		t.Fatalf("redact = %q", got)
	}
}

func TestCheckID(t *testing.T) {
	for _, id := range []string{"a", "inst-1", "0b1c2d3e-aaaa-bbbb-cccc-0123456789ab", "a.b_c"} {
		if err := checkID("status", id); err != nil {
			t.Errorf("checkID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "../x", "a/b", "a,b", "-a", "external:i", strings.Repeat("a", 65), "a b"} {
		err := checkID("status", id)
		if providers.KindOf(err) != providers.KindPermanent || err == nil {
			t.Errorf("checkID(%q) = %v, want permanent error", id, err)
		}
	}
}

func TestAccel(t *testing.T) {
	tests := []struct {
		accel string
		probe kvmProbe
		want  string
	}{
		{"auto", yesKVM, "kvm"},
		{"auto", noKVM, "tcg"},
		{"kvm", noKVM, "kvm"},
		{"tcg", yesKVM, "tcg"},
	}
	for _, tt := range tests {
		if got, _ := resolveAccel(tt.accel, tt.probe); got != tt.want {
			t.Errorf("resolveAccel(%s) = %s, want %s", tt.accel, got, tt.want)
		}
	}
	p, err := newProvider(Config{Mode: ModeRecorder, StateDir: "/x"}, noKVM)
	if err != nil || p.Accel() != "tcg" {
		t.Fatalf("auto without kvm: accel %q, %v", p.Accel(), err)
	}
}

func TestHasVirtFlag(t *testing.T) {
	tests := []struct {
		name    string
		cpuinfo string
		want    bool
	}{
		{"intel", "processor\t: 0\nflags\t\t: fpu vme vmx sse\n", true},
		{"amd", "flags\t\t: fpu svm lm\n", true},
		{"nested pvm", "flags\t\t: fpu vme hypervisor sse4_2 avx\n", false},
		{"substring is not a flag", "flags\t\t: vmxx svm_lock\n", false},
		{"flag outside flags line", "bugs\t\t: vmx\n", false},
		{"empty", "", false},
	}
	for _, tt := range tests {
		if got := hasVirtFlag([]byte(tt.cpuinfo)); got != tt.want {
			t.Errorf("%s: hasVirtFlag = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestMachineState(t *testing.T) {
	tests := []struct {
		st   vmStatus
		want providers.MachineState
	}{
		{vmStatus{Status: "running", Running: true}, providers.StateRunning},
		{vmStatus{Status: "paused"}, providers.StatePaused},
		{vmStatus{Status: "suspended"}, providers.StatePaused},
		{vmStatus{Status: "prelaunch"}, providers.StatePaused},
		{vmStatus{Status: "guest-panicked"}, providers.StateUnknown},
		{vmStatus{Status: "internal-error"}, providers.StateUnknown},
		{vmStatus{Status: "colo", Running: true}, providers.StateRunning},
	}
	for _, tt := range tests {
		if got := machineState(tt.st); got != tt.want {
			t.Errorf("machineState(%+v) = %s, want %s", tt.st, got, tt.want)
		}
	}
	if _, err := parseQueryStatus([]byte(`{"error":{"desc":"x"}}`)); err == nil {
		t.Error("parseQueryStatus accepted an answer without return")
	}
}

func TestDisabledRefusesEverything(t *testing.T) {
	ctx := context.Background()
	p, err := New(Config{Mode: ModeDisabled})
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func() error{
		"provision": func() error {
			_, err := p.Provision(ctx, providers.Spec{InstanceID: "i", Boot: testBoot(testToken)})
			return err
		},
		"start":     func() error { _, err := p.Start(ctx, "i", testBoot(testToken)); return err },
		"stop":      func() error { _, err := p.Stop(ctx, "i"); return err },
		"reboot":    func() error { _, err := p.Reboot(ctx, "i", testBoot(testToken)); return err },
		"terminate": func() error { return p.Terminate(ctx, "i") },
		"status":    func() error { _, err := p.Status(ctx, "i"); return err },
		"list":      func() error { _, err := p.List(ctx); return err },
	}
	for op, call := range calls {
		err := call()
		var pe *providers.Error
		if !errors.As(err, &pe) || pe.Kind != providers.KindUnsupported || pe.Op != op || pe.Provider != "qemu" {
			t.Errorf("%s: err = %#v, want unsupported", op, err)
			continue
		}
		if !strings.Contains(err.Error(), "qemu provider disabled") {
			t.Errorf("%s: err %q lacks the reason", op, err)
		}
	}
	if p.ConsoleLogPath("i") != "" || p.Recorded() != nil || p.Name() != "qemu" {
		t.Error("disabled provider exposes paths or records")
	}
}

func TestRecorder(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	p, err := newProvider(Config{Mode: ModeRecorder, StateDir: "/var/lib/tether/qemu", StopGrace: 2 * time.Second, Clock: clock.NewFake(at)}, noKVM)
	if err != nil {
		t.Fatal(err)
	}

	m, err := p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: testBoot(testToken)})
	if err != nil || m.State != providers.StateRunning || m.ID != "inst-1" {
		t.Fatalf("provision = %+v, %v", m, err)
	}
	if _, err := p.Provision(ctx, providers.Spec{InstanceID: "inst-1", Boot: testBoot("other")}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		call func() error
	}{
		{"stop", func() error { _, err := p.Stop(ctx, "inst-1"); return err }},
		{"stop again", func() error { _, err := p.Stop(ctx, "inst-1"); return err }},
		{"start", func() error { _, err := p.Start(ctx, "inst-1", testBoot("tok-2")); return err }},
		{"start again", func() error { _, err := p.Start(ctx, "inst-1", testBoot("tok-x")); return err }},
		{"reboot", func() error { _, err := p.Reboot(ctx, "inst-1", testBoot("tok-3")); return err }},
		{"terminate", func() error { return p.Terminate(ctx, "inst-1") }},
		{"terminate again", func() error { return p.Terminate(ctx, "inst-1") }},
	}
	for _, s := range steps {
		if err := s.call(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}

	got := p.Recorded()
	wantOps := []string{"provision", "stop", "start", "reboot", "terminate"}
	if len(got) != len(wantOps) {
		t.Fatalf("recorded %d entries, want %d (idempotent repeats record nothing): %+v", len(got), len(wantOps), got)
	}
	for i, e := range got {
		if e.Op != wantOps[i] || e.InstanceID != "inst-1" || !e.At.Equal(at) {
			t.Errorf("entry %d = %+v, want op %s", i, e, wantOps[i])
		}
		for _, s := range append(append(slices.Clone(e.Argv), e.QMP...), e.Steps...) {
			for _, tok := range []string{testToken, "tok-2", "tok-3"} {
				if strings.Contains(s, tok) {
					t.Errorf("entry %d leaks a token: %q", i, s)
				}
			}
		}
	}
	wantArgv := buildArgv(launchSpec{
		Binary: "qemu-system-x86_64", InstanceID: "inst-1", Accel: "tcg", MemoryMiB: 512, CPUs: 1,
		Paths: pathsFor("/var/lib/tether/qemu", "inst-1"), Kernel: "/boot/vmlinuz", Initramfs: "/boot/initramfs.cpio",
		KernelArgs: " tether.debug=1 ", URL: "https://10.0.2.2:7443", CA: "sha256:00ff", WithToken: true,
	})
	if !slices.Equal(got[0].Argv, wantArgv) {
		t.Errorf("provision argv = %q\nwant %q", got[0].Argv, wantArgv)
	}
	if !slices.Equal(got[1].QMP, []string{"system_powerdown", "quit"}) || !strings.Contains(strings.Join(got[1].Steps, ";"), "wait 2s") {
		t.Errorf("stop entry = %+v", got[1])
	}
	if !slices.Equal(got[3].QMP, []string{"system_powerdown", "quit", "query-status"}) || len(got[3].Argv) == 0 {
		t.Errorf("reboot entry = %+v", got[3])
	}
	if got[4].Result != providers.StateGone {
		t.Errorf("terminate entry = %+v", got[4])
	}

	if st, err := p.Status(ctx, "inst-1"); err != nil || st.State != providers.StateGone {
		t.Fatalf("status after terminate = %+v, %v", st, err)
	}
	for name, call := range map[string]func() error{
		"start":  func() error { _, err := p.Start(ctx, "inst-1", testBoot("t")); return err },
		"stop":   func() error { _, err := p.Stop(ctx, "inst-1"); return err },
		"reboot": func() error { _, err := p.Reboot(ctx, "inst-1", testBoot("t")); return err },
	} {
		if err := call(); !providers.IsNotFound(err) {
			t.Errorf("%s of gone machine: %v, want not found", name, err)
		}
	}
	if _, err := p.Provision(ctx, providers.Spec{InstanceID: "i2"}); providers.KindOf(err) != providers.KindPermanent {
		t.Errorf("provision without kernel: %v", err)
	}
	if p.ConsoleLogPath("inst-1") != "/var/lib/tether/qemu/inst-1/console.log" || p.ConsoleLogPath("../x") != "" {
		t.Errorf("ConsoleLogPath = %q", p.ConsoleLogPath("inst-1"))
	}
}

func TestRecorderIsBounded(t *testing.T) {
	ctx := context.Background()
	p, err := newProvider(Config{Mode: ModeRecorder, StateDir: "/s", RecorderLimit: 3}, noKVM)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		if _, err := p.Provision(ctx, providers.Spec{InstanceID: id, Boot: testBoot("t")}); err != nil {
			t.Fatal(err)
		}
	}
	got := p.Recorded()
	if len(got) != 3 || got[0].InstanceID != "c" || got[2].InstanceID != "e" {
		t.Fatalf("recorded = %+v, want the last 3", got)
	}
	list, _ := p.List(ctx)
	if len(list) != 5 {
		t.Fatalf("list = %d machines, want 5 (the cap is on records, not machines)", len(list))
	}
}
