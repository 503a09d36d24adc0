// Command tinyinit is the /init of the qemu provider's test initramfs. It
// proves a VM booted (a marker line on the console) and shows which
// enrollment data reached fw_cfg, printing the token only as a SHA-256 so
// that even a test token never appears in a log. Then it idles, as PID 1
// must never exit.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// These literals are mirrored in providers/qemu/qemutest.
const (
	prefix = "TETHER-TINYINIT: "
	marker = "TETHER-TINYINIT-READY"
	byName = "/sys/firmware/qemu_fw_cfg/by_name/"
)

func say(format string, args ...any) {
	// The kernel gives init /dev/console as stdout when the initramfs has
	// that device node.
	fmt.Fprintf(os.Stdout, prefix+format+"\n", args...)
}

func main() {
	say("up, pid %d", os.Getpid())
	for _, m := range []struct{ src, dst, fs string }{{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil {
			say("mount %s: %v", m.dst, err)
		}
	}
	loadModule("/qemu_fw_cfg.ko")
	if b, err := os.ReadFile(byName + "opt/tether/url/raw"); err == nil {
		say("url=%s", b)
	} else {
		say("url unreadable: %v", err)
	}
	if b, err := os.ReadFile(byName + "opt/tether/token/raw"); err == nil {
		sum := sha256.Sum256(b)
		say("token-sha256=%s", hex.EncodeToString(sum[:]))
	} else {
		say("token unreadable: %v", err)
	}
	if b, err := os.ReadFile(byName + "opt/tether/instance/raw"); err == nil {
		say("instance=%s", b)
	}
	reportTPM()
	fmt.Fprintln(os.Stdout, marker)
	for {
		time.Sleep(time.Hour)
	}
}

// loadModule loads a kernel module shipped in the initramfs; without
// qemu_fw_cfg the fw_cfg files are not visible, which the output then says.
func loadModule(path string) {
	f, err := os.Open(path)
	if err != nil {
		say("no %s: %v", path, err)
		return
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && err != unix.EEXIST {
		say("load %s: %v", path, err)
	}
}

// reportTPM says whether the kernel found a TPM (--qemu-tpm) and whether
// the firmware left it an event log of the boot's measurements.
func reportTPM() {
	for _, dev := range []string{"tpm0", "tpmrm0"} {
		class := "/sys/class/tpm/"
		if dev == "tpmrm0" {
			class = "/sys/class/tpmrm/"
		}
		if _, err := os.Stat(class + dev); err == nil {
			say("tpm-device=%s", dev)
		}
	}
	const sec = "/sys/kernel/security"
	if err := unix.Mount("securityfs", sec, "securityfs", 0, ""); err != nil {
		say("mount %s: %v", sec, err)
		return
	}
	if _, err := os.Stat(sec + "/tpm0"); err != nil {
		return
	}
	b, err := os.ReadFile(sec + "/tpm0/binary_bios_measurements")
	if err != nil {
		say("tpm-eventlog unreadable: %v", err)
		return
	}
	say("tpm-eventlog=%d bytes", len(b))
}
