package dashboard

import (
	"fmt"
	"html/template"
	"sort"
	"strings"
	"time"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// phaseMark is one point on an instance's boot timeline.
type phaseMark struct {
	Name string
	At   time.Time
}

// bootMarks orders what the control plane knows of a boot: the provision
// request, the provider's machine, the enrollment and running. A boot still under way ends at now, in the
// agent's current phase.
func bootMarks(in *v1.Instance, evs []*v1.FleetEvent, now time.Time) []phaseMark {
	marks := []phaseMark{{"requested", in.CreatedAt.AsTime()}}
	first := func(kind string) (time.Time, bool) {
		var t time.Time
		for _, e := range evs {
			if e.Kind == kind && (t.IsZero() || e.CreatedAt.AsTime().Before(t)) {
				t = e.CreatedAt.AsTime()
			}
		}
		return t, !t.IsZero()
	}
	if t, ok := first("instance.machine_created"); ok {
		marks = append(marks, phaseMark{"machine created", t})
	}
	// The enrollment event, not the certificate's not_before: certificates
	// are back-dated for clock skew.
	if t, ok := first("enroll.succeeded"); ok {
		marks = append(marks, phaseMark{"enrolled", t})
	}
	if t, ok := first("instance.running"); ok {
		marks = append(marks, phaseMark{"running", t})
	} else if p := phaseName(in.AgentPhase); p != "" && in.Status != v1.InstanceStatus_INSTANCE_STATUS_TERMINATED {
		marks = append(marks, phaseMark{p + " (now)", now})
	}
	sort.SliceStable(marks, func(i, j int) bool { return marks[i].At.Before(marks[j].At) })
	return marks
}

// timelineSVG draws the spans between marks as one bar, each span labelled
// with the phase it ends in and its duration.
func timelineSVG(marks []phaseMark) template.HTML {
	if len(marks) < 2 {
		return template.HTML(`<p class="muted">No boot phases recorded yet.</p>`)
	}
	total := marks[len(marks)-1].At.Sub(marks[0].At)
	if total <= 0 {
		total = time.Millisecond
	}
	const w, h = 600.0, 56.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="timeline" viewBox="0 0 %.0f %.0f" role="img" aria-label="boot timeline, %s in total">`, w, h, roundDur(total))
	x := 0.0
	for i := 1; i < len(marks); i++ {
		d := marks[i].At.Sub(marks[i-1].At)
		bw := w * float64(d) / float64(total)
		fmt.Fprintf(&b, `<g><title>%s: %s</title><rect class="span span%d" x="%.1f" y="4" width="%.1f" height="24"/>`,
			template.HTMLEscapeString(marks[i].Name), roundDur(d), i%6, x, max(bw, 0.5))
		if bw > 60 {
			fmt.Fprintf(&b, `<text x="%.1f" y="20">%s</text>`, x+4, template.HTMLEscapeString(marks[i].Name))
		}
		fmt.Fprintf(&b, `<text class="dur" x="%.1f" y="46">%s</text></g>`, x+2, roundDur(d))
		x += bw
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func roundDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// countPoint is a pool's counts at one moment.
type countPoint struct {
	At                      time.Time
	Warming, Ready, Claimed int
}

// poolHistory walks the pool's events from now back to since, undoing
// each one's effect on the current counts. It is as exact as the events
// are: a member that left without an event (pruned) is not seen.
func poolHistory(cur *v1.PoolCounts, evs []*v1.FleetEvent, since, now time.Time) []countPoint {
	p := countPoint{At: now, Warming: int(cur.GetWarming()), Ready: int(cur.GetReady()), Claimed: int(cur.GetClaimed())}
	out := []countPoint{p}
	for _, e := range evs { // newest first
		at := e.CreatedAt.AsTime()
		if at.Before(since) {
			break
		}
		switch e.Kind {
		case "pool.member_ready":
			p.Warming++
			if payloadString(e, "pool_state") != "draining" {
				p.Ready--
			}
		case "pool.claimed":
			p.Ready++
			p.Claimed--
		case "pool.released":
			p.Claimed++
			if payloadString(e, "disposition") == "reused" {
				p.Ready--
			}
		case "instance.provisioned":
			p.Warming--
		default:
			continue
		}
		p.Warming, p.Ready, p.Claimed = max(p.Warming, 0), max(p.Ready, 0), max(p.Claimed, 0)
		p.At = at
		out = append(out, p)
	}
	if last := out[len(out)-1]; last.At.After(since) {
		last.At = since
		out = append(out, last)
	}
	// Oldest first, for drawing.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// countsSVG draws ready, warming and claimed over [since, now] as steps.
func countsSVG(pts []countPoint, since, now time.Time) template.HTML {
	const w, h, pad = 600.0, 140.0, 18.0
	top := 1
	for _, p := range pts {
		top = max(top, p.Ready, p.Warming, p.Claimed)
	}
	span := now.Sub(since)
	if span <= 0 {
		span = time.Hour
	}
	xOf := func(t time.Time) float64 { return w * float64(t.Sub(since)) / float64(span) }
	yOf := func(v int) float64 { return h - pad - (h-2*pad)*float64(v)/float64(top) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="pool counts over the last %s">`, w, h, span)
	fmt.Fprintf(&b, `<line class="axis" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, yOf(0), w, yOf(0))
	fmt.Fprintf(&b, `<text class="dur" x="2" y="12">%d</text><text class="dur" x="2" y="%.1f">-%s</text><text class="dur" x="%.0f" y="%.1f">now</text>`,
		top, h-2, span, w-28, h-2)
	series := []struct {
		name string
		get  func(countPoint) int
	}{
		{"ready", func(p countPoint) int { return p.Ready }},
		{"warming", func(p countPoint) int { return p.Warming }},
		{"claimed", func(p countPoint) int { return p.Claimed }},
	}
	for _, s := range series {
		var pts2 []string
		for i, p := range pts {
			x := xOf(p.At)
			if i > 0 {
				pts2 = append(pts2, fmt.Sprintf("%.1f,%.1f", x, yOf(s.get(pts[i-1]))))
			}
			pts2 = append(pts2, fmt.Sprintf("%.1f,%.1f", x, yOf(s.get(p))))
		}
		pts2 = append(pts2, fmt.Sprintf("%.1f,%.1f", w, yOf(s.get(pts[len(pts)-1]))))
		fmt.Fprintf(&b, `<polyline class="series pool-%s" points="%s"><title>%s</title></polyline>`, s.name, strings.Join(pts2, " "), s.name)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
