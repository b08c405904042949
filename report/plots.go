package report

import (
	"bytes"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/tps"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/palette/moreland"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Colours of the breakdown categories, used across plots.
var (
	colCompute = color.RGBA{R: 0x4c, G: 0x72, B: 0xb0, A: 0xff}
	colComm    = color.RGBA{R: 0xdd, G: 0x84, B: 0x52, A: 0xff}
	colBubble  = color.RGBA{R: 0x55, G: 0xa8, B: 0x68, A: 0xff}
	colData    = color.RGBA{R: 0xc4, G: 0x4e, B: 0x52, A: 0xff}
	colCkpt    = color.RGBA{R: 0x81, G: 0x72, B: 0xb2, A: 0xff}
	colWait    = color.RGBA{R: 0xda, G: 0x8b, B: 0xc3, A: 0xff}
	colOther   = color.RGBA{R: 0xcc, G: 0xb9, B: 0x74, A: 0xff}
	colGrey    = color.RGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff}
	colWarm    = color.RGBA{R: 0xee, G: 0xee, B: 0xee, A: 0xff}
)

// shareColors are the breakdown parts' colours (tps.ShareParts keys).
var shareColors = map[string]color.Color{
	"compute": colCompute, "exposed_comm": colComm, "waiting_for_peers": colWait, "bubble": colBubble,
	"data_stall": colData, "checkpoint": colCkpt, "host_other": colOther,
}

// faint is c drawn at a quarter of its strength (the raw series under a
// smoothed one).
func faint(c color.RGBA) color.RGBA {
	return color.RGBA{R: uint8(0xff - (0xff-int(c.R))/3), G: uint8(0xff - (0xff-int(c.G))/3), B: uint8(0xff - (0xff-int(c.B))/3), A: 0xff}
}

// Figure is one plot file: a single plot or plots stacked vertically.
// Heights, when set, are the plots' shares of the height.
type Figure struct {
	Name    string
	Plots   []*plot.Plot
	W, H    vg.Length
	Heights []float64
	// Caption says in a sentence what the figure shows (the HTML report
	// prints it under the figure).
	Caption string
}

// figures draws a report's plots: its result beside what they draw.
type figures struct {
	*Report
	data *Plots
}

// Figures builds every plot the report's data allows. Each is a pure
// function of the report and its plot data; the caller saves them
// (SaveFigures). A nil p draws none.
func (p *Plots) Figures(report *Report) ([]Figure, error) {
	if p == nil || report == nil || len(p.steps) == 0 {
		return nil, nil
	}
	rep := &figures{report, p}
	var figs []Figure
	for _, f := range []struct {
		name  string
		w, h  vg.Length
		build func() (Figure, error)
	}{
		{"tps_comm", 10 * vg.Inch, 6 * vg.Inch, rep.plotTPSComm},
		{"tps_vs_comm", 7 * vg.Inch, 6 * vg.Inch, rep.plotScatter},
		{"breakdown", 10 * vg.Inch, 5 * vg.Inch, rep.plotBreakdown},
		{"phases", 10 * vg.Inch, 4.5 * vg.Inch, rep.plotPhases},
		{"rank_heatmap", 10 * vg.Inch, 7.5 * vg.Inch, rep.plotHeatmap},
		{"mfu", 10 * vg.Inch, 4 * vg.Inch, rep.plotMFU},
		{"gpu", 10 * vg.Inch, 7 * vg.Inch, rep.plotGPU},
	} {
		fig, err := f.build()
		if err != nil {
			return nil, fmt.Errorf("report: plot %s: %w", f.name, err)
		}
		if fig.Plots != nil {
			fig.Name, fig.W, fig.H = f.name, f.w, f.h
			figs = append(figs, fig)
		}
	}
	return figs, nil
}

// SaveFigures writes every figure as NAME.png and NAME.svg (fonts
// embedded) into dir and returns the paths.
func SaveFigures(figs []Figure, dir string) ([]string, error) {
	if err := safefs.OutputDir(dir); err != nil {
		return nil, fmt.Errorf("report: --plots: %w", err)
	}
	var paths []string
	for _, f := range figs {
		for _, ext := range []string{"png", "svg"} {
			p := filepath.Join(dir, f.Name+"."+ext)
			if err := writeFigure(f, ext, p); err != nil {
				return paths, err
			}
			paths = append(paths, p)
		}
	}
	return paths, nil
}

