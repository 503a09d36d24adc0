package qemu

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/testkit/logbuf"
)

// The test binary doubles as a fake QEMU: when the provider launches it with
// fakeQEMUEnv set, TestMain serves QMP on the -qmp socket instead of running
// tests. That exercises real mode's process handling (own session, pid file,
// reaping, rediscovery, quit and SIGKILL) in milliseconds and without a VM.
const fakeQEMUEnv = "TETHER_FAKE_QEMU"

// Fake behaviours, selected by the env value.
const (
	fakeNormal    = "normal"    // ignores powerdown (like our agent), exits on quit
	fakePowerdown = "powerdown" // exits on powerdown, like a guest with ACPI
	fakeDeaf      = "deaf"      // answers quit but keeps running: needs SIGKILL
	fakeFail      = "fail"      // refuses to start, as QEMU does on a bad kernel
	fakeMute      = "mute"      // accepts QMP connections but never greets
)

// Files the fake writes into its working directory (the instance dir).
const (
	fakeDigestFile = "fake-token-digests" // one sha256 line per start
	fakeEventsFile = "fake-events"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeQEMUEnv); mode != "" {
		os.Exit(runFakeQEMU(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeEvent(format string, args ...any) {
	f, err := os.OpenFile(fakeEventsFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

func runFakeQEMU(mode string, args []string) int {
	var sock, tpmSock string
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-chardev":
			if rest, ok := strings.CutPrefix(args[i+1], "socket,id=chrtpm,path="); ok {
				tpmSock = rest
			}
		case "-qmp":
			v := strings.TrimPrefix(args[i+1], "unix:")
			sock, _, _ = strings.Cut(v, ",")
		case "-fw_cfg":
			if rest, ok := strings.CutPrefix(args[i+1], "name="+fwCfgToken+",file="); ok {
				b, err := os.ReadFile(rest)
				if err != nil {
					fmt.Fprintf(os.Stderr, "qemu-system-x86_64: -fw_cfg: can't load %s: %v\n", rest, err)
					return 1
				}
				sum := sha256.Sum256(b)
				f, _ := os.OpenFile(fakeDigestFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
				fmt.Fprintln(f, hex.EncodeToString(sum[:]))
				f.Close()
			}
		}
	}
	if mode == fakeFail {
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: could not load kernel '/nonexistent': No such file or directory")
		return 1
	}
	if sock == "" {
		fmt.Fprintln(os.Stderr, "fake qemu: no -qmp")
		return 2
	}
	if tpmSock != "" {
		// Like QEMU's -tpmdev emulator: connect to swtpm's control socket
		// at start-up and hold the connection for the VM's life.
		c, err := net.Dial("unix", tpmSock)
		if err != nil {
			fmt.Fprintf(os.Stderr, "qemu-system-x86_64: tpm-emulator: Failed to connect to socket %s: %v\n", tpmSock, err)
			return 1
		}
		defer c.Close()
		fakeEvent("tpm connected")
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake qemu:", err)
		return 1
	}
	fakeEvent("started")
	// Like QEMU, serve one client at a time.
	for {
		c, err := l.Accept()
		if err != nil {
			return 1
		}
		if mode == fakeMute {
			continue // never greet; keep the connection open
		}
		if code, exit := serveFakeQMP(c, mode); exit {
			return code
		}
	}
}

func serveFakeQMP(c net.Conn, mode string) (code int, exit bool) {
	defer c.Close()
	enc := json.NewEncoder(c)
	_ = enc.Encode(map[string]any{"QMP": map[string]any{
		"version":      map[string]any{"qemu": map[string]int{"major": 7, "minor": 2, "micro": 0}, "package": "fake"},
		"capabilities": []string{},
	}})
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		var cmd struct {
			Execute string `json:"execute"`
		}
		if err := json.Unmarshal(sc.Bytes(), &cmd); err != nil {
			continue
		}
		fakeEvent("qmp %s", cmd.Execute)
		switch cmd.Execute {
		case "qmp_capabilities":
			_ = enc.Encode(map[string]any{"return": map[string]any{}})
		case "query-status":
			_ = enc.Encode(map[string]any{"return": map[string]any{"status": "running", "running": true, "singlestep": false}})
		case "system_powerdown":
			_ = enc.Encode(map[string]any{"return": map[string]any{}})
			if mode == fakePowerdown {
				fakeEvent("exit on powerdown")
				return 0, true
			}
		case "quit":
			_ = enc.Encode(map[string]any{"return": map[string]any{}})
			if mode != fakeDeaf {
				fakeEvent("exit on quit")
				return 0, true
			}
		default:
			_ = enc.Encode(map[string]any{"error": map[string]any{"class": "CommandNotFound", "desc": "The command " + cmd.Execute + " has not been found"}})
		}
	}
	return 0, false
}

// syncBuffer collects log output from goroutines that may outlive a test
// (the reaper logs when a VM exits), which t.Log would not allow.
type syncBuffer = logbuf.Buffer

func testLogger(t *testing.T) (*slog.Logger, *syncBuffer) {
	buf := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("provider log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// shortTempDir returns a temporary directory with a short path, because a
// QMP socket path must fit in 107 bytes and t.TempDir names are long.
func shortTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "tq")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// waitFor polls cond for up to d; tests use it for effects of other processes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond) // polls an external (fake QEMU) process
	}
}
