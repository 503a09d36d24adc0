package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"

	"github.com/tetherfleet/tether/internal/tools/plot"
)

// plotCmd draws a storm series (fleet --series) as a PNG: reconnections
// per second since the restart, with the mean and three times the mean.
func plotCmd(args []string) error {
	fs := flag.NewFlagSet("plot", flag.ExitOnError)
	in := fs.String("series", "", "series JSON written by fleet --series")
	out := fs.String("out", "", "PNG to write")
	_ = fs.Parse(args)
	if *in == "" || *out == "" {
		return fmt.Errorf("plot: --series and --out are required")
	}
	raw, err := os.ReadFile(*in)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	var r stormReport
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("plot: %s: %w", *in, err)
	}
	c := plot.Chart{Title: fmt.Sprintf("reconnections/s after %s; %d agents", sigName(r.Signal), r.Agents), XLabel: "s since the signal", YLabel: "reconnections/s"}
	for _, p := range r.Points {
		c.Bars = append(c.Bars, float64(p.Reconnects))
	}
	if r.MeanRate > 0 {
		c.Lines = []plot.Line{{Y: r.MeanRate, Color: color.RGBA{0, 140, 0, 255}, Label: "mean"},
			{Y: 3 * r.MeanRate, Color: color.RGBA{200, 0, 0, 255}, Label: "3x mean"}}
	}
	if r.BackSeconds > 0 {
		c.Marks = []plot.Mark{{X: r.BackSeconds, Label: "all back"}}
	}
	b, err := c.PNG(640, 300)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	return nil
}

func sigName(s string) string {
	switch s {
	case "killed":
		return "kill -9"
	case "terminated":
		return "SIGTERM"
	}
	return s
}
