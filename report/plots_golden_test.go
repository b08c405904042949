package report

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/cmpimg"
)

// syntheticReport is a seeded run drawn straight into the report's plot
// data (no Parquet): ranks on nodes of 8, a straggler node from 40% of
// the run on (slower compute, lower clock and power), a communication-
// heavy stretch, checkpoints and evaluations, a restart at 70% that
// repeats a few steps, warm-up at each attempt's start.
func syntheticReport(ranks, steps int, seed uint64) (*Report, *Plots) {
	rng := rand.New(rand.NewPCG(seed, seed))
	rep := &Report{Job: fmt.Sprintf("synthetic-%d", ranks), Events: map[string]int64{}}
	pd := &Plots{}
	t0 := int64(1_760_000_000_000_000_000)
	restartAt := steps * 7 / 10
	slowNode := (ranks / 8) * 5 / 8
	slowFrom := steps * 4 / 10
	var cs []tps.ClusterStep
	now := t0
	attempt, step := int64(0), int64(0)
	for i := 0; i < steps; i++ {
		if i == restartAt {
			attempt, step = 1, step-int64(max(steps/50, 3))
			now += 60e9
		}
		warm := 1.0
		if i == 0 || i == restartAt {
			warm = 2.5
		}
		comm := 0.08 + 0.02*rng.Float64()
		if i > steps/5 && i < steps/3 {
			comm = 0.30 + 0.03*rng.Float64()
		}
		slow := 1.0
		if i >= slowFrom {
			slow = 1.2
		}
		dur := 1e9 * warm * slow / (1 - comm)
		ckpt := 0.0
		if i%max(steps/4, 15) == 14 {
			ckpt = 0.4
			dur /= 0.6
		}
		tokens := int64(ranks) * 8192
		c := tps.ClusterStep{Job: rep.Job, Attempt: attempt, Step: step, WorldSize: int64(ranks), RanksReported: int64(ranks),
			Tokens: tokens, StepTimeNs: int64(dur), StartUnixNs: now, EndUnixNs: now + int64(dur),
			TPS: float64(tokens) / (dur / 1e9), CommFractionMean: comm, BubbleFractionMean: 0.04, DataStallFractionMean: 0.01 * rng.Float64(),
			CkptFractionMean: ckpt, ComputeNsMean: dur * (1 - comm - 0.04 - ckpt)}
		c.MFU = 0.42 * (c.TPS / (float64(tokens) / 1.05))
		c.HFU = c.MFU * 1.33
		cs = append(cs, c)
		now += int64(dur) + 50e6
		step++
	}
	rep.Summary = tps.Summarize(cs, tps.WindowOptions{Warmup: tps.AutoWarmup})
	warm := tps.WarmupMask(cs, tps.WindowOptions{Warmup: tps.AutoWarmup})
	pd.steps, pd.warm = plotStepsOf(cs), warm
	var brk breakdownAcc
	for i := range cs {
		if !warm[i] && cs[i].StepTimeNs > 0 {
			brk.add(&cs[i])
		}
	}
	brk.result(rep)
	h := newHeatGrid(len(cs), ranks)
	for c := 0; c < h.stepBins; c++ {
		si := c * h.stepsPer
		for r := 0; r < h.rankBins; r++ {
			rank := r * h.ranksPer
			v := 0.6e9 * (1 + 0.04*rng.NormFloat64())
			if si == 0 || si == restartAt {
				v *= 2.5
			}
			if rank/8 == slowNode && si >= slowFrom {
				v *= 1.35
			}
			h.sum[r*h.stepBins+c], h.n[r*h.stepBins+c] = v, 1
		}
	}
	pd.heat = h
	pd.nodeOf = map[int64]string{}
	for r := 0; r < ranks; r++ {
		pd.nodeOf[int64(r)] = fmt.Sprintf("node-%d", r/8)
	}
	g := newGPUSeries(spineOf(cs).span())
	for t := t0; t < now; t += (now - t0) / 300 {
		si := 0
		for si < len(cs)-1 && cs[si+1].StartUnixNs <= t {
			si++
		}
		for _, n := range append(seq(min(ranks/8, 63)), slowNode) {
			power, clock := 620+5*rng.NormFloat64(), int64(1980)
			if n == slowNode && si >= slowFrom {
				power, clock = 540+5*rng.NormFloat64(), 1500
			}
			util := 99.0
			g.add(&tps.GPUSample{Node: fmt.Sprintf("node-%d", n), UnixNs: t, PowerW: &power, SMClockMHz: &clock, GPUUtilPct: &util})
		}
	}
	pd.gpu = g
	for _, k := range []int{steps / 2, steps * 9 / 10} {
		pd.events = append(pd.events, tps.Event{Kind: tps.EventEval, StartUnixNs: cs[k].StartUnixNs + 1})
	}
	return rep, pd
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// The figures of a seeded run at 64, 512 and 16,384 ranks and 60 and
// 10,000 steps, drawn as PNG and compared with the golden images
// (cmpimg): a change to a plot shows up here. Regenerate with
// go test ./report -run TestGoldenPlots -update, and look at them.
func TestGoldenPlots(t *testing.T) {
	for _, tc := range []struct{ ranks, steps int }{{64, 60}, {512, 10000}, {16384, 10000}} {
		rep, pd := syntheticReport(tc.ranks, tc.steps, 7)
		figs, err := pd.Figures(rep)
		if err != nil {
			t.Fatal(err)
		}
		if len(figs) != 6 {
			t.Errorf("%d ranks, %d steps: %d figures, want 6", tc.ranks, tc.steps, len(figs))
		}
		for _, f := range figs {
			// the structure: the review's points, checked on the data
			checkFigure(t, tc.ranks, tc.steps, f)
			var got bytes.Buffer
			if err := f.Render(&got, "png", 40); err != nil {
				t.Fatal(err)
			}
			name := filepath.Join("testdata", "plots", fmt.Sprintf("%s_%d_%d.png", f.Name, tc.ranks, tc.steps))
			if *update {
				os.MkdirAll(filepath.Dir(name), 0o755)
				if err := os.WriteFile(name, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(name)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if ok, err := cmpimg.Equal("png", got.Bytes(), want); err != nil || !ok {
				out := filepath.Join(t.TempDir(), filepath.Base(name))
				os.WriteFile(out, got.Bytes(), 0o644)
				t.Errorf("%s differs from its golden image (err %v); this run's is %s", name, err, out)
			}
		}
	}
}

// legendLen counts a plot's legend entries (gonum keeps them unexported).
func legendLen(p *plot.Plot) int { return reflect.ValueOf(p.Legend).FieldByName("entries").Len() }

// checkFigure asserts what the plot review asked for, on the plots
// themselves.
func checkFigure(t *testing.T, ranks, steps int, f Figure) {
	t.Helper()
	where := fmt.Sprintf("%s at %d ranks, %d steps", f.Name, ranks, steps)
	if f.Caption == "" {
		t.Errorf("%s: no caption", where)
	}
	for _, p := range f.Plots {
		// ticks: at least 4 labelled on a numeric y axis, none like 523.2k
		if _, ok := p.Y.Tick.Marker.(niceTicks); ok {
			n := 0
			for _, tk := range p.Y.Tick.Marker.Ticks(p.Y.Min, p.Y.Max) {
				if tk.Label != "" {
					n++
				}
				if len(tk.Label) > 6 {
					t.Errorf("%s: tick label %q", where, tk.Label)
				}
			}
			if n < 4 {
				t.Errorf("%s: %d labelled y ticks", where, n)
			}
		}
	}
	switch f.Name {
	case "breakdown":
		p := f.Plots[0]
		if p.Y.Label.Text != "% of step time" || p.X.Label.Text != "step" {
			t.Errorf("%s: axes %q / %q", where, p.X.Label.Text, p.Y.Label.Text)
		}
		top := p.Y.Tick.Marker.Ticks(p.Y.Min, p.Y.Max)
		if last := top[len(top)-1]; last.Label != "100%" {
			t.Errorf("%s: top tick %q", where, last.Label)
		}
	case "rank_heatmap":
		if len(f.Plots) != 2 {
			t.Errorf("%s: no colour bar", where)
		}
		ticks := f.Plots[0].Y.Tick.Marker.Ticks(0, float64(ranks))
		if len(ticks) > 40 {
			t.Errorf("%s: %d node labels", where, len(ticks))
		}
		// labels sit inside a node's band, not on its boundary
		for _, tk := range ticks {
			if frac := math.Mod(tk.Value+0.5, 8); tk.Label != "" && (frac < 1 || frac > 7) {
				t.Errorf("%s: label %s at %.1f sits on a node boundary", where, tk.Label, tk.Value)
			}
		}
	case "mfu":
		if legendLen(f.Plots[0]) < 3 {
			t.Errorf("%s: legend lacks HFU or the mean", where)
		}
	case "gpu":
		if len(f.Plots) != 2 || f.Plots[len(f.Plots)-1].X.Label.Text != "step" {
			t.Errorf("%s: %d panels, x %q (want power and clock over steps; flat utilisation left out)", where, len(f.Plots), f.Plots[len(f.Plots)-1].X.Label.Text)
		}
		if f.Plots[0].Y.Min != 0 {
			t.Errorf("%s: power axis from %v, not 0", where, f.Plots[0].Y.Min)
		}
		if legendLen(f.Plots[0]) < 2 {
			t.Errorf("%s: the throttled node is not drawn apart", where)
		}
	}
}
