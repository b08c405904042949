package report

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/tpsprof/tpsprof/tps"
)

// Comparison is two runs side by side: their shapes first (so that a
// bigger batch is not read as a slower step), then the figures with their
// differences. Rates and times differ by a relative change; fractions
// (MFU, the time breakdown, goodput) by percentage points. Unknown values
// are null in JSON and n/a in text, never 0.
type Comparison struct {
	A     string       `json:"a"`
	B     string       `json:"b"`
	Shape []CompareRow `json:"shape"`
	Rows  []CompareRow `json:"rows"`
	Notes []string     `json:"notes,omitempty"`
	// Verdict is whether B is slower or faster, beyond the runs' noise.
	Verdict Verdict `json:"verdict"`
}

// CompareRow is one figure of both runs.
type CompareRow struct {
	Name string `json:"name"`
	// Unit is "tokens/s", "bytes/s", "s", "tokens", "count", "ratio",
	// "fraction" or "text".
	Unit  string   `json:"unit"`
	A     *float64 `json:"a,omitempty"`
	B     *float64 `json:"b,omitempty"`
	TextA string   `json:"a_text,omitempty"`
	TextB string   `json:"b_text,omitempty"`
	// DeltaPct is (B−A)/|A| in percent, for rates, times and counts.
	DeltaPct *float64 `json:"delta_pct,omitempty"`
	// DeltaPoints is B−A in percentage points, for fractions.
	DeltaPoints *float64 `json:"delta_points,omitempty"`
}

func num(v float64) *float64 { return &v }

