package powerbutton

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func event(typ, code uint16, value int32) []byte {
	b := make([]byte, eventSize)
	binary.LittleEndian.PutUint16(b[16:], typ)
	binary.LittleEndian.PutUint16(b[18:], code)
	binary.LittleEndian.PutUint32(b[20:], uint32(value))
	return b
}

func TestWatch(t *testing.T) {
	const evSyn, keyA = 0, 30
	for _, tc := range []struct {
		name    string
		events  [][]byte
		presses int
		err     string
	}{
		{"press and release", [][]byte{event(evKey, keyPower, 1), event(evSyn, 0, 0), event(evKey, keyPower, 0)}, 1, ""},
		{"another key", [][]byte{event(evKey, keyA, 1)}, 0, ""},
		{"two presses", [][]byte{event(evKey, keyPower, 1), event(evKey, keyPower, 0), event(evKey, keyPower, 1)}, 2, ""},
		{"auto-repeat is not a press", [][]byte{event(evKey, keyPower, 2)}, 0, ""},
		{"truncated event", [][]byte{event(evKey, keyPower, 1)[:10]}, 0, "read event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in bytes.Buffer
			for _, e := range tc.events {
				in.Write(e)
			}
			n := 0
			err := Watch(context.Background(), &in, func() { n++ })
			if tc.err == "" && err != nil && !strings.Contains(err.Error(), "EOF") {
				t.Fatal(err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
			if n != tc.presses {
				t.Fatalf("presses = %d, want %d", n, tc.presses)
			}
		})
	}
}

func TestFind(t *testing.T) {
	sys := t.TempDir()
	for dev, name := range map[string]string{"event0": "AT Translated Set 2 keyboard", "event1": "Power Button", "event3": "Power Button\n"} {
		p := filepath.Join(sys, dev, "device")
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "name"), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Find(sys, "/dev/input")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "/dev/input/event1,/dev/input/event3" {
		t.Fatalf("Find = %v", got)
	}
	none, err := Find(t.TempDir(), "/dev/input")
	if err != nil || len(none) != 0 {
		t.Fatalf("no devices: %v %v", none, err)
	}
}
