package plot

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"testing"
)

func TestDrawPutsBarsAndLinesWhereTheValuesAre(t *testing.T) {
	red := color.RGBA{200, 0, 0, 255}
	c := Chart{Title: "reconnections/s", XLabel: "s", Bars: []float64{0, 10, 40, 10},
		Lines: []Line{{Y: 20, Color: red, Label: "3x mean"}}, Marks: []Mark{{X: 3, Label: "all back"}}}
	const w, h = 400, 200
	img := c.Draw(w, h)
	if b := img.Bounds(); b.Dx() != w || b.Dy() != h {
		t.Fatalf("image %v, want %dx%d", b, w, h)
	}
	pw, ph := w-left-right, h-top-bottom
	bw := pw / len(c.Bars)
	col := func(i int) int { return left + i*bw + bw/2 }
	// The y scale tops at a round value at least 5 % over the peak (40).
	ymax, _ := niceScale(40 * 1.05)
	yOf := func(v float64) int { return top + ph - int(math.Round(v/ymax*float64(ph))) }
	if img.At(col(2), yOf(39)) != blue || img.At(col(2), yOf(41)) == blue {
		t.Error("the tallest bar does not end at its value")
	}
	if img.At(col(0), yOf(1)) == blue {
		t.Error("a zero bar was drawn")
	}
	found := false
	for x := left; x < left+pw; x++ {
		if img.At(x, yOf(20)) == red {
			found = true
		}
	}
	if !found {
		t.Error("the reference line is missing")
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	if buf.Len() > 20<<10 {
		t.Errorf("PNG is %d bytes; the committed plots are meant to stay small", buf.Len())
	}
}

func TestNiceScale(t *testing.T) {
	for _, tc := range []struct{ in, top, step float64 }{
		{1, 1, 0.5}, {42, 60, 20}, {420, 600, 200}, {7.9, 8, 2}, {1000, 1000, 500},
	} {
		top, step := niceScale(tc.in)
		if top < tc.in || top != tc.top || step != tc.step {
			t.Errorf("niceScale(%v) = %v, %v; want %v, %v", tc.in, top, step, tc.top, tc.step)
		}
	}
}
