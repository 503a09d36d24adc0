package qemu

import (
	"bufio"
	"bytes"
	"os"
	"strings"
)

// kvmProbe reports whether KVM can really run guests here, and why.
type kvmProbe func() (ok bool, reason string)

// kvmUsable is the production probe. Being able to open /dev/kvm is not
// enough: on hosts that offer KVM through a paravirtual backend (kvm_pvm on a
// nested sandbox) the device opens, but an ordinary guest hangs during boot
// or QEMU aborts setting MSRs. Those hosts do not advertise the hardware
// virtualization flags that KVM's standard backends need, so we require vmx
// or svm in /proc/cpuinfo as well.
func kvmUsable() (bool, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, "cannot open /dev/kvm read-write: " + err.Error()
	}
	f.Close()
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false, "cannot read /proc/cpuinfo: " + err.Error()
	}
	if !hasVirtFlag(cpuinfo) {
		return false, "/dev/kvm opens but the CPU advertises neither vmx nor svm (paravirtual or nested KVM that cannot run a standard guest)"
	}
	return true, "/dev/kvm is usable and the CPU has hardware virtualization"
}

// hasVirtFlag reports whether any "flags" line of cpuinfo lists vmx or svm.
func hasVirtFlag(cpuinfo []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		for _, f := range strings.Fields(val) {
			if f == "vmx" || f == "svm" {
				return true
			}
		}
	}
	return false
}

// resolveAccel turns Config.Accel into the value for -accel.
func resolveAccel(accel string, probe kvmProbe) (string, string) {
	switch accel {
	case AccelKVM:
		return AccelKVM, "configured"
	case AccelTCG:
		return AccelTCG, "configured"
	}
	ok, why := probe()
	if ok {
		return AccelKVM, why
	}
	return AccelTCG, why
}
