package tetherctl

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/internal/clock"
	"github.com/tetherfleet/tether/internal/modulebuild"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		err  bool
	}{
		{"4096", 4096, false},
		{"8GiB", 8 << 30, false},
		{"512MiB", 512 << 20, false},
		{"1G", 1e9, false},
		{"10 KiB", 10 << 10, false},
		{"0", 0, true},
		{"-1GiB", 0, true},
		{"lots", 0, true},
		{"9999999TiB", 0, true},
	} {
		got, err := parseSize(c.in)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.err)
		}
	}
}

// Off a terminal, build progress is a line per stage and one every
// progressEvery within a stage, not one per report.
func TestStageProgressLines(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	var b bytes.Buffer
	p := newStageProgress(&b, clk)
	p.report(modulebuild.Progress{Stage: "layer 1/2"})
	p.report(modulebuild.Progress{Stage: "stage", Done: 1 << 20})
	p.report(modulebuild.Progress{Stage: "stage", Done: 2 << 20}) // same stage, too soon
	clk.Advance(progressEvery)
	p.report(modulebuild.Progress{Stage: "stage", Done: 3 << 20})
	p.report(modulebuild.Progress{Stage: "mkfs"})
	p.done()
	want := []string{"build: layer 1/2  0s", "build: stage  1.0 MiB  0s", "build: stage  3.0 MiB  5s", "build: mkfs  5s"}
	if got := strings.Split(strings.TrimSpace(b.String()), "\n"); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("progress lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