// known is v, or nil when ok is false.
func known(v float64, ok bool) *float64 {
	if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func valueRow(name, unit string, a, b *float64) CompareRow {
	r := CompareRow{Name: name, Unit: unit, A: a, B: b}
	if a != nil && b != nil {
		if unit == "fraction" {
			r.DeltaPoints = num(100 * (*b - *a))
		} else if *a != 0 {
			r.DeltaPct = num(100 * (*b - *a) / math.Abs(*a))
		}
	}
	return r
}

func textRow(name, a, b string) CompareRow {
	return CompareRow{Name: name, Unit: "text", TextA: orDash(a), TextB: orDash(b)}
}

// Compare puts two reports side by side.
func Compare(a, b *Report) Comparison {
	c := Comparison{A: a.Job, B: b.Job}
	c.Shape = compareShape(a, b)
	c.Rows = compareRates(a, b)
	c.compareText(a, b)
	c.Rows = append(c.Rows, compareGeneration(a, b)...)
	c.notes(a, b)
	c.Verdict = CompareVerdict(a, b)
	return c
}

func metaOf(r *Report) tps.RunMeta {
	if r.Meta != nil {
		return *r.Meta
	}
	return tps.RunMeta{}
}

func modelName(m tps.RunMeta) string {
	if m.ModelPreset == "" && m.Model != nil {
		return "custom model"
	}
	return m.ModelPreset
}

func topologyText(m tps.RunMeta) string {
	if m.Topology == (tps.Topology{}) {
		return ""
	}
	return m.Topology.String()
}

// LayoutText is the run's layout as the report's run line says it: the
// declared one, or, where the job declared none, that every rank counts
// as a data-parallel replica (as the cluster rows count them: "dp=1 tp=1
// pp=1" for a 2-rank DDP job read as one replica).
func LayoutText(m tps.RunMeta, ranks int64) string {
	if m.Topology == (tps.Topology{}) {
		return fmt.Sprintf("no layout declared (every rank a data-parallel replica: dp=%d)", ranks)
	}
	return m.Topology.String()
}

func tokensPerStep(s tps.Summary) *float64 {
	return known(float64(s.Tokens)/float64(s.SteadySteps), s.SteadySteps > 0)
}

// compareShape is what the runs are: layout, model, GPU, steps.
func compareShape(a, b *Report) []CompareRow {
	sa, sb, ma, mb := a.Summary, b.Summary, metaOf(a), metaOf(b)
	return []CompareRow{
		textRow("topology", topologyText(ma), topologyText(mb)),
		valueRow("ranks", "count", num(float64(sa.WorldSize)), num(float64(sb.WorldSize))),
		textRow("model", modelName(ma), modelName(mb)),
		textRow("GPU", ma.GPU, mb.GPU),
		textRow("dtype", ma.DType, mb.DType),
		valueRow("tokens per step", "tokens", tokensPerStep(sa), tokensPerStep(sb)),
		valueRow("steady steps", "count", num(float64(sa.SteadySteps)), num(float64(sb.SteadySteps))),
	}
}

// compareRates is throughput, utilisation, the breakdown and goodput.
func compareRates(a, b *Report) []CompareRow {
	sa, sb := a.Summary, b.Summary
	steady := func(s tps.Summary) bool { return s.SteadySteps > 0 }
	frac := func(v float64, r *Report) *float64 { return known(v, steady(r.Summary)) }
	rows := []CompareRow{
		valueRow("TPS (tokens ÷ step time)", "tokens/s", known(sa.AggregateTPS, hasTPS(sa)), known(sb.AggregateTPS, hasTPS(sb))),
		valueRow("TPS per GPU", "tokens/s", known(sa.TPSPerGPU, hasTPS(sa)), known(sb.TPSPerGPU, hasTPS(sb))),
		valueRow("wall TPS", "tokens/s", known(sa.WallTPS, hasTPS(sa) && sa.WallTPS > 0), known(sb.WallTPS, hasTPS(sb) && sb.WallTPS > 0)),
		valueRow("step TPS p50 (a step's own rate)", "tokens/s", known(sa.TPS.P50, hasTPS(sa)), known(sb.TPS.P50, hasTPS(sb))),
		valueRow("step time p50", "s", known(sa.StepTimeS.P50, steady(a.Summary)), known(sb.StepTimeS.P50, steady(b.Summary))),
		valueRow("MFU", "fraction", sa.MFU, sb.MFU),
		valueRow("HFU", "fraction", sa.HFU, sb.HFU),
	}
	for _, part := range tps.ShareParts() {
		rows = append(rows, valueRow(part.Label, "fraction", frac(*part.Of(&a.Breakdown.Shares), a), frac(*part.Of(&b.Breakdown.Shares), b)))
	}
	return append(rows,
		valueRow("goodput", "fraction", known(a.Goodput.Goodput, a.Goodput.ElapsedS > 0), known(b.Goodput.Goodput, b.Goodput.ElapsedS > 0)),
		textRow("worst straggler", worstNode(a), worstNode(b)))
}

func textRates(r *Report) (bps, tpb *float64) {
	if r.Text == nil {
		return nil, nil
	}
	return num(r.Text.BytesPerSecond), num(r.Text.TokensPerByte)
}

// compareText adds throughput in text when the runs have it, and says
// when a token is not the same unit in both.
func (c *Comparison) compareText(a, b *Report) {
	ma, mb := metaOf(a), metaOf(b)
	ba, ta := textRates(a)
	bb, tb := textRates(b)
	if ba != nil || bb != nil {
		c.Rows = append(c.Rows, valueRow("text bytes/s", "bytes/s", ba, bb), valueRow("tokens per byte", "ratio", ta, tb))
	}
	if !(ta != nil && tb != nil && math.Abs(*ta-*tb) > 0.02*math.Max(*ta, *tb) || ma.Tokenizer != mb.Tokenizer && ma.Tokenizer != "" && mb.Tokenizer != "") {
		return
	}
	what := "their tokenizers differ"
	if ta != nil && tb != nil {
		what = fmt.Sprintf("their tokenizers differ (%.3f and %.3f tokens per byte of text)", *ta, *tb)
	}
	if ba != nil && bb != nil {
		c.Notes = append(c.Notes, fmt.Sprintf("%s: a token is not the same unit in both, so TPS does not compare; text bytes/s does (%s against %s bytes/s, %+.1f%%)",
			what, tps.SI(*ba), tps.SI(*bb), 100*(*bb-*ba) / *ba))
	} else {
		c.Notes = append(c.Notes, what+": TPS does not compare; report bytes (prof.end(bytes=...)) to compare by text bytes/s")
	}
}

// compareGeneration is the generation phase's rows, when a run has one.
func compareGeneration(a, b *Report) []CompareRow {
	if a.Generation == nil && b.Generation == nil {
		return nil
	}
	gen := func(r *Report, f func(g *Generation) float64) *float64 {
		if r.Generation == nil {
			return nil
		}
		return num(f(r.Generation))
	}
	lat := func(r *Report, l func(g *Generation) *Latency) *float64 {
		if r.Generation == nil || l(r.Generation) == nil {
			return nil
		}
		return num(l(r.Generation).P95)
	}
	return []CompareRow{
		valueRow("generation TPS (output)", "tokens/s", gen(a, func(g *Generation) float64 { return g.OutputTPS }), gen(b, func(g *Generation) float64 { return g.OutputTPS })),
		valueRow("generation share of step", "fraction", gen(a, func(g *Generation) float64 { return g.GenShare }), gen(b, func(g *Generation) float64 { return g.GenShare })),
		valueRow("training share of step", "fraction", gen(a, func(g *Generation) float64 { return g.TrainingShare }), gen(b, func(g *Generation) float64 { return g.TrainingShare })),
		valueRow("time to first token p95", "s", lat(a, func(g *Generation) *Latency { return g.TTFT }), lat(b, func(g *Generation) *Latency { return g.TTFT })),
		valueRow("inter-token latency p95", "s", lat(a, func(g *Generation) *Latency { return g.ITL }), lat(b, func(g *Generation) *Latency { return g.ITL })),
	}
}

// notes says what does not compare.
func (c *Comparison) notes(a, b *Report) {
	sa, sb, ma, mb := a.Summary, b.Summary, metaOf(a), metaOf(b)
	if sa.WorldSize != sb.WorldSize {
		c.Notes = append(c.Notes, fmt.Sprintf("the runs have different world sizes (%d and %d ranks): compare TPS per GPU and MFU, not TPS", sa.WorldSize, sb.WorldSize))
	}
	if pa, pb := tokensPerStep(sa), tokensPerStep(sb); pa != nil && pb != nil && math.Abs(*pa-*pb) > 0.01*math.Max(*pa, *pb) {
		c.Notes = append(c.Notes, fmt.Sprintf("the runs train different tokens per step (%s and %s): step time is not comparable, TPS is", tps.SI(*pa), tps.SI(*pb)))
	}
	if ma.ModelPreset != mb.ModelPreset || (ma.Model == nil) != (mb.Model == nil) {
		c.Notes = append(c.Notes, "the runs train different models: compare MFU, not TPS")
	}
	for _, x := range []struct {
		job string
		s   tps.Summary
	}{{a.Job, sa}, {b.Job, sb}} {
		if x.s.MFU == nil {
			c.Notes = append(c.Notes, fmt.Sprintf("MFU of %s is unknown: %s", x.job, x.s.MFUUnknown))
		}
	}
}

func worstNode(r *Report) string {
	if _, flagged := r.flaggedStragglers(); len(flagged) > 0 {
		return fmt.Sprintf("%s %.2f", flagged[0].name, flagged[0].score)
	}
	return "none"
}

func (r CompareRow) cell(v *float64, text string) string {
	if r.Unit == "text" {
		return text
	}
	if v == nil {
		return "n/a"
	}
	switch r.Unit {
	case "fraction":
		return pct(*v)
	case "s":
		return fmt.Sprintf("%.3f s", *v)
	case "count":
		return fmt.Sprintf("%.0f", *v)
	case "ratio":
		return fmt.Sprintf("%.3f", *v)
	}
	return tps.SI(*v)
}

func (r CompareRow) delta() string {
	switch {
	case r.DeltaPoints != nil:
		return fmt.Sprintf("%+.1f pt", *r.DeltaPoints)
	case r.DeltaPct != nil:
		return fmt.Sprintf("%+.1f%%", *r.DeltaPct)
	case r.Unit == "text" && r.TextA != r.TextB:
		return "differs"
	}
	return ""
}

// WriteCompare prints two runs side by side with the differences.
func WriteCompare(w io.Writer, a, b *Report) error {
	c := Compare(a, b)
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 3, ' ', tabwriter.AlignRight)
	width := 0
	for _, r := range append(slices.Clone(c.Shape), c.Rows...) {
		width = max(width, utf8.RuneCountInString(r.Name))
	}
	line := func(x, y, z, d string) {
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t\n", x, strings.Repeat(" ", width-utf8.RuneCountInString(x)), y, z, d)
	}
	line("", c.A, c.B, "delta")
	for i, rows := range [][]CompareRow{c.Shape, c.Rows} {
		if i == 1 {
			line("", "", "", "")
		}
		for _, r := range rows {
			line(r.Name, r.cell(r.A, r.TextA), r.cell(r.B, r.TextB), r.delta())
		}
	}
	tw.Flush()
	sb.WriteString("\nverdict: " + c.Verdict.Text + "\n")
	return writeWithNotes(w, &sb, c.Notes, "note: ")
}

