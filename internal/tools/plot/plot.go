// Package plot draws the small charts the benchmark reports carry (a bar
// per second, horizontal reference lines, vertical marks) with gonum's
// plotting library, which gives them readable axes, ticks and a legend.
package plot

import (
	"bytes"
	"fmt"
	"image/color"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Chart is one bar series over equal steps of x (one bar per second).
type Chart struct {
	Title, XLabel, YLabel string
	Bars                  []float64
	Lines                 []Line
	Marks                 []Mark
}

// Line is a horizontal reference line at Y.
type Line struct {
	Y     float64
	Color color.RGBA
	Label string
}

// Mark is a vertical line at x = X (in bar steps, fractional).
type Mark struct {
	X     float64
	Label string
}

// BarColor and MarkColor are the series' colours; Lines bring their own.
var (
	BarColor  = color.RGBA{40, 90, 200, 255}
	MarkColor = color.RGBA{200, 120, 0, 255}
)

// PNG renders the chart at w×h pixels (at 96 dpi).
func (c Chart) PNG(w, h int) ([]byte, error) {
	p, err := c.plot()
	if err != nil {
		return nil, err
	}
	const dpi = 96
	wt, err := p.WriterTo(vg.Length(w)*vg.Inch/dpi, vg.Length(h)*vg.Inch/dpi, "png")
	if err != nil {
		return nil, fmt.Errorf("plot: %w", err)
	}
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return nil, fmt.Errorf("plot: render: %w", err)
	}
	return buf.Bytes(), nil
}

func (c Chart) plot() (*gplot.Plot, error) {
	if len(c.Bars) == 0 {
		return nil, fmt.Errorf("plot: %q has no bars", c.Title)
	}
	p := gplot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Add(plotter.NewGrid())
	p.Legend.Top = true

	n := float64(len(c.Bars))
	// Bars sit on [i, i+1): a bar per step, the way the series was counted.
	bars := &plotter.Histogram{Width: 1, FillColor: BarColor}
	for i, v := range c.Bars {
		bars.Bins = append(bars.Bins, plotter.HistogramBin{Min: float64(i), Max: float64(i + 1), Weight: v})
	}
	bars.LineStyle.Width = 0
	p.Add(bars)

	ymax := 1.0
	for _, v := range c.Bars {
		ymax = max(ymax, v)
	}
	for _, l := range c.Lines {
		ymax = max(ymax, l.Y)
		ln, err := plotter.NewLine(plotter.XYs{{X: 0, Y: l.Y}, {X: n, Y: l.Y}})
		if err != nil {
			return nil, fmt.Errorf("plot: line %q: %w", l.Label, err)
		}
		ln.Color, ln.Width = l.Color, vg.Points(1.5)
		p.Add(ln)
		p.Legend.Add(l.Label, ln)
	}
	p.Y.Min, p.Y.Max = 0, ymax*1.08
	for _, m := range c.Marks {
		ln, err := plotter.NewLine(plotter.XYs{{X: m.X, Y: 0}, {X: m.X, Y: p.Y.Max}})
		if err != nil {
			return nil, fmt.Errorf("plot: mark %q: %w", m.Label, err)
		}
		ln.Color, ln.Width, ln.Dashes = MarkColor, vg.Points(1.5), []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(ln)
		p.Legend.Add(fmt.Sprintf("%s (%.1f)", m.Label, m.X), ln)
	}
	p.X.Min, p.X.Max = 0, n
	p.Legend.YOffs = -vg.Points(4)
	p.Legend.ThumbnailWidth = vg.Points(16)
	return p, nil
}
