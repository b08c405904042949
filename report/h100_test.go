package report

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// h100Truth is what the GPU check's Llama job (examples/gpu/check.py)
// logged of itself: a line a step (tokens, the allocator's peak, its own
// FlopCounterMode count of step 9), then the periods between the CUDA
// events it recorded where each iteration starts and its losses, read once
// the run was over.
type h100Truth struct {
	Steps []struct {
		Step          int     `json:"step"`
		Tokens        int64   `json:"tokens"`
		PeakAllocated int64   `json:"peak_allocated"`
		Flops         float64 `json:"flops"`
	}
	PeriodsNs []float64
	Losses    []float64
}

func readH100Truth(t *testing.T, path string) h100Truth {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var tr h100Truth
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Step          *int      `json:"step"`
			Tokens        int64     `json:"tokens"`
			PeakAllocated int64     `json:"peak_allocated"`
			Flops         float64   `json:"flops"`
			PeriodsNs     []float64 `json:"periods_ns"`
			Losses        []float64 `json:"losses"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		if line.Step == nil {
			tr.PeriodsNs, tr.Losses = line.PeriodsNs, line.Losses
			continue
		}
		tr.Steps = append(tr.Steps, struct {
			Step          int     `json:"step"`
			Tokens        int64   `json:"tokens"`
			PeakAllocated int64   `json:"peak_allocated"`
			Flops         float64 `json:"flops"`
		}{*line.Step, line.Tokens, line.PeakAllocated, line.Flops})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestH100LlamaAgainstItsTruth holds the report of a real GPU job to the
// job's own clocks and counts: a 0.95 B Llama (transformers 5.17, random
// initialisation, bf16, 16 query and 8 key/value heads, seq 2048, batch 4)
// under DDP over NCCL with one instrument() call, TPSPROF_FLOPS_EVERY=5,
// on an NVIDIA H100 80GB HBM3 with torch 2.11 (the GPU check, 2026-11-27;
// testdata/h100-llama/README.md). Its step times against the CUDA events'
// periods, its FLOPs against the job's own FlopCounterMode count, its peak
// memory against the allocator's reading, its last loss against the
// job's, and MFU from the analytic model against MFU from the count.
func TestH100LlamaAgainstItsTruth(t *testing.T) {
	dir := filepath.Join("testdata", "h100-llama")
	tr := readH100Truth(t, filepath.Join(dir, "truth.0.jsonl"))
	if len(tr.Steps) != 30 || len(tr.PeriodsNs) != 30 || len(tr.Losses) != 30 {
		t.Fatalf("truth: %d steps, %d periods, %d losses (want 30 each)", len(tr.Steps), len(tr.PeriodsNs), len(tr.Losses))
	}
	rep, err := analyzeChecked(dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Summary
	if s.Steps != 30 {
		t.Fatalf("steps %d, want 30", s.Steps)
	}

	// The report's median step against the periods' median over the steps
	// it keeps: not the first (warm-up) nor those tpsprof counted FLOPs
	// in (2, 7, 12, ...: slowed by the counter).
	var kept []float64
	for i, p := range tr.PeriodsNs {
		if i == 0 || (i >= 2 && (i-2)%5 == 0) {
			continue
		}
		kept = append(kept, p)
	}
	sort.Float64s(kept)
	want := kept[len(kept)/2]
	if len(kept)%2 == 0 {
		want = (kept[len(kept)/2-1] + kept[len(kept)/2]) / 2
	}
	got := s.StepTimeS.P50 * 1e9
	if math.Abs(got-want) > 0.01*want {
		t.Errorf("step time p50 %.2f ms, the CUDA events' median %.2f ms (over 1%% apart)", got/1e6, want/1e6)
	}

	// FLOPs a token: the job counted step 9 itself (PyTorch's formulas,
	// attention's key/value heads broadcast as tpsprof does)
	var own float64
	for _, st := range tr.Steps {
		if st.Flops > 0 {
			own = st.Flops / float64(st.Tokens)
		}
	}
	c := rep.CountedFLOPs
	if c == nil || own == 0 {
		t.Fatalf("counted FLOPs %+v, the job's own %g a token", c, own)
	}
	if math.Abs(c.PerToken-own) > 1e-6*own {
		t.Errorf("counted %.6g FLOPs a token, the job's own count %.6g", c.PerToken, own)
	}
	if c.AnalyticPerToken == nil || math.Abs(*c.AnalyticPerToken-own) > 0.05*own {
		t.Errorf("analytic FLOPs a token %v, counted %.4g: over 5%% apart", c.AnalyticPerToken, own)
	}

	// the allocator's peak: the job read it after each optimizer step,
	// tpsprof at each step's end, both since tpsprof's reset at the fetch
	var peak int64
	for _, st := range tr.Steps {
		peak = max(peak, st.PeakAllocated)
	}
	if rep.Memory == nil || len(rep.Memory.Fullest) == 0 {
		t.Fatal("no memory figures")
	}
	if got := rep.Memory.Fullest[0].PeakAllocatedBytes; got != peak {
		t.Errorf("peak allocated %d bytes, the allocator said %d to the job", got, peak)
	}

	// the last steady step's loss (the job's, read at the end of its run)
	if rep.Loss == nil {
		t.Fatal("no loss figure")
	}
	if w := tr.Losses[len(tr.Losses)-1]; math.Abs(rep.Loss.Last-w) > 1e-6*math.Abs(w) {
		t.Errorf("last loss %.7g, the job's %.7g", rep.Loss.Last, w)
	}

	// MFU from the analytic model against MFU from the counted FLOPs: the
	// same TPS and peak, so they differ as the two FLOP counts do
	if s.MFU == nil || c.MFU == nil {
		t.Fatalf("MFU %v, counted %v", s.MFU, c.MFU)
	}
	if ratio := *s.MFU / *c.MFU; math.Abs(ratio-*c.AnalyticPerToken/c.PerToken) > 0.005 {
		t.Errorf("MFU %.4f against counted %.4f: ratio %.4f, the FLOP counts' %.4f", *s.MFU, *c.MFU, ratio, *c.AnalyticPerToken/c.PerToken)
	}
	t.Logf("step p50 %.2f ms (events %.2f), %.6g FLOPs a token (own %.6g, analytic %.6g), peak %d, loss %.6g, MFU %.4f (counted %.4f)",
		got/1e6, want/1e6, c.PerToken, own, *c.AnalyticPerToken, peak, rep.Loss.Last, *s.MFU, *c.MFU)
	// the 29 steady rows: 23 always-on, 6 FLOP-counted apart (their cost the counter's)
	if cc := rep.CaptureCost; cc == nil || cc.Rows != 23 || cc.Profiled == nil || cc.Profiled.Rows != 6 || cc.Profiled.PerStepNs <= cc.PerStepNs {
		t.Errorf("capture cost %+v: want it from 23 rows, 6 profiled ones apart costing more", rep.CaptureCost)
	} else {
		t.Logf("capture cost %.0f µs a step, %.0f µs a FLOP-counted one", cc.PerStepNs/1e3, cc.Profiled.PerStepNs/1e3)
	}
}

// The MFU ledger of the H100 Llama run adds up to the peak, and beside it
// the GPUs' tensor-pipe and SM activity (the agent's GPM columns) over the
// same steps: the mean of the samples taken inside the steady steps'
// periods or within GPMSlackNs after one (step 1 on, the FLOP-counted
// steps out), computed here from the Parquet files by hand.
func TestH100LlamaLedger(t *testing.T) {
	dir := filepath.Join("testdata", "h100-llama")
	rep, err := analyzeChecked(dir, Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := rep.MFULedger
	if l.Ledger == nil || math.Abs(l.Ledger.Sum()-100) > 1e-6 || math.Abs(l.Ledger.MFU-100**rep.Summary.MFU) > 1e-9 {
		t.Fatalf("ledger %+v (%s), MFU %v", l.Ledger, l.Unknown, rep.Summary.MFU)
	}
	steps, err := trace.ReadAll[tps.ClusterStep](filepath.Join(dir, trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	events, err := trace.ReadAll[tps.Event](filepath.Join(dir, trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	counted := map[int64]bool{}
	for _, e := range events {
		if e.Kind == tps.EventFlopCount {
			counted[e.Step] = true
		}
	}
	samples, err := trace.ReadAll[tps.GPUSample](filepath.Join(dir, trace.GPUSamples))
	if err != nil {
		t.Fatal(err)
	}
	var tensor, sm float64
	var n int
	for _, s := range samples {
		for _, c := range steps {
			if c.Step >= 1 && !counted[c.Step] && c.StepTimeNs > 0 && s.UnixNs >= c.EndUnixNs-c.StepTimeNs && s.UnixNs <= c.EndUnixNs+GPMSlackNs && s.GPMTensorPct != nil {
				tensor += *s.GPMTensorPct / 100
				sm += *s.GPMSMUtilPct / 100
				n++
				break
			}
		}
	}
	if n == 0 || l.TensorActivity == nil || l.SMActivity == nil || int64(n) != l.GPMSamples ||
		math.Abs(*l.TensorActivity-tensor/float64(n)) > 1e-9 || math.Abs(*l.SMActivity-sm/float64(n)) > 1e-9 {
		t.Errorf("GPU activity %v tensor, %v SM over %d samples (%s); by hand %.4f, %.4f over %d", l.TensorActivity, l.SMActivity, l.GPMSamples, l.GPMUnavailable, tensor/float64(n), sm/float64(n), n)
	}
	t.Logf("%s", LedgerText(l))
	// the trackers get the same ledger and activity (tpsprof report --wandb ...)
	figs, sum := rep.TrackerFigures(), 100**rep.Summary.MFU
	for _, b := range l.Ledger.Lost {
		v, ok := figs[TrackerPrefix+"mfu_lost/"+b.Key]
		if !ok || v != b.Points {
			t.Errorf("tracker figure mfu_lost/%s = %v (present %v), the ledger's %v", b.Key, v, ok, b.Points)
		}
		sum += v
	}
	if math.Abs(sum-100) > 0.5 || figs[TrackerPrefix+"tensor_activity"] != *l.TensorActivity || figs[TrackerPrefix+"sm_activity"] != *l.SMActivity {
		t.Errorf("tracker figures: the lost points and 100 × MFU add up to %v; tensor %v, SM %v", sum, figs[TrackerPrefix+"tensor_activity"], figs[TrackerPrefix+"sm_activity"])
	}
}