// writeWithNotes writes sb and then the notes, each after prefix on a
// line of its own.
func writeWithNotes(w io.Writer, sb *strings.Builder, notes []string, prefix string) error {
	if len(notes) > 0 {
		sb.WriteString("\n")
		for _, n := range notes {
			sb.WriteString(prefix + n + "\n")
		}
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// WriteCompareMarkdown prints the comparison as a Markdown table.
func WriteCompareMarkdown(w io.Writer, a, b *Report) error {
	c := Compare(a, b)
	var sb strings.Builder
	fmt.Fprintf(&sb, "## tpsprof compare: %s vs %s\n\n**Verdict:** %s\n\n| | %s | %s | delta |\n|---|---|---|---|\n", c.A, c.B, c.Verdict.Text, c.A, c.B)
	for _, rows := range [][]CompareRow{c.Shape, c.Rows} {
		for _, r := range rows {
			fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", r.Name, r.cell(r.A, r.TextA), r.cell(r.B, r.TextB), r.delta())
		}
	}
	return writeWithNotes(w, &sb, c.Notes, "- ")
}

// hasTPS says whether the summary has a throughput (steady steps that
// counted tokens).
func hasTPS(s tps.Summary) bool { return s.SteadySteps > 0 && s.TPSUnknown == "" }
