package report

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// The capture's own cost and the ranks' device memory, from the rank rows
// and from rank_windows alike: the cost a mean over the steady rows that
// carry it (and its share of their step time), the memory each rank's
// largest peaks, the fullest rank first with its headroom. A part written
// before the columns existed reads as a run without them.
func TestCaptureCostAndMemory(t *testing.T) {
	root := t.TempDir()
	dir, err := tracetest.Write(root, "own", tracetest.Run{World: 4, Steps: 300})
	if err != nil {
		t.Fatal(err)
	}
	// an older run first: no such columns in its parts
	rep, err := analyzeChecked(dir, Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	if rep.CaptureCost != nil || rep.Memory != nil {
		t.Fatalf("a run without the measures: cost %+v, memory %+v", rep.CaptureCost, rep.Memory)
	}

	rdir := filepath.Join(dir, trace.RankSteps)
	rows, err := trace.ReadAll[tps.StepRecord](rdir)
	if err != nil || len(rows) != 4*300 {
		t.Fatalf("%v: %d rank rows", err, len(rows))
	}
	var capSum, cpuSum, durSum, commSum, commCPUSum float64
	windows := map[[2]int64]*tps.RankWindow{}
	for i := range rows {
		r := &rows[i]
		r.CaptureNs = 20_000 + 1_000*r.Rank + r.Step%7*100
		r.CaptureCPUNs = 50_000 + r.Step%3*1000
		// the communication component's parts: a third and a half
		r.CaptureCommNs, r.CaptureCommCPUNs = r.CaptureNs/3, r.CaptureCPUNs/2
		capSum += float64(r.CaptureNs)
		cpuSum += float64(r.CaptureCPUNs)
		commSum += float64(r.CaptureCommNs)
		commCPUSum += float64(r.CaptureCommCPUNs)
		durSum += float64(r.DurationNs)
		r.MemCapacityBytes = 80 << 30
		r.MemPeakAllocatedBytes = (30 + r.Rank) << 30
		r.MemPeakReservedBytes = (34 + r.Rank) << 30
		if r.Rank == 2 && r.Step == 150 {
			r.MemPeakReservedBytes = 72 << 30 // one step's spike: rank 2 is the fullest
		}
		k := [2]int64{r.Rank, tps.WindowOf(r.Step)}
		if windows[k] == nil {
			windows[k] = &tps.RankWindow{}
		}
		windows[k].Add(r)
	}
	os.RemoveAll(rdir)
	rw, err := trace.NewPartWriter[tps.StepRecord](root, "own", trace.RankSteps, trace.WriterOptions{WriterID: "own"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rw.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := rw.Close(); err != nil {
		t.Fatal(err)
	}
	ww, err := trace.NewPartWriter[tps.RankWindow](root, "own", trace.RankWindows, trace.WriterOptions{WriterID: "own"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range windows {
		w.Seal()
		if err := ww.Write([]tps.RankWindow{*w}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ww.Close(); err != nil {
		t.Fatal(err)
	}

	n := float64(len(rows))
	for _, src := range []string{RankSourceSteps, RankSourceWindows} {
		rep, err := analyzeChecked(dir, Options{Warmup: 0, RankSource: src})
		if err != nil {
			t.Fatal(err)
		}
		c := rep.CaptureCost
		if c == nil {
			t.Fatalf("%s: no capture cost", src)
		}
		near := func(got, want float64) bool { return math.Abs(got-want) <= 1e-9*want }
		if c.Rows != int64(n) || !near(c.PerStepNs, capSum/n) || !near(c.CPUPerStepNs, cpuSum/n) || c.StepFraction == nil || !near(*c.StepFraction, capSum/durSum) {
			t.Errorf("%s: cost %+v; want %v rows, %.1f ns a step, CPU %.1f ns, fraction %.6f", src, *c, n, capSum/n, cpuSum/n, capSum/durSum)
		}
		if b := c.ByComponent; len(b) != 2 || b[0].Component != "communication" || !near(b[0].PerStepNs, commSum/n) || !near(b[0].CPUPerStepNs, commCPUSum/n) ||
			!near(b[1].PerStepNs, (capSum-commSum)/n) || !near(b[1].CPUPerStepNs, (cpuSum-commCPUSum)/n) {
			t.Errorf("%s: by component %+v; want communication %.1f + %.1f ns CPU, the rest %.1f + %.1f", src, b, commSum/n, commCPUSum/n, (capSum-commSum)/n, (cpuSum-commCPUSum)/n)
		}
		m := rep.Memory
		if m == nil || m.Ranks != 4 || len(m.Fullest) == 0 {
			t.Fatalf("%s: memory %+v", src, m)
		}
		f := m.Fullest[0]
		if f.Rank != 2 || f.PeakReservedBytes != 72<<30 || f.PeakAllocatedBytes != 32<<30 || f.CapacityBytes != 80<<30 ||
			f.Headroom == nil || !near(*f.Headroom, 0.1) {
			t.Errorf("%s: fullest %+v, want rank 2: 72 GiB reserved, 32 allocated, of 80, headroom 10%%", src, f)
		}
		if len(m.Fullest) > 1 && m.Fullest[1].Rank != 3 {
			t.Errorf("%s: second fullest rank %d, want 3 (37 GiB reserved)", src, m.Fullest[1].Rank)
		}
		var text string
		for _, l := range rep.Lines() {
			text += l.Key + "  " + l.Value + "\n"
		}
		for _, want := range []string{"capture cost", "cost by component", "communication ", "device memory", "72.0 GiB reserved, 32.0 GiB allocated on rank 2 of 80.0 GiB: headroom 10.0%"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: the text report lacks %q:\n%s", src, want, text)
			}
		}
	}
}
