package report

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
)

// WriteMarkdown prints the report as a Markdown table, for pull requests and
// run reviews.
func WriteMarkdown(w io.Writer, r *Report) error {
	s := r.Summary
	b := r.Breakdown
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("## tpsprof report: %s\n\n", r.Job)
	p("| metric | value |\n|---|---|\n")
	if m := r.Meta; m != nil {
		p("| run | %s, %s, %s %s |\n", m.Topology, orDash(m.ModelPreset), orDash(m.GPU), orDash(m.DType))
	}
	p("| steps | %d (%d warm-up excluded, %d incomplete) |\n", s.Steps, s.WarmupSteps, s.IncompleteSteps)
	p("| step TPS mean / p50 / p95 / p99 | %s / %s / %s / %s |\n", tps.SI(s.TPS.Mean), tps.SI(s.TPS.P50), tps.SI(s.TPS.P95), tps.SI(s.TPS.P99))
	p("| TPS per GPU | %s |\n", tps.SI(s.TPSPerGPU))
	p("| wall TPS | %s |\n", tps.SI(s.WallTPS))
	p("| MFU / HFU | %s / %s |\n", pct(s.MFU), pct(s.HFU))
	p("| compute / exposed comm / bubble / data stall / checkpoint | %s / %s / %s (theory %s) / %s / %s |\n",
		pct(b.Compute), pct(b.ExposedComm), pct(b.Bubble), pct(b.BubbleTheoretical), pct(b.DataStall), pct(b.Checkpoint))
	if g := r.Goodput; g.ElapsedS > 0 {
		p("| goodput | %s of %.0f s |\n", pct(g.Goodput), g.ElapsedS)
		for _, k := range slices.Sorted(maps.Keys(g.BadputS)) {
			p("| badput: %s | %s |\n", k, pct(g.BadputS[k]/g.ElapsedS))
		}
	}
	for _, n := range r.Nodes {
		if n.Straggler {
			p("| straggler node | %s (score %.2f) |\n", n.Node, n.Score)
		}
	}
	if e := r.Energy; e != nil {
		p("| tokens per joule | %.2f |\n", e.TokensPerJoule)
	}
	if r.CostPerMTok != nil {
		p("| cost per million tokens | $%.4f |\n", *r.CostPerMTok)
	}
	return nil
}

// WriteCompare prints two runs side by side with the deltas.
func WriteCompare(w io.Writer, a, b *Report) error {
	p := func(format string, x ...any) { fmt.Fprintf(w, format, x...) }
	p("%-28s %16s %16s %10s\n", "", a.Job, b.Job, "delta")
	row := func(name string, x, y float64, f func(float64) string) {
		d := "-"
		if x != 0 {
			d = fmt.Sprintf("%+.1f%%", 100*(y-x)/math.Abs(x))
		}
		p("%-28s %16s %16s %10s\n", name, f(x), f(y), d)
	}
	sa, sb := a.Summary, b.Summary
	row("step TPS (mean)", sa.TPS.Mean, sb.TPS.Mean, tps.SI)
	row("step TPS (p50)", sa.TPS.P50, sb.TPS.P50, tps.SI)
	row("TPS per GPU", sa.TPSPerGPU, sb.TPSPerGPU, tps.SI)
	row("wall TPS", sa.WallTPS, sb.WallTPS, tps.SI)
	row("step time p50 (s)", sa.StepTimeS.P50, sb.StepTimeS.P50, func(v float64) string { return fmt.Sprintf("%.3f", v) })
	row("MFU", sa.MFU, sb.MFU, pct)
	row("compute", a.Breakdown.Compute, b.Breakdown.Compute, pct)
	row("exposed comm", a.Breakdown.ExposedComm, b.Breakdown.ExposedComm, pct)
	row("pipeline bubble", a.Breakdown.Bubble, b.Breakdown.Bubble, pct)
	row("data stall", a.Breakdown.DataStall, b.Breakdown.DataStall, pct)
	row("goodput", a.Goodput.Goodput, b.Goodput.Goodput, pct)
	strag := func(r *Report) string {
		for _, n := range r.Nodes {
			if n.Straggler {
				return fmt.Sprintf("%s %.2f", n.Node, n.Score)
			}
		}
		return "none"
	}
	p("%-28s %16s %16s\n", "worst straggler node", strag(a), strag(b))
	return nil
}
