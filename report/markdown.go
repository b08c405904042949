package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// WriteMarkdown prints the report as a Markdown table, for pull requests and
// run reviews.
func WriteMarkdown(w io.Writer, r *Report) error {
	s := r.Summary
	b := r.Breakdown
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("## tpsprof report: %s\n\n", mdText(r.Job))
	p("| metric | value |\n|---|---|\n")
	if m := r.Meta; m != nil {
		p("| run | %s, %s, %s %s |\n", m.Topology, mdText(orDash(m.ModelPreset)), mdText(orDash(m.GPU)), mdText(orDash(m.DType)))
	}
	if s.CompleteNote != "" {
		p("| note | %s |\n", s.CompleteNote)
	}
	if c := ClockOffsetsText(r.ClockOffsetsNs); c != "" {
		p("| clock offsets | %s |\n", mdText(c))
	}
	p("| steps | %d (%d warm-up excluded, %s) |\n", s.Steps, s.WarmupSteps, incompleteText(s))
	p("| step TPS mean / p50 / p95 / p99 | %s / %s / %s / %s |\n", tps.SI(s.TPS.Mean), tps.SI(s.TPS.P50), tps.SI(s.TPS.P95), tps.SI(s.TPS.P99))
	p("| TPS per GPU | %s |\n", tps.SI(s.TPSPerGPU))
	p("| wall TPS | %s |\n", tps.SI(s.WallTPS))
	p("| MFU / HFU | %s |\n", mfuText(s))
	p("| compute / exposed comm / waiting for slower peers / bubble / data stall / checkpoint / host, other | %s / %s / %s / %s (theory %s) / %s / %s / %s |\n",
		pct(b.Compute), pct(b.ExposedComm), pct(b.WaitingForPeers), pct(b.Bubble), pct(b.BubbleTheoretical), pct(b.DataStall), pct(b.Checkpoint), pct(b.Other))
	for _, l := range generationLines(r) {
		p("| %s | %s |\n", mdText(l[0]), mdText(l[1]))
	}
	if g := r.Goodput; g.ElapsedS > 0 {
		p("| goodput | %s of %.0f s |\n", pct(g.Goodput), g.ElapsedS)
		if nc := g.NotCountedText(); nc != "" {
			p("| not counted | %s |\n", nc)
		}
		if len(r.Attempts) > 1 {
			for _, l := range attemptLines(r.Attempts) {
				p("| attempt | %s |\n", l)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(g.BadputS)) {
			p("| badput: %s | %s |\n", k, pct(g.BadputS[k]/g.ElapsedS))
		}
	}
	for _, n := range r.Nodes {
		if n.Straggler {
			p("| straggler node | %s (score %.2f) |\n", mdText(n.Node), n.Score)
		}
	}
	for _, e := range r.Episodes {
		p("| straggler episode | %s |\n", mdText(episodeText(e, r.EpisodeWindow)))
	}
	if e := r.Energy; e != nil {
		p("| tokens per joule | %.2f |\n", e.TokensPerJoule)
	}
	if r.CostPerMTok != nil {
		p("| cost per million tokens | $%.4f |\n", *r.CostPerMTok)
	}
	return nil
}

// mdText makes a name safe in a Markdown table cell: HTML is escaped (a
// node or model named "<script>..." renders as text where Markdown is shown
// as HTML), pipes and line breaks cannot end the cell or the row.
func mdText(s string) string {
	return mdEscaper.Replace(s)
}

var mdEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "|", "\\|", "\n", " ", "\r", " ", "`", "\\`")
