// Package powerbutton watches the machine's ACPI power button, so that a
// provider's graceful stop (QEMU's system_powerdown, libvirt's shutdown, a
// BMC's soft off) reaches the agent. The kernel's ACPI button driver
// reports the press as KEY_POWER on an input device named "Power Button";
// the agent reads it through evdev. A root without a handler of its own
// (an initramfs, a systemd root without logind and D-Bus) would otherwise
// ignore the press until the provider pulls the plug.
package powerbutton

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Linux input event constants (linux/input-event-codes.h).
const (
	evKey    = 0x01
	keyPower = 116
)

// eventSize is struct input_event on 64-bit Linux: a timeval (two 64-bit
// words), type and code (16 bits each) and value (32 bits).
const eventSize = 24

// Find returns the /dev/input/eventN of every input device under sysClass
// (/sys/class/input) whose name is "Power Button", mapped under devDir.
func Find(sysClass, devDir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(sysClass, "event*", "device", "name"))
	if err != nil {
		return nil, fmt.Errorf("powerbutton: %w", err)
	}
	var devs []string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil || strings.TrimSpace(string(b)) != "Power Button" {
			continue
		}
		devs = append(devs, filepath.Join(devDir, filepath.Base(filepath.Dir(filepath.Dir(n)))))
	}
	return devs, nil
}

// Watch reads input events from r and calls pressed for every press of
// the power key, until r ends or ctx is done (the caller closes r to stop
// a blocked read).
func Watch(ctx context.Context, r io.Reader, pressed func()) error {
	buf := make([]byte, eventSize)
	for ctx.Err() == nil {
		if _, err := io.ReadFull(r, buf); err != nil {
			if ctx.Err() != nil || errors.Is(err, os.ErrClosed) {
				return nil
			}
			return fmt.Errorf("powerbutton: read event: %w", err)
		}
		typ := binary.LittleEndian.Uint16(buf[16:])
		code := binary.LittleEndian.Uint16(buf[18:])
		value := int32(binary.LittleEndian.Uint32(buf[20:]))
		if typ == evKey && code == keyPower && value == 1 {
			pressed()
		}
	}
	return nil
}

// Run finds the power buttons and watches them all until ctx is done,
// calling pressed on a press. No button (no ACPI, or the button and evdev
// modules not loaded) is not an error: it returns nil at once, after
// logf says so.
func Run(ctx context.Context, sysClass, devDir string, logf func(string, ...any), pressed func()) error {
	devs, err := Find(sysClass, devDir)
	if err != nil {
		return err
	}
	if len(devs) == 0 {
		logf("no ACPI power button found under %s (modules button and evdev); a provider's graceful stop will wait out its grace", sysClass)
		return nil
	}
	errs := make(chan error, len(devs))
	for _, d := range devs {
		f, err := os.Open(d)
		if err != nil {
			return fmt.Errorf("powerbutton: %w", err)
		}
		go func() { <-ctx.Done(); f.Close() }()
		go func() { errs <- Watch(ctx, f, pressed) }()
	}
	var all []error
	for range devs {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
