package report

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"fmt"
	"html/template"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

// The HTML report: one self-contained file (no script, no CDN, no font
// download) a person can open and share. The figures are inline SVG; the
// text says what each figure and figure means, so someone who never saw
// tpsprof can read the run from it.

type htmlCard struct {
	Label, Value, Note string
	Bad                bool
}

type htmlRow struct {
	Cells  []string
	Bar    float64 // 0-1, drawn behind cell BarCol when > 0
	BarCol int
}

type htmlTable struct {
	Title, Intro string
	Head         []string
	Rows         []htmlRow
}

type htmlFigure struct {
	Name, Caption string
	SVG           template.HTML
	MaxWidthPx    int // the figure's drawn width: a square plot is not blown up to the page's
}

type htmlPage struct {
	Title, Subtitle string
	Generated       string
	Notes           []string
	Cards           []htmlCard
	Tables          []htmlTable
	Figures         []htmlFigure
	Glossary        [][2]string
}

// WriteHTML writes the report of one job with its figures (Plots.Figures).
func WriteHTML(w io.Writer, rep *Report, figs []Figure) error {
	p := htmlPage{Title: "tpsprof report: " + rep.Job, Generated: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Notes: rep.Notes}
	if rep.Summary.CompleteNote != "" {
		p.Notes = append(p.Notes, rep.Summary.CompleteNote)
	}
	if c := ClockOffsetsText(rep.ClockOffsetsNs); c != "" {
		p.Notes = append(p.Notes, "clock offsets: "+c)
	}
	p.Subtitle = runLine(rep)
	if rep.Summary.SteadySteps == 0 {
		p.Notes = append(p.Notes, "no steady steps to summarise")
		return renderHTML(w, p)
	}
	p.cards(rep)
	p.breakdownTables(rep)
	p.detailTables(rep)
	if err := p.figures(figs); err != nil {
		return err
	}
	p.Glossary = glossary
	return renderHTML(w, p)
}

// cards are the page's headline figures.
func (p *htmlPage) cards(rep *Report) {
	s := rep.Summary
	mfuValue, mfuNote, mfuBad := "unknown", s.MFUUnknown, true
	if s.MFU != nil {
		mfuValue, mfuBad = fmt.Sprintf("%.1f%%", 100**s.MFU), false
		mfuNote = "model FLOPs / peak"
		if s.HFU != nil && *s.HFU > *s.MFU*1.001 {
			mfuNote += fmt.Sprintf(" (HFU %.1f%%)", 100**s.HFU)
		}
	}
	p.Cards = []htmlCard{
		throughputCard(s),
		perGPUCard(s),
		{Label: "MFU", Value: mfuValue, Note: mfuNote, Bad: mfuBad},
		{Label: "step time", Value: fmt.Sprintf("%.2f s", s.StepTimeS.P50), Note: fmt.Sprintf("median; p99 %.2f s", s.StepTimeS.P99)},
	}
	if g := rep.Goodput; g.ElapsedS > 0 {
		p.Cards = append(p.Cards, htmlCard{Label: "goodput", Value: pct(g.Goodput), Note: fmt.Sprintf("of %s elapsed spent on steps that count", dur(g.ElapsedS)), Bad: g.Goodput < 0.9})
	}
	p.Cards = append(p.Cards, htmlCard{Label: "exposed communication", Value: pct(rep.Breakdown.ExposedComm), Note: "of step time, transfer not hidden by compute", Bad: rep.Breakdown.ExposedComm > 0.2},
		htmlCard{Label: "waiting for slower peers", Value: pct(rep.Breakdown.WaitingForPeers), Note: "of step time, blocked in collectives until the slowest rank arrived", Bad: rep.Breakdown.WaitingForPeers > 0.1})
	if kind, flagged := rep.flaggedStragglers(); len(flagged) > 0 {
		p.Cards = append(p.Cards, htmlCard{Label: "slowest " + kind, Value: flagged[0].name, Note: fmt.Sprintf("own time (compute, data wait and host work) at %.0f%% of the fastest rank's pace (%s)", 100*flagged[0].score, flagged[0].where), Bad: true})
	}
}

