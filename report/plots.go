package report

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

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
)

// Figure is one plot file: a single plot or plots stacked vertically.
type Figure struct {
	Name  string
	Plots []*plot.Plot
	W, H  vg.Length
}

// Figures builds every plot the report's data allows. Each is a pure
// function of the report; the caller saves them (SaveFigures).
func (rep *Report) Figures() ([]Figure, error) {
	d := &rep.data
	if len(d.steps) == 0 {
		return nil, nil
	}
	var figs []Figure
	add := func(name string, w, h vg.Length, build func() ([]*plot.Plot, error)) error {
		ps, err := build()
		if err != nil {
			return fmt.Errorf("report: plot %s: %w", name, err)
		}
		if ps != nil {
			figs = append(figs, Figure{Name: name, Plots: ps, W: w, H: h})
		}
		return nil
	}
	for _, f := range []struct {
		name  string
		w, h  vg.Length
		build func() ([]*plot.Plot, error)
	}{
		{"tps_comm", 10 * vg.Inch, 5 * vg.Inch, rep.plotTPSComm},
		{"tps_vs_comm", 7 * vg.Inch, 6 * vg.Inch, rep.plotScatter},
		{"breakdown", 10 * vg.Inch, 5 * vg.Inch, rep.plotBreakdown},
		{"rank_heatmap", 10 * vg.Inch, 7 * vg.Inch, rep.plotHeatmap},
		{"mfu", 10 * vg.Inch, 4 * vg.Inch, rep.plotMFU},
		{"gpu", 10 * vg.Inch, 8 * vg.Inch, rep.plotGPU},
	} {
		if err := add(f.name, f.w, f.h, f.build); err != nil {
			return nil, err
		}
	}
	return figs, nil
}

