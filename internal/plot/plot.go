// Package plot draws the small charts the benchmark reports carry (a bar
// per second, horizontal reference lines, vertical marks) into a
// paletted image, so that the PNGs committed with docs stay a few KiB
// and need no plotting dependency.
package plot

import (
	"fmt"
	"image"
	"image/color"
	"math"
)

// Chart is one bar series over equal steps of x (one bar per second).
type Chart struct {
	Title, XLabel string
	Bars          []float64
	Lines         []Line
	Marks         []Mark
}

// Line is a horizontal reference line at Y.
type Line struct {
	Y     float64
	Color color.RGBA
	Label string
}

// Mark is a vertical line at bar position X (fractional).
type Mark struct {
	X     float64
	Label string
}

var (
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{200, 200, 200, 255}
	blue  = color.RGBA{40, 90, 200, 255}
	amber = color.RGBA{200, 120, 0, 255}
)

const (
	left, right, top, bottom = 56, 70, 26, 34
	k                        = 2 // font scale
)

// Draw renders the chart at w×h pixels.
func (c Chart) Draw(w, h int) *image.Paletted {
	pal := color.Palette{white, black, grey, blue, amber}
	for _, l := range c.Lines {
		pal = append(pal, l.Color)
	}
	img := image.NewPaletted(image.Rect(0, 0, w, h), pal)
	pw, ph := w-left-right, h-top-bottom
	ymax := 1.0
	for _, b := range c.Bars {
		ymax = math.Max(ymax, b)
	}
	for _, l := range c.Lines {
		ymax = math.Max(ymax, l.Y)
	}
	ymax, step := niceScale(ymax * 1.05)
	y := func(v float64) int { return top + ph - int(math.Round(v/ymax*float64(ph))) }
	// Grid and y labels.
	for v := 0.0; v <= ymax+step/2; v += step {
		hline(img, left, left+pw, y(v), grey, false)
		s := fmt.Sprintf("%.0f", v)
		drawText(img, left-6-textWidth(s, k), y(v)-5, k, s, black)
	}
	n := max(len(c.Bars), 1)
	bw := float64(pw) / float64(n)
	for i, b := range c.Bars {
		x0, x1 := left+int(float64(i)*bw), left+int(float64(i+1)*bw)
		if x1-x0 > 2 {
			x1-- // a gap between bars
		}
		fill(img, x0, y(b), x1, y(0), blue)
	}
	// X ticks every 10 bars (or 5 for short series).
	every := 10
	if n <= 30 {
		every = 5
	}
	for i := 0; i <= n; i += every {
		x := left + int(float64(i)*bw)
		vline(img, x, y(0), y(0)+4, black, false)
		s := fmt.Sprint(i)
		drawText(img, x-textWidth(s, k)/2, y(0)+7, k, s, black)
	}
	for _, l := range c.Lines {
		hline(img, left, left+pw, y(l.Y), l.Color, true)
		drawText(img, left+pw+4, y(l.Y)-5, k, l.Label, l.Color)
	}
	for _, m := range c.Marks {
		x := left + int(m.X*bw)
		vline(img, x, top, y(0), amber, true)
		drawText(img, min(x+3, w-textWidth(m.Label, k)), top+2, k, m.Label, amber)
	}
	hline(img, left, left+pw, y(0), black, false)
	vline(img, left, top, y(0), black, false)
	drawText(img, left, 6, k, c.Title, black)
	drawText(img, left+pw/2-textWidth(c.XLabel, k)/2, h-12, k, c.XLabel, black)
	return img
}

// niceScale rounds max up to 1, 2 or 5 times a power of ten of steps.
func niceScale(v float64) (top, step float64) {
	raw := v / 4
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if step = m * p; step >= raw {
			break
		}
	}
	return math.Ceil(v/step) * step, step
}

func fill(img *image.Paletted, x0, y0, x1, y1 int, c color.Color) {
	idx := uint8(img.Palette.Index(c))
	for yy := y0; yy < y1; yy++ {
		for xx := x0; xx < x1; xx++ {
			img.SetColorIndex(xx, yy, idx)
		}
	}
}

func hline(img *image.Paletted, x0, x1, y int, c color.Color, dashed bool) {
	idx := uint8(img.Palette.Index(c))
	for x := x0; x <= x1; x++ {
		if !dashed || (x/4)%2 == 0 {
			img.SetColorIndex(x, y, idx)
		}
	}
}

func vline(img *image.Paletted, x, y0, y1 int, c color.Color, dashed bool) {
	idx := uint8(img.Palette.Index(c))
	for y := y0; y <= y1; y++ {
		if !dashed || (y/4)%2 == 0 {
			img.SetColorIndex(x, y, idx)
		}
	}
}
