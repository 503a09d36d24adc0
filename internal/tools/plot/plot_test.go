package plot

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"testing"
)

// count is how many pixels of img are exactly c.
func count(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B && uint8(a>>8) == c.A {
				n++
			}
		}
	}
	return n
}

func TestPNGDrawsBarsLinesAndMarks(t *testing.T) {
	red := color.RGBA{200, 0, 0, 255}
	tests := []struct {
		name             string
		chart            Chart
		bars, line, mark bool
	}{
		{"bars only", Chart{Title: "t", Bars: []float64{0, 10, 40, 10}}, true, false, false},
		{"with a line and a mark", Chart{Title: "reconnections/s", XLabel: "s", Bars: []float64{0, 10, 40, 10},
			Lines: []Line{{Y: 20, Color: red, Label: "3x mean"}}, Marks: []Mark{{X: 3, Label: "all back"}}}, true, true, true},
		{"all zero", Chart{Title: "t", Bars: []float64{0, 0, 0}}, false, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const w, h = 640, 300
			b, err := tc.chart.PNG(w, h)
			if err != nil {
				t.Fatal(err)
			}
			img, err := png.Decode(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("not a PNG: %v", err)
			}
			if got := img.Bounds(); got.Dx() != w || got.Dy() != h {
				t.Fatalf("image %v, want %dx%d", got, w, h)
			}
			if got := count(img, BarColor) > 100; got != tc.bars {
				t.Errorf("bars drawn = %v, want %v", got, tc.bars)
			}
			if got := count(img, red) > 50; got != tc.line {
				t.Errorf("reference line drawn = %v, want %v", got, tc.line)
			}
			if got := count(img, MarkColor) > 20; got != tc.mark {
				t.Errorf("mark drawn = %v, want %v", got, tc.mark)
			}
		})
	}
}

func TestPNGRefusesAnEmptySeries(t *testing.T) {
	if _, err := (Chart{Title: "nothing"}).PNG(100, 100); err == nil {
		t.Fatal("a chart with no bars rendered")
	}
}
