package e2e

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/report"
)

// The garbage collector's pauses (gc_ns: one row of tps.Measures and the
// Python package's _gc component) on a real job: a nanoGPT-style loop
// under launch --auto that turns automatic collection off and collects
// 20,000 objects in reference cycles (the young generation) after each backward, timing the
// collection on its own clock. Every row after the first holds the job's
// collection within max(1 ms, 10%); the report splits it out of compute
// ("compute 97.8% (Python GC 19.6%)") within 0.03 of the job's share of
// its own time over the report's steady steps, the live page over its
// window (the last 10 steps).
func TestTorchGCPauses(t *testing.T) {
	py := torchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "nanogpt_train.py")
	const iters = 12
	truthDir := t.TempDir()
	var live []collector.LiveSplit
	dir, log := launchTorchThen(t, "gc-pauses", true, []string{py, script, "--iters", fmt.Sprint(iters), "--accum", "1",
		"--gc-garbage", "20000", "--truth", truthDir}, func(col *collector.Collector) {
		for _, j := range col.Summary().Jobs {
			if j.Job == "gc-pauses" {
				live = j.BreakdownSplits
			}
		}
	})
	type gcTruth struct {
		Iter  int64 `json:"iter"`
		EndNs int64 `json:"end_ns"`
		GCNs  int64 `json:"gc_ns"`
	}
	truth := map[int64]gcTruth{}
	for _, r := range readTruthLines[gcTruth](t, truthDir) {
		truth[r.Iter] = r
	}
	rows := rankRows(t, dir)
	if len(rows) != iters || len(truth) != iters {
		t.Fatalf("%d rows and %d truth iterations, want %d each\n%s", len(rows), len(truth), iters, log)
	}
	var gcNs, spanNs, gcLast, spanLast float64
	sampled := sampledSteps(t, dir)
	for _, r := range rows {
		tr := truth[r.Step]
		if d := math.Abs(float64(r.GCNs - tr.GCNs)); d > max(1e6, 0.1*float64(tr.GCNs)) {
			t.Errorf("step %d: gc_ns %.1f ms, the job's collection %.1f ms", r.Step, float64(r.GCNs)/1e6, float64(tr.GCNs)/1e6)
		}
		if r.Step == 0 {
			continue
		}
		span := float64(tr.EndNs - truth[r.Step-1].EndNs)
		if !sampled[r.Step] { // the report's steady steps (warm-up 1)
			gcNs += float64(tr.GCNs)
			spanNs += span
		}
		if r.Step >= iters-collector.LiveWindowSteps { // the live page's window
			gcLast += float64(tr.GCNs)
			spanLast += span
		}
	}
	want := gcNs / spanNs
	var liveShare float64
	for _, s := range live {
		if s.Name == "gc_ns" && s.Part == "compute" {
			liveShare = s.Share
		}
	}
	if wantLive := gcLast / spanLast; math.Abs(liveShare-wantLive) > 0.03 {
		t.Errorf("the live page's Python GC split %.3f (%+v), the job's %.3f over its last %d steps", liveShare, live, wantLive, collector.LiveWindowSteps)
	}
	rep, err := report.Analyze(dir, report.Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	got := rep.Breakdown.Splits["gc_ns"]
	if math.Abs(got-want) > 0.03 {
		t.Errorf("the report's Python GC split %.3f, the job's collections %.3f of its time", got, want)
	}
	var text strings.Builder
	report.WriteText(&text, rep)
	line := grepLines(text.String(), "time breakdown")
	if !strings.Contains(line, "(Python GC ") {
		t.Errorf("the breakdown does not split out Python GC: %q", line)
	}
	t.Logf("Python GC %.3f of step time (live %.3f), the job's %.3f; %s", got, liveShare, want, strings.TrimSpace(line))
	// the top finding names the collector, its headroom the speed-up the
	// job's own clocks give without its collections (within 20%)
	if len(rep.Findings) == 0 || rep.Findings[0].Bucket != "gc_ns" || rep.Findings[0].Cause == "" {
		t.Errorf("findings %+v: want Python GC first, with its cause", rep.Findings)
	} else {
		speedup := 100 * (spanNs/(spanNs-gcNs) - 1)
		if h := rep.Findings[0].HeadroomPct; math.Abs(h-speedup) > 0.2*speedup {
			t.Errorf("Python GC's headroom +%.1f%%, the job's own speed-up without its collections +%.1f%%", h, speedup)
		}
		t.Logf("finding 1: %s (the job's own: +%.1f%%)", report.FindingText(rep.Findings[0]), speedup)
	}
}