// Render draws a figure as png (at dpi) or svg (fonts embedded).
func (f Figure) Render(w io.Writer, format string, dpi int) error {
	var c vg.CanvasWriterTo
	switch format {
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(f.W, f.H), vgimg.UseDPI(dpi))}
	case "svg":
		c = vgsvg.NewWith(vgsvg.UseWH(f.W, f.H), vgsvg.EmbedFonts(true))
	case "svgtext": // SVG naming its fonts rather than embedding them (HTML)
		c = vgsvg.NewWith(vgsvg.UseWH(f.W, f.H))
	default:
		return fmt.Errorf("report: unknown format %q", format)
	}
	dc := draw.New(c)
	// white background (PNG is transparent otherwise), and a margin so
	// titles and end labels do not touch the edge
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	dc = draw.Crop(dc, vg.Points(6), -vg.Points(10), vg.Points(4), -vg.Points(8))
	if len(f.Plots) == 1 {
		f.Plots[0].Draw(dc)
	} else {
		heights := f.Heights
		if len(heights) != len(f.Plots) {
			heights = make([]float64, len(f.Plots))
			for i := range heights {
				heights[i] = 1
			}
		}
		var total float64
		for _, h := range heights {
			total += h
		}
		// Align the plots' left edges (their y-axis widths differ) the way
		// plot.Align does, on cells of the given heights.
		cells := make([]draw.Canvas, len(f.Plots))
		top := dc.Max.Y
		full := dc.Max.Y - dc.Min.Y
		for i, h := range heights {
			hh := full * vg.Length(h/total)
			cells[i] = draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: dc.Min.X, Y: top - hh}, Max: vg.Point{X: dc.Max.X, Y: top}}}
			top -= hh
		}
		var left vg.Length
		for i, p := range f.Plots {
			da := p.DataCanvas(cells[i])
			left = max(left, da.Min.X-cells[i].Min.X)
		}
		for i, p := range f.Plots {
			da := p.DataCanvas(cells[i])
			shift := left - (da.Min.X - cells[i].Min.X)
			cells[i].Min.X += shift
			p.Draw(cells[i])
		}
	}
	_, err := c.(io.WriterTo).WriteTo(w)
	return err
}

func writeFigure(f Figure, ext, path string) error {
	var b bytes.Buffer
	if err := f.Render(&b, ext, 110); err != nil {
		return err
	}
	if err := safefs.WriteFileAtomic(path, func(f *os.File) error { _, err := f.Write(b.Bytes()); return err }); err != nil {
		return fmt.Errorf("report: write %s: %w", path, err)
	}
	return nil
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(6)
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	return p
}

func line(xy plotter.XYs, c color.Color, width vg.Length) (*plotter.Line, error) {
	l, err := plotter.NewLine(xy)
	if err != nil {
		return nil, err
	}
	l.Color, l.Width = c, width
	return l, nil
}

// niceTicks marks an axis with 5 to 10 round values (1, 2, 2.5 or 5 times
// a power of ten) labelled alike: "0 / 100k / 200k", never "261.6k".
type niceTicks struct {
	unit   string // appended to each label ("%")
	si     bool   // k/M/G suffixes
	within bool   // only ticks inside [min, max] (axes with headroom above)
	hi     float64
}

