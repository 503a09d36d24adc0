// Package memcheck decides, before a node fetches its modules, whether its
// memory can hold them. A netbooted node keeps every module file in RAM
// (the cache is on the /run tmpfs) and runs its root from them: a root that
// does not fit would be found out by the OOM killer mid-download or
// mid-switch, with nothing on the control plane to say why.
package memcheck

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// DefaultMargin is the memory left over once the modules are in: the
// root's own processes (a stock systemd with udev runs in about 40 MiB),
// the overlay's writable layer and the page cache the erofs mounts read
// through.
const DefaultMargin = 128 << 20

// Info is the node's memory as /proc/meminfo reports it, in bytes.
type Info struct {
	Total, Available uint64
}

// Read parses /proc/meminfo (or a copy at path).
func Read(path string) (Info, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Info{}, fmt.Errorf("memcheck: %w", err)
	}
	return Parse(b)
}

// Parse reads MemTotal and MemAvailable (kB) from meminfo text.
func Parse(b []byte) (Info, error) {
	var in Info
	var haveTotal, haveAvail bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "MemTotal" && key != "MemAvailable") {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return Info{}, fmt.Errorf("memcheck: meminfo line %q: want \"%s: N kB\"", sc.Text(), key)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return Info{}, fmt.Errorf("memcheck: meminfo %s: %w", key, err)
		}
		if key == "MemTotal" {
			in.Total, haveTotal = kb<<10, true
		} else {
			in.Available, haveAvail = kb<<10, true
		}
	}
	if !haveTotal || !haveAvail {
		return Info{}, fmt.Errorf("memcheck: meminfo lacks MemTotal or MemAvailable (kernel older than 3.14?)")
	}
	return in, nil
}

// Need is what a boot will hold in RAM.
type Need struct {
	Root, Extensions uint64 // module bytes
	Margin           uint64
}

// Total is everything the node must have available.
func (n Need) Total() uint64 { return n.Root + n.Extensions + n.Margin }

// Check returns an error naming every size when the node's available
// memory cannot hold n.
func Check(in Info, n Need) error {
	if n.Total() <= in.Available {
		return nil
	}
	return fmt.Errorf("the node's memory cannot hold its modules: root layers %s + extensions %s + margin %s = %s, "+
		"but only %s of the node's %s is available; give the machine more memory, or build smaller (compressed) modules",
		Size(n.Root), Size(n.Extensions), Size(n.Margin), Size(n.Total()), Size(in.Available), Size(in.Total))
}

// Size prints bytes in MiB (one decimal), the unit RAM is sized in.
func Size(b uint64) string {
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB"
}