// breakdownTables are where step time goes, the figures and generation.
func (p *htmlPage) breakdownTables(rep *Report) {
	b := rep.Breakdown
	bt := htmlTable{Title: "Where step time goes", Intro: "Each part's time (mean over ranks) over the steady steps' step time: the parts add up to 100%.",
		Head: []string{"category", "share of step time"}}
	for _, part := range tps.ShareParts() {
		v := *part.Of(&b.Shares)
		cell := pct(v)
		if part.Key == "bubble" && b.BubbleTheoretical > 0 {
			cell += fmt.Sprintf(" (theory %s)", pct(b.BubbleTheoretical))
		}
		cell += b.SplitsText(part.Key, pct)
		bt.Rows = append(bt.Rows, htmlRow{Cells: []string{shareWords[part.Key], cell}, Bar: v, BarCol: 1})
	}
	p.Tables = append(p.Tables, bt)
	if l := rep.MFULedger.Ledger; l != nil {
		lt := htmlTable{Title: "Where the MFU went", Intro: fmt.Sprintf("From the GPUs' peak (100 points) to the achieved MFU: the time outside compute costs its share at the run's MFU over compute time (%s); the rest is compute efficiency. The rows add up to 100. %s.", pct(l.ComputeMFU), gpmText(rep.MFULedger)),
			Head: []string{"bucket", "MFU points"}}
		lt.Rows = append(lt.Rows, htmlRow{Cells: []string{"achieved MFU", fmt.Sprintf("%.1f", l.MFU)}, Bar: l.MFU / 100, BarCol: 1})
		for _, x := range l.Lost {
			lt.Rows = append(lt.Rows, htmlRow{Cells: []string{"lost: " + x.Label, fmt.Sprintf("%.1f", x.Points)}, Bar: x.Points / 100, BarCol: 1})
		}
		p.Tables = append(p.Tables, lt)
	}
	if len(rep.Findings) > 0 {
		ft := htmlTable{Title: "What to fix first", Intro: "Where the throughput goes, largest headroom first: what removing each would gain (step TPS; wall TPS for gaps between steps). A cause is named only where it explains at least 80% of its time; no two findings claim the same time.",
			Head: []string{"finding", "headroom", "cause", "evidence"}}
		for _, f := range rep.Findings {
			h := fmt.Sprintf("+%.1f%%", f.HeadroomPct)
			if f.HeadroomTPS != nil {
				h += " (" + tps.SI(*f.HeadroomTPS) + " tokens/s)"
			}
			ft.Rows = append(ft.Rows, htmlRow{Cells: []string{f.What, h, orDash(f.Cause), orDash(f.Evidence)}})
		}
		p.Tables = append(p.Tables, ft)
	}
	// The figures are the text report's lines (Lines), less those the page
	// shows as notes, its subtitle, or tables and cards of their own.
	detail := htmlTable{Title: "Figures", Head: []string{"figure", "value"}}
	elsewhere := map[string]bool{"note": true, "run": true, "clock offsets": true, "time breakdown": true, "MFU ledger": rep.MFULedger.Ledger != nil, "finding 1": true, "finding 2": true, "finding 3": true,
		"straggler episode": true, "slowest ranks": true, "collectives": true, "": true}
	for _, l := range generationLines(rep) {
		elsewhere[l[0]] = true
	}
	for _, l := range rep.Lines() {
		if !elsewhere[l.Key] {
			detail.Rows = append(detail.Rows, htmlRow{Cells: []string{l.Key, l.Value}})
		}
	}
	p.Tables = append(p.Tables, detail)
	if gl := generationLines(rep); len(gl) > 0 {
		t := htmlTable{Title: "Generation and training (RL post-training)", Head: []string{"figure", "value"},
			Intro: "Steps with a generation phase (rollouts) before the update: how fast the fleet generates, how requests are served, and where step time goes between generating, training and waiting. Latencies merge every rank's per-request sketches (1% relative accuracy)."}
		for _, l := range gl {
			t.Rows = append(t.Rows, htmlRow{Cells: []string{l[0], l[1]}})
		}
		p.Tables = append(p.Tables, t)
	}
	if g := rep.Generation; g != nil {
		p.Cards = append(p.Cards, htmlCard{Label: "generation", Value: tps.SI(g.OutputTPS) + " tokens/s", Note: fmt.Sprintf("generated; %s of step time generating", pct(g.GenShare))})
	}

}