func niceStep(span float64, want int) float64 {
	if span <= 0 || math.IsNaN(span) || math.IsInf(span, 0) {
		return 1
	}
	raw := span / float64(want)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func (t niceTicks) Ticks(lo, hi float64) []plot.Tick {
	if t.hi > 0 {
		hi = min(hi, t.hi)
	}
	step := niceStep(hi-lo, 6)
	var out []plot.Tick
	start := math.Ceil(lo/step-1e-9) * step
	for v := start; v <= hi+step*1e-9; v += step {
		out = append(out, plot.Tick{Value: v, Label: t.label(v, step)})
		// minor ticks between
		if m := v + step/2; m < hi {
			out = append(out, plot.Tick{Value: m})
		}
	}
	return out
}

func (t niceTicks) label(v, step float64) string {
	if math.Abs(v) < step*1e-6 {
		return "0" + t.unit
	}
	if !t.si {
		dec := max(0, int(math.Ceil(-math.Log10(step)+1e-9)))
		if step >= 1 && step == math.Trunc(step) {
			dec = 0
		}
		return fmt.Sprintf("%.*f%s", dec, v, t.unit)
	}
	div, suffix := 1.0, ""
	switch a := step * 4; {
	case a >= 1e12:
		div, suffix = 1e12, "T"
	case a >= 1e9:
		div, suffix = 1e9, "G"
	case a >= 1e6:
		div, suffix = 1e6, "M"
	case a >= 1e3:
		div, suffix = 1e3, "k"
	}
	s := step / div
	dec := max(0, int(math.Ceil(-math.Log10(s)+1e-9)))
	if s == math.Trunc(s) {
		dec = 0
	} else if s*2 == math.Trunc(s*2) && dec == 0 {
		dec = 1
	}
	if s == 2.5 || s == 0.25 || s == 25 {
		dec = max(dec, 1)
		if s == 0.25 {
			dec = 2
		}
	}
	return fmt.Sprintf("%.*f%s%s", dec, v/div, suffix, t.unit)
}

// smooth is a centred moving mean over w points (w odd); NaN-free input.
func smooth(ys []float64, w int) []float64 {
	out := make([]float64, len(ys))
	h := w / 2
	var sum float64
	n := 0
	lo, hi := 0, -1
	for i := range ys {
		for hi < min(i+h, len(ys)-1) {
			hi++
			sum += ys[hi]
			n++
		}
		for lo < i-h {
			sum -= ys[lo]
			n--
			lo++
		}
		out[i] = sum / float64(n)
	}
	return out
}

// smoothWindow is the moving-mean window for n steps: none up to 200
// steps, then about n/100 (odd).
func smoothWindow(n int) int {
	if n <= 200 {
		return 1
	}
	return n/100 | 1
}

// runs splits the steps into runs of one attempt (a restart starts a new
// line: attempts may repeat step numbers).
func runs(steps []plotStep) [][2]int {
	var out [][2]int
	start := 0
	for i := 1; i <= len(steps); i++ {
		if i == len(steps) || steps[i].Attempt != steps[start].Attempt {
			out = append(out, [2]int{start, i})
			start = i
		}
	}
	return out
}

// segments splits the steps into runs drawn as one line: a new attempt,
// or steps missing from the traces (an agent or the collector was down:
// unmonitored, drawn as a gap rather than a straight line across it).
func segments(steps []plotStep) [][2]int {
	var out [][2]int
	start := 0
	for i := 1; i <= len(steps); i++ {
		if i == len(steps) || steps[i].Attempt != steps[start].Attempt || steps[i].Step > steps[i-1].Step+1 {
			out = append(out, [2]int{start, i})
			start = i
		}
	}
	return out
}

// series draws ys over the steps' numbers, one line per segment: faint
// raw values under a moving mean when the run is long. It returns the
// line for the legend (the smoothed one when there is one).
func series(p *plot.Plot, steps []plotStep, ys []float64, keep func(i int) bool, c color.RGBA, width vg.Length, dashed bool) (*plotter.Line, int, error) {
	w := smoothWindow(len(steps))
	var legend *plotter.Line
	for _, r := range segments(steps) {
		var xs, vs []float64
		for i := r[0]; i < r[1]; i++ {
			if keep == nil || keep(i) {
				xs, vs = append(xs, float64(steps[i].Step)), append(vs, ys[i])
			}
		}
		if len(xs) == 0 {
			continue
		}
		mk := func(v []float64) plotter.XYs {
			xy := make(plotter.XYs, len(xs))
			for i := range xs {
				xy[i] = plotter.XY{X: xs[i], Y: v[i]}
			}
			return xy
		}
		if w > 1 {
			raw, err := line(mk(vs), faint(c), vg.Points(0.5))
			if err != nil {
				return nil, w, err
			}
			p.Add(raw)
			vs = smooth(vs, w)
		}
		l, err := line(mk(vs), c, width)
		if err != nil {
			return nil, w, err
		}
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		legend = l
	}
	return legend, w, nil
}

// mark is an event on the step axis.
type mark struct {
	step  float64
	label string
	col   color.Color
}

// marks are the run's events placed on steps: restarts, checkpoints and
// evaluations (from events, or from steps whose ranks spent time
// checkpointing), at most 40 labelled.
func (rep *figures) marks() []mark {
	steps := rep.data.steps
	var out []mark
	for _, r := range runs(steps)[1:] {
		out = append(out, mark{float64(steps[r[0]].Step), fmt.Sprintf("restart (attempt %d)", steps[r[0]].Attempt), colData})
	}
	// events by time → the step running then
	type st struct {
		t    int64
		step int64
	}
	byTime := make([]st, len(steps))
	for i, c := range steps {
		byTime[i] = st{c.StartUnixNs, c.Step}
	}
	sort.Slice(byTime, func(a, b int) bool { return byTime[a].t < byTime[b].t })
	stepAt := func(t int64) (int64, bool) {
		i := sort.Search(len(byTime), func(i int) bool { return byTime[i].t > t })
		if i == 0 {
			return 0, false
		}
		return byTime[i-1].step, true
	}
	ckpt := map[int64]bool{} // steps marked as checkpoints: once each
	markCkpt := func(s int64) {
		if !ckpt[s] {
			ckpt[s] = true
			out = append(out, mark{float64(s), "checkpoint", colCkpt})
		}
	}
	for _, e := range rep.data.events {
		s, ok := stepAt(e.StartUnixNs)
		switch {
		case !ok:
		case e.Kind == tps.EventCheckpointSave:
			markCkpt(s)
		case e.Kind == tps.EventEval:
			out = append(out, mark{float64(s), "eval", colBubble})
		}
	}
	for _, c := range steps {
		if c.CkptFractionMean > 0.05 {
			markCkpt(c.Step)
		}
	}
	if len(out) > 40 { // too many to label: keep every k-th
		k := (len(out) + 39) / 40
		var kept []mark
		for i := 0; i < len(out); i += k {
			kept = append(kept, out[i])
		}
		out = kept
	}
	return out
}

// addMarks draws the events as thin vertical lines with a label at the
// top, and shades the warm-up steps.
func (rep *figures) addMarks(p *plot.Plot, top float64, labels bool) error {
	steps, warm := rep.data.steps, rep.data.warm
	for _, r := range runs(steps) {
		i := r[0]
		for i < r[1] && warm[i] {
			i++
		}
		if i > r[0] {
			x0, x1 := float64(steps[r[0]].Step)-0.5, float64(steps[i-1].Step)+0.5
			poly, err := plotter.NewPolygon(plotter.XYs{{X: x0, Y: 0}, {X: x1, Y: 0}, {X: x1, Y: top}, {X: x0, Y: top}})
			if err != nil {
				return err
			}
			poly.Color, poly.LineStyle.Width = colWarm, 0
			p.Add(poly)
			if labels && r[0] == 0 { // the first only: the others' labels would crowd a restart's
				if err := addLabel(p, x0, top, "warm-up", colGrey); err != nil {
					return err
				}
			}
		}
	}
	// Labels go in three rows at the top; one that would overlap the
	// previous label of every row is left out (its line stays).
	span := float64(steps[len(steps)-1].Step - steps[0].Step + 1)
	for _, r := range runs(steps)[1:] {
		span = max(span, float64(steps[r[1]-1].Step-steps[0].Step+1))
	}
	rowEnd := []float64{math.Inf(-1), math.Inf(-1), math.Inf(-1)}
	if len(warm) > 0 && warm[0] {
		rowEnd[0] = float64(steps[0].Step) + span*0.1 // the warm-up label
	}
	for _, m := range rep.marks() {
		l, err := line(plotter.XYs{{X: m.step, Y: 0}, {X: m.step, Y: top}}, m.col, vg.Points(0.6))
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		p.Add(l)
		if !labels {
			continue
		}
		for row := range rowEnd {
			if m.step > rowEnd[row] {
				rowEnd[row] = m.step + span*0.012*float64(len(m.label)+1)
				if err := addLabel(p, m.step, top*(0.985-0.06*float64(row)), m.label, m.col); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}

func addLabel(p *plot.Plot, x, y float64, text string, c color.Color) error {
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: x, Y: y}}, Labels: []string{" " + text}})
	if err != nil {
		return err
	}
	l.TextStyle[0].Color = c
	l.TextStyle[0].Font.Size = vg.Points(8)
	l.TextStyle[0].YAlign = draw.YTop
	p.Add(l)
	return nil
}