// SaveFigures writes every figure as NAME.png and NAME.svg (fonts
// embedded) into dir and returns the paths.
func SaveFigures(figs []Figure, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
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

func writeFigure(f Figure, ext, path string) error {
	var c vg.CanvasWriterTo
	switch ext {
	case "png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(f.W, f.H), vgimg.UseDPI(110))}
	case "svg":
		c = vgsvg.NewWith(vgsvg.UseWH(f.W, f.H), vgsvg.EmbedFonts(true))
	default:
		return fmt.Errorf("report: unknown format %q", ext)
	}
	dc := draw.New(c)
	if len(f.Plots) == 1 {
		f.Plots[0].Draw(dc)
	} else {
		rows := make([][]*plot.Plot, len(f.Plots))
		for i, p := range f.Plots {
			rows[i] = []*plot.Plot{p}
		}
		cells := plot.Align(rows, draw.Tiles{Rows: len(rows), Cols: 1, PadY: vg.Points(6)}, dc)
		for i, p := range f.Plots {
			p.Draw(cells[i][0])
		}
	}
	tmp := path + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	_, err = c.(io.WriterTo).WriteTo(out)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("report: write %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
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

// plotTPSComm: step TPS over steps, with the exposed-communication fraction
// drawn against a second scale on the right.
func (rep *Report) plotTPSComm() ([]*plot.Plot, error) {
	steps := rep.data.steps
	p := newPlot(fmt.Sprintf("%s: throughput and exposed communication", rep.Job), "step", "tokens/s (cluster)")
	tpsXY := make(plotter.XYs, len(steps))
	maxTPS, maxComm := 0.0, 0.0
	for i, c := range steps {
		tpsXY[i] = plotter.XY{X: float64(c.Step), Y: c.TPS}
		maxTPS, maxComm = max(maxTPS, c.TPS), max(maxComm, c.CommFractionMean)
	}
	commTop := math.Max(0.05, math.Ceil(maxComm*10)/10) // right scale: 0 to commTop
	scale := maxTPS * 1.05 / commTop
	commXY := make(plotter.XYs, len(steps))
	for i, c := range steps {
		commXY[i] = plotter.XY{X: float64(c.Step), Y: c.CommFractionMean * scale}
	}
	lt, err := line(tpsXY, colCompute, vg.Points(1.2))
	if err != nil {
		return nil, err
	}
	lc, err := line(commXY, colComm, vg.Points(1))
	if err != nil {
		return nil, err
	}
	lc.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
	p.Add(lt, lc)
	p.Legend.Add("step TPS (left)", lt)
	p.Legend.Add("exposed comm, % of step time (right)", lc)
	p.Y.Min, p.Y.Max = 0, maxTPS*1.3 // headroom for the legend
	// the right-hand scale, as labels just inside the right edge
	xmax := float64(steps[len(steps)-1].Step)
	var lab plotter.XYLabels
	for k := 0; k <= 4; k++ {
		f := commTop * float64(k) / 4
		lab.XYs = append(lab.XYs, plotter.XY{X: xmax, Y: f * scale})
		lab.Labels = append(lab.Labels, fmt.Sprintf("%.0f%%", 100*f))
	}
	labels, err := plotter.NewLabels(lab)
	if err != nil {
		return nil, err
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].Color = colComm
		labels.TextStyle[i].XAlign = draw.XRight
	}
	p.Add(labels)
	p.Y.Tick.Marker = siTicks{}
	return []*plot.Plot{p}, nil
}

// plotScatter: step TPS against the exposed-comm fraction, with the fit.
func (rep *Report) plotScatter() ([]*plot.Plot, error) {
	var xy plotter.XYs
	for i, c := range rep.data.steps {
		if !rep.data.warm[i] {
			xy = append(xy, plotter.XY{X: 100 * c.CommFractionMean, Y: c.TPS})
		}
	}
	if len(xy) == 0 {
		return nil, nil
	}
	f := rep.CommFit
	p := newPlot(fmt.Sprintf("step TPS vs exposed communication (fit: %s tokens/s per point, R² %.2f)", tps.SI(f.Slope/100), f.R2),
		"exposed communication (% of step time)", "step TPS (tokens/s)")
	s, err := plotter.NewScatter(xy)
	if err != nil {
		return nil, err
	}
	s.GlyphStyle.Color, s.GlyphStyle.Radius = colCompute, vg.Points(2)
	fit := plotter.NewFunction(func(x float64) float64 { return f.Intercept + f.Slope*x/100 })
	fit.Color, fit.Width = colComm, vg.Points(1.5)
	p.Add(s, fit)
	p.Legend.Add("steady steps", s)
	p.Legend.Add("least-squares fit", fit)
	p.Y.Tick.Marker = siTicks{}
	return []*plot.Plot{p}, nil
}

// plotBreakdown: stacked fractions of step time, binned to at most 200 bars.
func (rep *Report) plotBreakdown() ([]*plot.Plot, error) {
	steps := rep.data.steps
	per := max((len(steps)+199)/200, 1)
	nb := (len(steps) + per - 1) / per
	cats := []struct {
		name string
		col  color.Color
		get  func(c *tpsStep) float64
	}{
		{"compute", colCompute, func(c *tpsStep) float64 { return c.ComputeNsMean / float64(c.StepTimeNs) }},
		{"exposed comm", colComm, func(c *tpsStep) float64 { return c.CommFractionMean }},
		{"pipeline bubble", colBubble, func(c *tpsStep) float64 { return c.BubbleFractionMean }},
		{"data stall", colData, func(c *tpsStep) float64 { return c.DataStallFractionMean }},
		{"checkpoint", colCkpt, func(c *tpsStep) float64 { return c.CkptFractionMean }},
	}
	p := newPlot(fmt.Sprintf("%s: where step time goes", rep.Job), fmt.Sprintf("step bin (%d steps each)", per), "fraction of step time")
	if per == 1 {
		p.X.Label.Text = "step index"
	}
	var below *plotter.BarChart
	w := vg.Points(math.Max(1, 560/float64(nb)))
	for _, cat := range cats {
		vals := make(plotter.Values, nb)
		for b := 0; b < nb; b++ {
			var s float64
			n := 0
			for i := b * per; i < min((b+1)*per, len(steps)); i++ {
				if steps[i].StepTimeNs > 0 {
					s += cat.get(&steps[i])
					n++
				}
			}
			if n > 0 {
				vals[b] = s / float64(n)
			}
		}
		bc, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		bc.Color, bc.LineStyle.Width = cat.col, 0
		if below != nil {
			bc.StackOn(below)
		}
		below = bc
		p.Add(bc)
		p.Legend.Add(cat.name, bc)
	}
	p.Y.Min, p.Y.Max = 0, 1.4 // headroom for the legend
	return []*plot.Plot{p}, nil
}

type tpsStep = tps.ClusterStep

// clip bounds the heat grid's values to the colour range.
type clip struct {
	*heatGrid
	lo, hi float64
}

// heatXYZ adapts the heat grid to plotter.GridXYZ, in milliseconds.
type heatXYZ struct{ h clip }

func (g heatXYZ) Dims() (c, r int) { return g.h.stepBins, g.h.rankBins }
func (g heatXYZ) Z(c, r int) float64 {
	v := g.h.value(c, r)
	if math.IsNaN(v) {
		return v
	}
	return min(max(v, g.h.lo), g.h.hi) / 1e6
}
func (g heatXYZ) X(c int) float64 { return float64(c * g.h.stepsPer) }
func (g heatXYZ) Y(r int) float64 { return float64(r * g.h.ranksPer) }

// plotHeatmap: compute time per rank and step, nodes marked, in the style
// MegaScale used to find stragglers: a slow rank or node is a bright band.
func (rep *Report) plotHeatmap() ([]*plot.Plot, error) {
	h := rep.data.heat
	if h == nil || h.stepBins < 2 || h.rankBins < 2 {
		return nil, nil
	}
	// The colour range spans the 1st to 99th percentile of the cells, so a
	// warm-up step does not wash out a straggler.
	var cells []float64
	for r := 0; r < h.rankBins; r++ {
		for c := 0; c < h.stepBins; c++ {
			if v := h.value(c, r) / 1e6; !math.IsNaN(v) {
				cells = append(cells, v)
			}
		}
	}
	if len(cells) == 0 {
		return nil, nil
	}
	slices.Sort(cells)
	lo, hi := tps.Quantile(cells, 0.01), tps.Quantile(cells, 0.99)
	pal := moreland.SmoothBlueRed()
	pal.SetMin(lo)
	pal.SetMax(math.Max(hi, lo+1e-9))
	hm := plotter.NewHeatMap(heatXYZ{clip{h, lo * 1e6, hi * 1e6}}, pal.Palette(255))
	hm.NaN = color.White
	p := newPlot(fmt.Sprintf("%s: compute time per rank (ms, %.0f blue to %.0f red; 1st-99th percentile)", rep.Job, lo, hi), "step", "rank")
	p.Add(hm)
	// node boundaries
	world := float64(h.rankBins * h.ranksPer)
	prev := ""
	var ticks []plot.Tick
	for r := int64(0); r < int64(world); r++ {
		n := rep.data.nodeOf[r]
		if n == "" || n == prev {
			continue
		}
		prev = n
		y := float64(r)
		l, err := line(plotter.XYs{{X: 0, Y: y}, {X: float64(h.stepBins * h.stepsPer), Y: y}}, color.Black, vg.Points(0.5))
		if err != nil {
			return nil, err
		}
		p.Add(l)
		ticks = append(ticks, plot.Tick{Value: y, Label: n})
	}
	if len(ticks) > 0 && len(ticks) <= 64 {
		p.Y.Tick.Marker = plot.ConstantTicks(ticks)
		p.Y.Label.Text = "rank (node boundaries)"
	}
	return []*plot.Plot{p}, nil
}

// plotMFU: MFU and HFU over steps.
func (rep *Report) plotMFU() ([]*plot.Plot, error) {
	steps := rep.data.steps
	if rep.Summary.MFU == nil {
		return nil, nil
	}
	p := newPlot(fmt.Sprintf("%s: model FLOPs utilisation", rep.Job), "step", "MFU (%)")
	var xy plotter.XYs
	for _, c := range steps {
		if c.MFUUnknown == "" && tps.ImpossibleMFU(c.MFU, c.HFU) == "" && c.MFU > 0 {
			xy = append(xy, plotter.XY{X: float64(c.Step), Y: 100 * c.MFU})
		}
	}
	l, err := line(xy, colCompute, vg.Points(1.2))
	if err != nil {
		return nil, err
	}
	p.Add(l)
	p.Legend.Add("MFU", l)
	p.Y.Min = 0
	return []*plot.Plot{p}, nil
}

// plotGPU: power, SM clock and utilisation over time, when samples exist.
func (rep *Report) plotGPU() ([]*plot.Plot, error) {
	g := rep.data.gpu
	if g == nil {
		return nil, nil
	}
	var pw, ck, ut plotter.XYs
	for b := range g.n {
		t := float64(int64(b)*g.width) / 1e9
		if g.n[b] > 0 {
			pw = append(pw, plotter.XY{X: t, Y: g.power[b] / float64(g.n[b])})
			ck = append(ck, plotter.XY{X: t, Y: g.clock[b] / float64(g.n[b])})
		}
		if g.nUtil[b] > 0 {
			ut = append(ut, plotter.XY{X: t, Y: g.util[b] / float64(g.nUtil[b])})
		}
	}
	var out []*plot.Plot
	for _, s := range []struct {
		xy    plotter.XYs
		title string
		unit  string
		col   color.Color
	}{{pw, "GPU power (mean per GPU)", "W", colData}, {ck, "SM clock (mean per GPU)", "MHz", colCompute}, {ut, "GPU utilisation (mean)", "%", colBubble}} {
		if len(s.xy) < 2 {
			continue
		}
		p := newPlot(s.title, "seconds since the first step", s.unit)
		l, err := line(s.xy, s.col, vg.Points(1.2))
		if err != nil {
			return nil, err
		}
		p.Add(l)
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// siTicks labels an axis with k/M/G suffixes.
type siTicks struct{}

func (siTicks) Ticks(min, max float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = tps.SI(ts[i].Value)
		}
	}
	return ts
}