// detailTables are goodput, the episodes, the slowest ranks and the
// collectives.
func (p *htmlPage) detailTables(rep *Report) {
	if g := rep.Goodput; g.ElapsedS > 0 {
		t := htmlTable{Title: "Goodput", Intro: fmt.Sprintf("Of %s elapsed, %s went to steps that count. Restarts: %d, steps redone: %d.%s", dur(g.ElapsedS), pct(g.Goodput), g.Restarts, g.RedoneSteps, notCounted(g)),
			Head: []string{"time lost to", "seconds", "share"}}
		for _, k := range slices.Sorted(maps.Keys(g.BadputS)) {
			t.Rows = append(t.Rows, htmlRow{Cells: []string{k, fmt.Sprintf("%.0f", g.BadputS[k]), pct(g.BadputS[k] / g.ElapsedS)}, Bar: g.BadputS[k] / g.ElapsedS, BarCol: 2})
		}
		p.Tables = append(p.Tables, t)
	}
	if len(rep.Episodes) > 0 {
		t := htmlTable{Title: "Straggler episodes", Intro: fmt.Sprintf("Spans of steps during which a node's own time (compute, waiting for data and host work) ran below %.0f%% of the fastest rank's pace, judged over windows of %d steps.", 100*tps.StragglerThreshold, rep.EpisodeWindow),
			Head: []string{"node", "ranks", "steps", "worst pace", "TPS during", "TPS had it kept pace", "cause"}}
		for _, e := range rep.Episodes {
			t.Rows = append(t.Rows, htmlRow{Cells: []string{e.Node, rankList(e.Ranks), fmt.Sprintf("%d–%d (%d)", e.StartStep, e.EndStep, e.Steps), fmt.Sprintf("%.0f%%", 100*e.WorstScore),
				siOrNA(e.TPSDuring), siOrNA(e.TPSWithout), e.Cause}})
		}
		p.Tables = append(p.Tables, t)
	}
	if len(rep.Stragglers) > 0 {
		t := htmlTable{Title: "Slowest ranks", Intro: "Median own time (compute, data wait and host work) over steady steps; pace is the fastest rank's median over this rank's.",
			Head: []string{"rank", "node", "median own time", "pace"}}
		for _, r := range rep.Stragglers {
			t.Rows = append(t.Rows, htmlRow{Cells: []string{fmt.Sprint(r.Rank), r.Node, fmt.Sprintf("%.1f ms", r.MedianComputeNs/1e6), fmt.Sprintf("%.0f%%", 100*r.Score)}, Bar: r.Score, BarCol: 3})
		}
		p.Tables = append(p.Tables, t)
	}
	if tr := rep.Traces; tr != nil && len(tr.Collectives) > 0 {
		t := htmlTable{Title: "Collectives (from profiler traces)", Intro: fmt.Sprintf("%d profiled rank-steps (%s timeline); per profiled rank-step.", tr.Profiled, tr.Device),
			Head: []string{"collective", "calls", "time", "bytes"}}
		for _, c := range tr.Collectives {
			bytes := "—"
			if c.Bytes > 0 {
				bytes = tps.SI(float64(c.Bytes)) + "B"
			}
			t.Rows = append(t.Rows, htmlRow{Cells: []string{c.Kind, fmt.Sprint(c.Count), fmt.Sprintf("%.2f ms", c.TimeUs/1e3), bytes}})
		}
		p.Tables = append(p.Tables, t)
	}
}