// plotTPSComm: step TPS over steps, and below it the exposed
// communication share, on the same step axis, events marked.
func (rep *figures) plotTPSComm() (Figure, error) {
	steps := rep.data.steps
	top := newPlot(fmt.Sprintf("%s: cluster throughput per step", rep.Job), "", "tokens/s")
	tpsY := make([]float64, len(steps))
	comm := make([]float64, len(steps))
	maxTPS, maxComm := 0.0, 0.0
	for i, c := range steps {
		tpsY[i], comm[i] = c.TPS, 100*c.CommFractionMean
		maxTPS, maxComm = max(maxTPS, c.TPS), max(maxComm, comm[i])
	}
	yTop := maxTPS * 1.25 // headroom for the legend and event labels
	if err := rep.addMarks(top, yTop, true); err != nil {
		return Figure{}, err
	}
	lt, w, err := series(top, steps, tpsY, nil, colCompute, vg.Points(1.3), false)
	if err != nil {
		return Figure{}, err
	}
	name := "step TPS"
	if w > 1 {
		name = fmt.Sprintf("step TPS, moving mean of %d steps (raw faint)", w)
	}
	top.Legend.Add(name, lt)
	top.Legend.Top, top.Legend.Left = false, true // the event labels take the top
	top.Legend.XOffs, top.Legend.YOffs = vg.Points(8), vg.Points(6)
	top.Y.Min, top.Y.Max = 0, yTop
	top.Y.Tick.Marker = niceTicks{si: true, hi: maxTPS * 1.05}
	top.X.Tick.Marker = niceTicks{}

	bottom := newPlot("", "step", "exposed comm (% of step)")
	cTop := math.Max(5, math.Ceil(maxComm*1.25/5)*5)
	if err := rep.addMarks(bottom, cTop, false); err != nil {
		return Figure{}, err
	}
	lc, _, err := series(bottom, steps, comm, nil, colComm, vg.Points(1.1), false)
	if err != nil {
		return Figure{}, err
	}
	bottom.Legend.Add("exposed communication, mean over ranks", lc)
	bottom.Y.Min, bottom.Y.Max = 0, cTop
	bottom.Y.Tick.Marker = niceTicks{unit: "%"}
	bottom.X.Tick.Marker = niceTicks{}
	return Figure{Plots: []*plot.Plot{top, bottom}, Heights: []float64{0.62, 0.38},
		Caption: "Tokens per second of each step (the whole cluster, tokens counted once per data-parallel replica), and the share of step time ranks spent waiting on communication compute did not hide. Shaded: warm-up steps, left out of the summary; dashed lines: restarts, checkpoints, evaluations."}, nil
}

