package qemu

import (
	"slices"
	"strings"
	"testing"
)

// The template's signers reach the VM as fw_cfg opt/tether/signers, with
// QEMU's comma escaping.
func TestArgvCarriesSignerAnchor(t *testing.T) {
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	p := pathsFor(t.TempDir(), "i")
	argv := buildArgv(launchSpec{Binary: "q", InstanceID: "i", Accel: "tcg", MemoryMiB: 512, CPUs: 1, Paths: p, Kernel: "k", Initramfs: "r", Signers: []string{a, b}})
	want := "name=opt/tether/signers,string=" + a + ",," + b
	if i := slices.Index(argv, want); i < 1 || argv[i-1] != "-fw_cfg" {
		t.Fatalf("argv lacks -fw_cfg %s:\n%v", want, argv)
	}
	none := buildArgv(launchSpec{Binary: "q", InstanceID: "i", Accel: "tcg", MemoryMiB: 512, CPUs: 1, Paths: p, Kernel: "k", Initramfs: "r"})
	if strings.Contains(strings.Join(none, " "), "opt/tether/signers") {
		t.Fatal("a template without signers must not pass an empty anchor")
	}
}