// figures inlines the plots.
func (p *htmlPage) figures(figs []Figure) error {
	for _, f := range figs {
		var b bytes.Buffer
		if f.Name == "rank_heatmap" {
			// A cell per rank row and step column: up to 204,800 SVG
			// rectangles (20 MB) at 16,384 ranks. It goes in as a PNG.
			if err := f.Render(&b, "png", 110); err != nil {
				return err
			}
			img := `<img alt="` + template.HTMLEscapeString(f.Caption) + `" src="data:image/png;base64,` + base64.StdEncoding.EncodeToString(b.Bytes()) + `">`
			p.Figures = append(p.Figures, htmlFigure{Name: f.Name, Caption: f.Caption, SVG: template.HTML(img), MaxWidthPx: int(f.W.Points() * 4 / 3)})
			continue
		}
		if err := f.renderInline(&b); err != nil {
			return err
		}
		p.Figures = append(p.Figures, htmlFigure{Name: f.Name, Caption: f.Caption, SVG: template.HTML(b.String()), MaxWidthPx: int(f.W.Points() * 4 / 3)})
	}
	return nil
}

// WriteCompareHTML writes the comparison of two runs.
func WriteCompareHTML(w io.Writer, a, b *Report) error {
	c := Compare(a, b)
	p := htmlPage{Title: fmt.Sprintf("tpsprof: %s against %s", c.B, c.A), Generated: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Notes: c.Notes}
	p.Subtitle = "A: " + runLine(a) + " · B: " + runLine(b)
	p.Cards = append(p.Cards, htmlCard{Label: "verdict", Value: c.Verdict.Text, Note: fmt.Sprintf("throughput by %s; the runs' own noise ±%.1f%%", cmp.Or(c.Verdict.By, "tokens/s"), c.Verdict.NoisePct),
		Bad: c.Verdict.ChangePct != nil && c.Verdict.Beyond && *c.Verdict.ChangePct < 0})
	for _, part := range []struct {
		title string
		rows  []CompareRow
	}{{"What differs between the runs", c.Shape}, {"Figures", c.Rows}} {
		t := htmlTable{Title: part.title, Head: []string{"", "A: " + c.A, "B: " + c.B, "B against A"}}
		for _, r := range part.rows {
			t.Rows = append(t.Rows, htmlRow{Cells: []string{r.Name, compareCell(r, r.A, r.TextA), compareCell(r, r.B, r.TextB), deltaCell(r)}})
		}
		if len(t.Rows) > 0 {
			p.Tables = append(p.Tables, t)
		}
	}
	p.Glossary = glossary
	return renderHTML(w, p)
}

func compareCell(r CompareRow, v *float64, text string) string {
	if r.Unit == "text" || v == nil {
		if text == "" {
			return "—"
		}
		return text
	}
	switch r.Unit {
	case "fraction":
		return pct(*v)
	case "s":
		return fmt.Sprintf("%.3f s", *v)
	case "tokens/s":
		return tps.SI(*v) + " tokens/s"
	case "bytes/s":
		return tps.SI(*v) + " bytes/s"
	case "ratio":
		return fmt.Sprintf("%.3f", *v)
	}
	return tps.SI(*v)
}

func deltaCell(r CompareRow) string {
	switch {
	case r.DeltaPct != nil:
		return fmt.Sprintf("%+.1f%%", *r.DeltaPct)
	case r.DeltaPoints != nil:
		return fmt.Sprintf("%+.1f points", *r.DeltaPoints)
	}
	return ""
}

// renderInline draws the figure as SVG for inlining in HTML: fonts are
// not embedded (they would add ~300 KB a figure); the page's font stack
// stands in.
func (f Figure) renderInline(w io.Writer) error {
	var b bytes.Buffer
	if err := f.Render(&b, "svgtext", 0); err != nil {
		return err
	}
	s := b.String()
	if i := strings.Index(s, "<svg"); i >= 0 {
		s = s[i:] // drop the XML prolog and doctype: not allowed inside HTML
	}
	_, err := io.WriteString(w, s)
	return err
}