// plotScatter: step TPS against the exposed-comm fraction, with the fit.
func (rep *figures) plotScatter() (Figure, error) {
	var xy plotter.XYs
	for i, c := range rep.data.steps {
		if !rep.data.warm[i] {
			xy = append(xy, plotter.XY{X: 100 * c.CommFractionMean, Y: c.TPS})
		}
	}
	if len(xy) == 0 {
		return Figure{}, nil
	}
	xlo, xhi, ylo, yhi := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, p := range xy {
		xlo, xhi, ylo, yhi = min(xlo, p.X), max(xhi, p.X), min(ylo, p.Y), max(yhi, p.Y)
	}
	f := rep.CommFit
	p := newPlot(fmt.Sprintf("step TPS vs exposed communication (steady steps; R² %.2f)", f.R2),
		"exposed communication (% of step time)", "step TPS (tokens/s)")
	// margins so no point sits on an edge
	dx, dy := math.Max((xhi-xlo)*0.08, 0.5), math.Max((yhi-ylo)*0.08, yhi*0.02)
	// axes start at a tick at or below the lowest point: an outlier below
	// the first label reads as off the scale
	xs, ys := niceStep(xhi-xlo+2*dx, 6), niceStep(yhi-ylo+2*dy, 6)
	p.X.Min, p.X.Max = math.Max(0, math.Floor((xlo-dx)/xs)*xs), xhi+dx
	p.Y.Min, p.Y.Max = math.Max(0, math.Floor((ylo-dy)/ys)*ys), yhi+dy*3 // headroom for the legend
	s, err := plotter.NewScatter(xy)
	if err != nil {
		return Figure{}, err
	}
	s.GlyphStyle.Color, s.GlyphStyle.Radius = colCompute, vg.Points(2)
	p.Add(s)
	p.Legend.Add("steady steps", s)
	caption := "Each point is a steady step: how its throughput falls as exposed communication grows. The slope is what one percentage point of exposed communication costs."
	if f.Related() {
		// the line only where the text finds a relation
		fit := plotter.NewFunction(func(x float64) float64 { return f.Intercept + f.Slope*x/100 })
		fit.Color, fit.Width = colComm, vg.Points(1.5)
		p.Add(fit)
		sign := ""
		if f.Slope < 0 {
			sign = "−"
		}
		p.Legend.Add(fmt.Sprintf("least-squares fit: %s%s tokens/s per percentage point", sign, tps.SI(math.Abs(f.Slope/100))), fit)
	} else {
		caption = fmt.Sprintf("Each point is a steady step. No relation between throughput and exposed communication was found (R² %.2f, below %.2f), so no line is drawn.", f.R2, MinFitR2)
	}
	p.Y.Tick.Marker = niceTicks{si: true, hi: yhi + dy}
	p.X.Tick.Marker = niceTicks{unit: "%"}
	return Figure{Plots: []*plot.Plot{p}, Caption: caption}, nil
}

type shareCat struct {
	name string
	col  color.Color
	get  func(c *plotStep) float64
}

// plotBreakdown: shares of step time, stacked, over steps (binned to at
// most 400 columns).
func (rep *figures) plotBreakdown() (Figure, error) {
	cats := make([]shareCat, 0, len(tps.ShareParts()))
	for _, part := range tps.ShareParts() {
		cats = append(cats, shareCat{part.Label, shareColors[part.Key], func(c *plotStep) float64 { return *part.Of(&c.Shares) }})
	}
	return rep.stackedShares(fmt.Sprintf("%s: where step time goes (mean over ranks)", rep.Job), cats,
		"Each part's share of step time (mean over ranks), stacked: the parts add up to 100%.")
}

// plotPhases: for RL post-training, the shares of step time spent
// generating, training and waiting, over steps.
func (rep *figures) plotPhases() (Figure, error) {
	if rep.Generation == nil {
		return Figure{}, nil
	}
	wait := func(c *plotStep) float64 {
		s := &c.Shares
		return min(1, s.ExposedComm+s.WaitingForPeers+s.Bubble+s.DataStall+s.Checkpoint)
	}
	cats := []shareCat{
		{"generation (rollouts)", colCkpt, func(c *plotStep) float64 { return c.GenFractionMean }},
		{"training (the update)", colCompute, func(c *plotStep) float64 { return max(0, 1-c.GenFractionMean-wait(c)) }},
		{"waiting (comm, slower peers, bubble, data, checkpoint)", colComm, wait},
	}
	return rep.stackedShares(fmt.Sprintf("%s: generation, training and waiting per step", rep.Job), cats,
		"For RL post-training: the mean share of step time ranks spent generating rollouts, training on them, and waiting, stacked.")
}

// stackedShares draws shares of step time, stacked, over steps (binned to
// at most 400 columns).
func (rep *figures) stackedShares(title string, cats []shareCat, caption string) (Figure, error) {
	steps := rep.data.steps
	p := newPlot(title, "step", "% of step time")
	per := max((len(steps)+399)/400, 1)
	type bin struct {
		x0, x1 float64
		v      []float64
	}
	var bins []bin
	for _, r := range runs(steps) {
		for b := r[0]; b < r[1]; b += per {
			e := min(b+per, r[1])
			bn := bin{x0: float64(steps[b].Step) - 0.5, x1: float64(steps[e-1].Step) + 0.5, v: make([]float64, len(cats))}
			var t float64 // the column's step time: each step weighs what it lasted
			for i := b; i < e; i++ {
				if steps[i].StepTimeNs <= 0 {
					continue
				}
				w := float64(steps[i].StepTimeNs)
				t += w
				for k, cat := range cats {
					bn.v[k] += 100 * w * cat.get(&steps[i])
				}
			}
			if t > 0 {
				for k := range bn.v {
					bn.v[k] /= t
				}
			}
			bins = append(bins, bn)
		}
	}
	below := make([]float64, len(bins))
	for k, cat := range cats {
		var legend *plotter.Polygon
		for bi, bn := range bins {
			lo, hi := below[bi], below[bi]+bn.v[k]
			below[bi] = hi
			if hi <= lo {
				continue
			}
			poly, err := plotter.NewPolygon(plotter.XYs{{X: bn.x0, Y: lo}, {X: bn.x1, Y: lo}, {X: bn.x1, Y: hi}, {X: bn.x0, Y: hi}})
			if err != nil {
				return Figure{}, err
			}
			poly.Color, poly.LineStyle.Width = cat.col, 0
			p.Add(poly)
			legend = poly
		}
		if legend != nil {
			p.Legend.Add(cat.name, legend)
		}
	}
	p.Y.Min, p.Y.Max = 0, 135 // headroom for the legend; the axis reads 0-100%
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 0, Label: "0%"}, {Value: 25, Label: "25%"}, {Value: 50, Label: "50%"}, {Value: 75, Label: "75%"}, {Value: 100, Label: "100%"}})
	p.X.Tick.Marker = niceTicks{}
	p.Legend.Left = false
	if per > 1 {
		caption += fmt.Sprintf(" Each column is %d consecutive steps.", per)
	}
	return Figure{Plots: []*plot.Plot{p}, Caption: caption}, nil
}

