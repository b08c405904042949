package tps

import (
	"math"
	"runtime"
	"strings"
	"testing"
)

func completeRecs(step int64, world, reported int) []StepRecord {
	recs := make([]StepRecord, reported)
	for r := range recs {
		recs[r] = StepRecord{Job: "j", Step: step, Rank: int64(r), WorldSize: int64(world), StartUnixNs: 1.8e18 + step*1e9,
			EndUnixNs: 1.8e18 + step*1e9 + 5e8, DurationNs: 5e8, Tokens: 1000}
	}
	return recs
}

// An incomplete step has no MFU (the missing ranks' work is unknown), and
// the run's figures are over its complete steps, with the incomplete ones
// counted as left out: a rank that dies half-way changes no run figure.
func TestIncompleteStepsLeftOut(t *testing.T) {
	cfg := AccumulatorConfig{FLOPsPerToken: 1e9, PeakFLOPSPerGPU: 1e13}
	var steps []ClusterStep
	for s := int64(0); s < 20; s++ {
		reported := 4
		if s >= 10 {
			reported = 3 // rank 3 died
		}
		c, err := Aggregate(completeRecs(s, 4, reported), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if reported < 4 && (c.MFU != 0 || !strings.Contains(c.MFUUnknown, "incomplete step: 3 of 4")) {
			t.Fatalf("step %d: MFU %g (%q) with a rank missing", s, c.MFU, c.MFUUnknown)
		}
		if reported == 4 && (c.MFU <= 0 || c.MFUUnknown != "") {
			t.Fatalf("step %d: MFU %g (%q), complete", s, c.MFU, c.MFUUnknown)
		}
		steps = append(steps, c)
	}
	s := Summarize(steps, WindowOptions{Warmup: 0})
	// 4 ranks × 1000 tokens over 0.5 s; MFU = 4000 × 1e9 / (0.5 × 4 × 1e13)
	if s.SteadySteps != 10 || s.IncompleteSteps != 10 || s.IncompleteLeftOut != 10 || s.CompleteNote != "" {
		t.Fatalf("steady %d, incomplete %d, left out %d, note %q", s.SteadySteps, s.IncompleteSteps, s.IncompleteLeftOut, s.CompleteNote)
	}
	if s.TPS.Mean != 8000 || s.MFU == nil || math.Abs(*s.MFU-0.2) > 1e-12 || s.MFUUnknown != "" {
		t.Fatalf("TPS %g, MFU %v (%q): want 8000 and 0.2 over the complete steps", s.TPS.Mean, mfuOf(s), s.MFUUnknown)
	}
}

// A job whose declared ranks never all report (2 of 64) has no MFU and says
// so: the figures count only the ranks that reported.
func TestNeverCompleteSaysSo(t *testing.T) {
	var steps []ClusterStep
	for s := int64(0); s < 10; s++ {
		c, err := Aggregate(completeRecs(s, 64, 2), AccumulatorConfig{FLOPsPerToken: 1e9, PeakFLOPSPerGPU: 1e13})
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, c)
	}
	s := Summarize(steps, WindowOptions{Warmup: 0})
	if s.MFU != nil || !strings.Contains(s.MFUUnknown, "incomplete step: 2 of 64") {
		t.Fatalf("MFU %v (%q)", s.MFU, s.MFUUnknown)
	}
	if !strings.Contains(s.CompleteNote, "no step had all 64 ranks (at most 2 reported)") || s.IncompleteLeftOut != 0 {
		t.Fatalf("note %q, left out %d", s.CompleteNote, s.IncompleteLeftOut)
	}
}

func mfuOf(s Summary) any {
	if s.MFU == nil {
		return nil
	}
	return *s.MFU
}

// The automatic warm-up rule is bounded (a run slow for long is reported
// slow) and says what it did.
func TestAutoWarmupBoundedAndExplained(t *testing.T) {
	var steps []ClusterStep
	for i := int64(0); i < 100; i++ {
		d := int64(1e9)
		if i < 30 {
			d = 3e9 // slow for its first 30 steps
		}
		steps = append(steps, ClusterStep{Step: i, WorldSize: 8, Tokens: 8000, StepTimeNs: d, TPS: 8000 / (float64(d) / 1e9),
			StartUnixNs: 1.8e18 + i*4e9, EndUnixNs: 1.8e18 + i*4e9 + d})
	}
	s := Summarize(steps, WindowOptions{Warmup: AutoWarmup})
	if s.WarmupSteps != 10 || s.SteadySteps != 90 {
		t.Fatalf("%d warm-up steps, %d steady: want 10 (10%% of 100) and 90", s.WarmupSteps, s.SteadySteps)
	}
	if !strings.Contains(s.WarmupRule, "slower than") || !strings.Contains(s.WarmupRule, "at most 10%") {
		t.Errorf("rule %q", s.WarmupRule)
	}
}

// StepAccumulatorBytes, which collectors budget open steps with, is what
// an accumulator takes (within the allocator's size classes).
func TestStepAccumulatorBytes(t *testing.T) {
	for _, c := range []struct {
		world int64
		topo  Topology
	}{{8, Topology{}}, {8192, Topology{DP: 128, TP: 8, PP: 8}}, {131072, Topology{}}} {
		var before, after runtime.MemStats
		const n = 50
		keep := make([]*StepAccumulator, n)
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range keep {
			a, err := NewStepAccumulator("j", 0, int64(i), c.world, AccumulatorConfig{Topology: c.topo})
			if err != nil {
				t.Fatal(err)
			}
			keep[i] = a
		}
		runtime.ReadMemStats(&after)
		got := float64(after.TotalAlloc-before.TotalAlloc) / n
		want := float64(StepAccumulatorBytes(c.world, c.topo))
		if got < 0.8*want || got > 1.25*want {
			t.Errorf("world %d %v: an accumulator allocates %.0f bytes, StepAccumulatorBytes says %.0f", c.world, c.topo, got, want)
		}
		t.Logf("world %d %v: %.0f bytes allocated, %.0f budgeted", c.world, c.topo, got, want)
		runtime.KeepAlive(keep)
	}
}