func runLine(r *Report) string {
	s := r.Summary
	parts := []string{fmt.Sprintf("%d ranks", s.WorldSize)}
	if m := r.Meta; m != nil {
		model := m.ModelPreset
		if model == "" && m.Model != nil {
			model = "custom model"
		}
		for _, x := range []string{LayoutText(*m, r.Summary.WorldSize), model, m.GPU, m.DType} {
			if x != "" {
				parts = append(parts, x)
			}
		}
	}
	if r.Running {
		parts = append(parts, "still running")
	}
	return r.Job + ": " + strings.Join(parts, ", ")
}

func dur(s float64) string {
	// to the second, but below ten seconds to the millisecond (a 20 ms
	// save read "0s")
	unit := time.Second
	if math.Abs(s) < 10 {
		unit = time.Millisecond
	}
	return time.Duration(s * float64(time.Second)).Round(unit).String()
}

var glossary = [][2]string{
	{"TPS", "training tokens per second of the whole cluster; a token is counted once per data-parallel replica, however many GPUs (tensor, pipeline, context parallel) worked on it."},
	{"steady steps", "steps after each attempt's warm-up (the first steps, slower while kernels compile and caches fill); summaries use these only."},
	{"MFU", "model FLOPs utilisation: the FLOPs the model needs per token (forward and backward) times tokens per second, over the GPUs' peak. HFU adds recomputation. Shown as unknown, with the reason, when it cannot be right."},
	{"exposed communication", "transfer time in collectives that compute did not hide (waiting for a slower peer excluded)."},
	{"waiting for slower peers", "time ranks spent blocked in collectives until the slowest rank arrived: imbalance (a straggler, a data stall on one rank), not the network."},
	{"pipeline bubble", "time pipeline stages wait for each other; the theory is (p−1)/(m+p−1) for p stages and m micro-batches."},
	{"goodput", "the share of elapsed time spent on steps that count: not warm-up, not redone after a restart, not lost to restarts or gaps."},
	{"pace", "the fastest rank's median own time (compute, data wait and host work) over a rank's (or node's): 100% keeps up; below 75% is a straggler."},
}

func renderHTML(w io.Writer, p htmlPage) error {
	return htmlTmpl.Execute(w, p)
}

var htmlTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"width": func(f float64) string { return fmt.Sprintf("%.1f%%", 100*min(max(f, 0), 1)) },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
:root { --fg:#1d2330; --muted:#5b6475; --line:#e3e6ec; --accent:#4c72b0; --bad:#c44e52; --bg:#fff; --card:#f6f7f9; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 "Liberation Sans", "DejaVu Sans", Helvetica, Arial, sans-serif; color: var(--fg); background: var(--bg); }
header { padding: 24px 40px 12px; border-bottom: 1px solid var(--line); }
h1 { margin: 0 0 4px; font-size: 24px; }
h2 { font-size: 18px; margin: 32px 0 8px; }
.sub { color: var(--muted); }
main { padding: 0 40px 40px; max-width: 1400px; }
.notes { margin: 16px 0 0; padding: 10px 14px; background: #fff8e6; border: 1px solid #f0dca8; border-radius: 6px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr)); gap: 12px; margin-top: 20px; }
.card { background: var(--card); border-radius: 8px; padding: 12px 14px; border-left: 4px solid var(--accent); }
.card.bad { border-left-color: var(--bad); }
.card .label { color: var(--muted); font-size: 13px; text-transform: uppercase; letter-spacing: .04em; }
.card .value { font-size: 22px; font-weight: bold; margin: 2px 0; }
.card .note { color: var(--muted); font-size: 13px; }
table { border-collapse: collapse; width: 100%; max-width: 1000px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: normal; font-size: 13px; }
td.bar { position: relative; }
td.bar span.fill { position: absolute; left: 0; top: 4px; bottom: 4px; background: #dbe4f3; z-index: 0; border-radius: 2px; }
td.bar span.text { position: relative; z-index: 1; }
.intro { color: var(--muted); margin: 0 0 8px; }
figure { margin: 28px 0; }
figure svg, figure img { width: 100%; height: auto; max-width: 1200px; display: block; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); max-width: 1000px; margin-top: 6px; }
dl.glossary dt { font-weight: bold; margin-top: 8px; }
dl.glossary dd { margin: 0 0 0 16px; color: var(--muted); }
footer { color: var(--muted); font-size: 13px; padding: 0 40px 24px; }
</style>
</head>
<body>
<header>
<h1>{{.Title}}</h1>
<div class="sub">{{.Subtitle}}</div>
{{if .Notes}}<div class="notes">{{range .Notes}}<div>{{.}}</div>{{end}}</div>{{end}}
</header>
<main>
{{if .Cards}}<section class="cards">{{range .Cards}}
<div class="card{{if .Bad}} bad{{end}}"><div class="label">{{.Label}}</div><div class="value">{{.Value}}</div><div class="note">{{.Note}}</div></div>{{end}}
</section>{{end}}
{{range .Tables}}<section>
<h2>{{.Title}}</h2>{{if .Intro}}<p class="intro">{{.Intro}}</p>{{end}}
<table><thead><tr>{{range .Head}}<th>{{.}}</th>{{end}}</tr></thead><tbody>
{{range .Rows}}{{$bar := .Bar}}{{$col := .BarCol}}<tr>{{range $i, $c := .Cells}}{{if and (gt $bar 0.0) (eq $i $col)}}<td class="bar"><span class="fill" style="width: {{width $bar}}"></span><span class="text">{{$c}}</span></td>{{else}}<td>{{$c}}</td>{{end}}{{end}}</tr>
{{end}}</tbody></table>
</section>{{end}}
{{range .Figures}}<figure id="{{.Name}}" style="max-width: {{.MaxWidthPx}}px">{{.SVG}}<figcaption>{{.Caption}}</figcaption></figure>
{{end}}
{{if .Glossary}}<section><h2>Reading this report</h2><dl class="glossary">{{range .Glossary}}<dt>{{index . 0}}</dt><dd>{{index . 1}}</dd>{{end}}</dl></section>{{end}}
</main>
<footer>Generated by tpsprof on {{.Generated}}. Self-contained: no script, nothing fetched.</footer>
</body>
</html>
`))

func notCounted(g Goodput) string {
	if nc := g.NotCountedText(); nc != "" {
		return " Not counted: " + nc + "."
	}
	return ""
}

// shareWords are the breakdown's parts as the HTML page names them.
var shareWords = map[string]string{
	"compute":           "compute",
	"exposed_comm":      "exposed communication (transfer not hidden by compute)",
	"waiting_for_peers": "waiting for slower peers (in collectives, until the slowest rank arrived)",
	"bubble":            "pipeline bubble",
	"data_stall":        "data-loader stall",
	"checkpoint":        "checkpoint",
	"host_other":        "host and other (outside the ranks' steps, and their host work before the forward)",
}

// throughputCard leads the page: tokens over step time, or why none.
func throughputCard(s tps.Summary) htmlCard {
	if s.TPSUnknown != "" {
		return htmlCard{Label: "throughput", Value: "n/a", Note: s.TPSUnknown, Bad: true}
	}
	note := fmt.Sprintf("tokens ÷ step time of %d steady steps (a step's own rate: p50 %s, p95 %s)", s.SteadySteps, tps.SI(s.TPS.P50), tps.SI(s.TPS.P95))
	if s.WallTPS > 0 {
		note += fmt.Sprintf("; wall %s tokens/s with the gaps between steps", tps.SI(s.WallTPS))
	}
	return htmlCard{Label: "throughput", Value: tps.SI(s.AggregateTPS) + " tokens/s", Note: note}
}

func perGPUCard(s tps.Summary) htmlCard {
	if s.TPSUnknown != "" {
		return htmlCard{Label: "per GPU", Value: "n/a", Note: "no tokens counted"}
	}
	return htmlCard{Label: "per GPU", Value: tps.SI(s.TPSPerGPU) + " tokens/s", Note: fmt.Sprintf("%d GPUs", s.WorldSize)}
}

// siOrNA is a throughput, or n/a where no token was counted.
func siOrNA(v float64) string {
	if v <= 0 {
		return "n/a"
	}
	return tps.SI(v)
}