// plotStep is what the plots draw of a step (120 B; its cluster row is
// 416): the report keeps one a step when it draws plots.
type plotStep struct {
	Attempt, Step, StartUnixNs, EndUnixNs, StepTimeNs int64

	TPS, MFU, HFU, CommFractionMean, CkptFractionMean, GenFractionMean float64
	Shares                                                             tps.Shares
	mfuKnown                                                           bool // the row's MFU is known and possible
}

func plotStepOf(c *tps.ClusterStep) plotStep {
	return plotStep{Attempt: c.Attempt, Step: c.Step, StartUnixNs: c.StartUnixNs, EndUnixNs: c.EndUnixNs, StepTimeNs: c.StepTimeNs,
		TPS: c.TPS, MFU: c.MFU, HFU: c.HFU, Shares: c.Shares(),
		CommFractionMean: c.CommFractionMean, CkptFractionMean: c.CkptFractionMean, GenFractionMean: min(max(c.GenFractionMean, 0), 1),
		mfuKnown: c.MFUUnknown == "" && tps.ImpossibleMFU(c.MFU, c.HFU) == "" && c.MFU > 0}
}

func plotStepsOf(steps []tps.ClusterStep) []plotStep {
	out := make([]plotStep, len(steps))
	for i := range steps {
		out[i] = plotStepOf(&steps[i])
	}
	return out
}

// clip bounds the heat grid's values to the colour range.
type clip struct {
	*heatGrid
	lo, hi float64
}

// heatXYZ adapts the heat grid to plotter.GridXYZ, in milliseconds; x is
// the step index (attempts may repeat step numbers), labelled with step
// numbers by stepTicks.
type heatXYZ struct{ h clip }

func (g heatXYZ) Dims() (c, r int) { return g.h.stepBins, g.h.rankBins }
func (g heatXYZ) Z(c, r int) float64 {
	v := g.h.value(c, r)
	if math.IsNaN(v) {
		return v
	}
	return min(max(v, g.h.lo), g.h.hi) / 1e6
}
func (g heatXYZ) X(c int) float64 { return float64(c*g.h.stepsPer) + float64(g.h.stepsPer-1)/2 }
func (g heatXYZ) Y(r int) float64 { return float64(r*g.h.ranksPer) + float64(g.h.ranksPer-1)/2 }

// stepTicks labels a step-index axis with the steps' numbers.
type stepTicks struct{ steps []plotStep }

func (s stepTicks) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, t := range (niceTicks{}).Ticks(lo, hi) {
		i := int(math.Round(t.Value))
		if t.Label == "" || i < 0 || i >= len(s.steps) || float64(i) != t.Value {
			out = append(out, plot.Tick{Value: t.Value})
			continue
		}
		out = append(out, plot.Tick{Value: t.Value, Label: fmt.Sprint(s.steps[i].Step)})
	}
	return out
}

// plotHeatmap: compute time per rank and step, nodes marked, in the style
// MegaScale used to find stragglers: a slow rank or node is a bright band.
func (rep *figures) plotHeatmap() (Figure, error) {
	h := rep.data.heat
	if h == nil || h.stepBins < 2 || h.rankBins < 2 {
		return Figure{}, nil
	}
	// The colour range spans the 1st to 99th percentile of the steady
	// columns: warm-up steps would wash out a straggler.
	var cells []float64
	for c := 0; c < h.stepBins; c++ {
		steady := false
		for i := c * h.stepsPer; i < min((c+1)*h.stepsPer, len(rep.data.warm)); i++ {
			steady = steady || !rep.data.warm[i]
		}
		if !steady {
			continue
		}
		for r := 0; r < h.rankBins; r++ {
			if v := h.value(c, r) / 1e6; !math.IsNaN(v) {
				cells = append(cells, v)
			}
		}
	}
	if len(cells) == 0 {
		return Figure{}, nil
	}
	slices.Sort(cells)
	lo, hi := tps.Quantile(cells, 0.01), tps.Quantile(cells, 0.99)
	hi = math.Max(hi, lo*1.001+1e-9)
	pal := moreland.SmoothBlueRed()
	pal.SetMin(lo)
	pal.SetMax(hi)
	hm := plotter.NewHeatMap(heatXYZ{clip{h, lo * 1e6, hi * 1e6}}, pal.Palette(255))
	hm.NaN = color.White
	rankLabel := "rank"
	if h.ranksPer > 1 {
		rankLabel = fmt.Sprintf("rank (rows of %d ranks)", h.ranksPer)
	}
	p := newPlot(fmt.Sprintf("%s: compute time per rank and step", rep.Job), "step", rankLabel)
	p.Add(hm)
	p.X.Tick.Marker = stepTicks{rep.data.steps}
	// Nodes: a boundary line between nodes (up to 128 nodes) and the
	// node's name at the middle of its band (at most ~32 names).
	world := int64(h.rankBins * h.ranksPer)
	type band struct {
		name     string
		lo, hi   int64
		boundary bool
	}
	var bands []band
	for r := int64(0); r < world; r++ {
		n := rep.data.nodeOf[r]
		if n == "" {
			continue
		}
		if len(bands) > 0 && bands[len(bands)-1].name == n {
			bands[len(bands)-1].hi = r + 1
			continue
		}
		bands = append(bands, band{name: n, lo: r, hi: r + 1})
	}
	if len(bands) > 1 {
		xmax := float64(h.stepBins * h.stepsPer)
		if len(bands) <= 128 {
			for _, b := range bands[1:] {
				l, err := line(plotter.XYs{{X: -0.5, Y: float64(b.lo) - 0.5}, {X: xmax - 0.5, Y: float64(b.lo) - 0.5}}, color.Black, vg.Points(0.4))
				if err != nil {
					return Figure{}, err
				}
				p.Add(l)
			}
		}
		k := (len(bands) + 31) / 32
		var ticks []plot.Tick
		for i := 0; i < len(bands); i += k {
			b := bands[i]
			ticks = append(ticks, plot.Tick{Value: float64(b.lo+b.hi-1) / 2, Label: b.name})
		}
		p.Y.Tick.Marker = plot.ConstantTicks(ticks)
		p.Y.Tick.Label.Font.Size = vg.Points(8)
		p.Y.Label.Text = "node"
		if k > 1 {
			p.Y.Label.Text = fmt.Sprintf("node (every %d%s named)", k, ordinal(k))
		}
	}
	// colour bar
	cb := plot.New()
	cb.HideY()
	cb.X.Label.Text = fmt.Sprintf("compute time per step, ms (1st to 99th percentile of steady steps; beyond: clipped)")
	cb.X.Label.TextStyle.Font.Size = vg.Points(9)
	bar := &plotter.ColorBar{ColorMap: pal}
	cb.Add(bar)
	cb.X.Tick.Marker = niceTicks{}
	return Figure{Plots: []*plot.Plot{p, cb}, Heights: []float64{0.86, 0.14},
		Caption: "Each cell is one rank's compute time in a step (red: slower). A straggler is a red band along a rank or node; a slow step is a red column. Warm-up steps do not set the colour range."}, nil
}

func ordinal(k int) string {
	switch {
	case k%100 >= 11 && k%100 <= 13:
		return "th"
	case k%10 == 1:
		return "st"
	case k%10 == 2:
		return "nd"
	case k%10 == 3:
		return "rd"
	}
	return "th"
}

// plotMFU: MFU and HFU over steps, with the steady mean.
func (rep *figures) plotMFU() (Figure, error) {
	steps := rep.data.steps
	if rep.Summary.MFU == nil {
		return Figure{}, nil
	}
	p := newPlot(fmt.Sprintf("%s: FLOPs utilisation", rep.Job), "step", "% of peak")
	mfuY, hfuY := make([]float64, len(steps)), make([]float64, len(steps))
	known := func(i int) bool {
		c := steps[i]
		return c.mfuKnown
	}
	top, hasHFU := 0.0, false
	for i, c := range steps {
		mfuY[i], hfuY[i] = 100*c.MFU, 100*c.HFU
		if known(i) {
			top = max(top, mfuY[i], hfuY[i])
			hasHFU = hasHFU || c.HFU > c.MFU*1.001
		}
	}
	yTop := math.Max(top*1.3, 5)
	if err := rep.addMarks(p, yTop, false); err != nil {
		return Figure{}, err
	}
	l, _, err := series(p, steps, mfuY, known, colCompute, vg.Points(1.3), false)
	if err != nil || l == nil {
		return Figure{}, err
	}
	p.Legend.Add("MFU (model FLOPs)", l)
	if hasHFU {
		lh, _, err := series(p, steps, hfuY, known, colComm, vg.Points(1.1), true)
		if err != nil {
			return Figure{}, err
		}
		p.Legend.Add("HFU (with recomputation)", lh)
	}
	mean := 100 * *rep.Summary.MFU
	ml := plotter.NewFunction(func(float64) float64 { return mean })
	ml.Color, ml.Width, ml.Dashes = colGrey, vg.Points(1), []vg.Length{vg.Points(1), vg.Points(2)}
	p.Add(ml)
	p.Legend.Add(fmt.Sprintf("mean of steady steps: %.1f%%", mean), ml)
	p.Y.Min, p.Y.Max = 0, yTop
	p.Y.Tick.Marker = niceTicks{unit: "%", hi: top * 1.1}
	p.X.Tick.Marker = niceTicks{}
	return Figure{Plots: []*plot.Plot{p}, Caption: "Model FLOPs utilisation per step: the FLOPs the model needs per token times tokens per second, over the GPUs' peak (see the summary for the peak convention). Steps where it is unknown are left out."}, nil
}

// plotGPU: power and SM clock over steps, per GPU, cluster mean and the
// nodes that differ from it; utilisation when it varies.
func (rep *figures) plotGPU() (Figure, error) {
	g := rep.data.gpu
	if g == nil {
		return Figure{}, nil
	}
	toStep := rep.timeToStep()
	type panel struct {
		title, unit string
		col         color.RGBA
		mean        func(b int) (float64, bool)
		node        func(n *nodeGPU, b int) (float64, bool)
	}
	panels := []panel{
		{"GPU power, mean per GPU", "W", colData,
			func(b int) (float64, bool) { return g.power[b] / float64(g.n[b]), g.n[b] > 0 },
			func(n *nodeGPU, b int) (float64, bool) { return n.power[b] / float64(n.n[b]), n.n[b] > 0 }},
		{"SM clock, mean per GPU", "MHz", colCompute,
			func(b int) (float64, bool) { return g.clock[b] / float64(g.n[b]), g.n[b] > 0 },
			func(n *nodeGPU, b int) (float64, bool) { return n.clock[b] / float64(n.n[b]), n.n[b] > 0 }},
	}
	utilLo, utilHi := math.Inf(1), math.Inf(-1)
	for b := range g.nUtil {
		if g.nUtil[b] > 0 {
			u := g.util[b] / float64(g.nUtil[b])
			utilLo, utilHi = min(utilLo, u), max(utilHi, u)
		}
	}
	utilNote := ""
	if utilHi >= utilLo {
		if utilHi-utilLo >= 2 {
			panels = append(panels, panel{"GPU utilisation, mean", "%", colBubble,
				func(b int) (float64, bool) { return g.util[b] / float64(g.nUtil[b]), g.nUtil[b] > 0 }, nil})
		} else {
			utilNote = fmt.Sprintf(" (utilisation flat at %.0f%%)", (utilLo+utilHi)/2)
		}
	}
	odd := g.oddNodes(4)
	var out []*plot.Plot
	for pi, s := range panels {
		var xy plotter.XYs
		top := 0.0
		for b := range g.n {
			if v, ok := s.mean(b); ok {
				if x, ok := toStep(g.t0 + int64(b)*g.width + g.width/2); ok {
					xy = append(xy, plotter.XY{X: x, Y: v})
					top = max(top, v)
				}
			}
		}
		if len(xy) < 2 {
			continue
		}
		title := s.title
		if pi == 0 {
			title += utilNote
		}
		p := newPlot(title, "", s.unit)
		l, err := line(xy, s.col, vg.Points(1.3))
		if err != nil {
			return Figure{}, err
		}
		p.Add(l)
		p.Legend.Add("all GPUs", l)
		if s.node != nil {
			for k, name := range odd {
				n := g.nodes[name]
				var nxy plotter.XYs
				for b := range n.n {
					if v, ok := s.node(n, b); ok {
						if x, ok := toStep(g.t0 + int64(b*g.nodeBin)*g.width + int64(g.nodeBin)*g.width/2); ok {
							nxy = append(nxy, plotter.XY{X: x, Y: v})
							top = max(top, v)
						}
					}
				}
				if len(nxy) < 2 {
					continue
				}
				nl, err := line(nxy, nodeColours[k%len(nodeColours)], vg.Points(1))
				if err != nil {
					return Figure{}, err
				}
				nl.Dashes = []vg.Length{vg.Points(3), vg.Points(2)}
				p.Add(nl)
				p.Legend.Add(name+" (differs)", nl)
			}
		}
		// From zero: a 605-620 W axis made noise look like swings.
		p.Y.Min, p.Y.Max = 0, top*1.35
		p.Y.Tick.Marker = niceTicks{hi: top * 1.05}
		p.X.Tick.Marker = niceTicks{}
		out = append(out, p)
	}
	if len(out) == 0 {
		return Figure{}, nil
	}
	out[len(out)-1].X.Label.Text = "step"
	cap := "GPU telemetry (NVML) over the run, placed on steps by time: the mean over every GPU, and dashed, any node whose mean differs from the median node's by more than 3% (a throttled or power-capped node)."
	return Figure{Plots: out, Caption: cap}, nil
}

var nodeColours = []color.Color{
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff},
	color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}, color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
}

// timeToStep maps a time to a position on the step axis (interpolated
// within a step; the latest attempt wins where attempts repeat steps).
func (rep *figures) timeToStep() func(int64) (float64, bool) {
	steps := rep.data.steps
	type st struct {
		t0, t1 int64
		step   float64
	}
	bt := make([]st, len(steps))
	for i, c := range steps {
		bt[i] = st{c.StartUnixNs, max(c.EndUnixNs, c.StartUnixNs+1), float64(c.Step)}
	}
	sort.Slice(bt, func(a, b int) bool { return bt[a].t0 < bt[b].t0 })
	return func(t int64) (float64, bool) {
		i := sort.Search(len(bt), func(i int) bool { return bt[i].t0 > t })
		if i == 0 {
			return 0, false
		}
		s := bt[i-1]
		if t > s.t1 && i < len(bt) { // between steps: place it at the next
			return bt[i].step - 0.5, true
		}
		if t > s.t1 {
			return 0, false
		}
		return s.step - 0.5 + float64(t-s.t0)/float64(s.t1-s.t0), true
	}
}
