package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/report"
)

// injectedCause is one of examples/pytorch/causes.py's causes, the finding
// bucket that names it, and the rank its cause must name (-1: none).
type injectedCause struct {
	cause, bucket string
	rank          int
	gap           bool   // time between steps: the speed-up is in wall TPS
	base          string // the run without the cause ("": none)
}

var injectedCauses = []injectedCause{
	{"data", "data_stall", -1, false, ""},
	{"slow-data", "waiting_for_peers|data_stall", 1, false, ""},
	{"slow-compute", "waiting_for_peers", 1, false, ""},
	{"no-overlap", "exposed_comm", -1, false, ""},
	{"ckpt", "checkpoint", -1, true, ""},
	{"host", "host_other", -1, false, ""},
	{"eval", report.BadEval, -1, true, ""},
	{"gc", "gc_ns", -1, false, "alloc"}, // (the same objects, freed without the collector)
}

// Issue 60's check of the findings (opt-in: TPSPROF_CAUSES=1, 9 torchrun
// jobs of 2 ranks under launch --auto, about two minutes here; it is not
// in CI's time budget): each cause of examples/pytorch/causes.py injected
// into the same nanoGPT-style loop, the report's top finding must name it
// (its bucket, and the slow rank where one rank is slow), and its headroom
// must be the speed-up the job gains without it (the run with no cause,
// steady-state TPS; wall TPS for time between steps) within 20%. The table
// it logs is BENCHMARKS.md's.
func TestInjectedCauses(t *testing.T) {
	if os.Getenv("TPSPROF_CAUSES") == "" {
		t.Skip("opt-in: TPSPROF_CAUSES=1 (nine torchrun jobs; not part of CI's budget)")
	}
	py := torchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "causes.py")
	own := map[string]float64{} // cause -> the speed-up without it by the job's own clock
	run := func(cause string) *report.Report {
		truth := t.TempDir()
		dir, _ := launchTorch(t, "cause-"+cause, true, append(torchrun(py, 2, script), "--cause", cause, "--iters", "40", "--truth", truth))
		rep, err := report.Analyze(dir, report.Options{Warmup: 5})
		if err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, rep)
		// the job's own: the mean period of its steady iterations (from
		// the starts of iterations 5 and 39), and in each the slowest
		// rank's injected time
		type line struct {
			Iter     int   `json:"iter"`
			Start    int64 `json:"start_ns"`
			Injected int64 `json:"injected_ns"`
		}
		var from, to int64
		inj := map[int]int64{}
		for _, l := range readTruthLines[line](t, truth) {
			switch {
			case l.Iter == 5 && (from == 0 || l.Start < from):
				from = l.Start
			case l.Iter == 39:
				to = max(to, l.Start)
			}
			if l.Iter >= 5 && l.Iter < 39 {
				inj[l.Iter] = max(inj[l.Iter], l.Injected)
			}
		}
		var injected int64
		for _, v := range inj {
			injected += v
		}
		if n := len(inj); n > 0 && to > from {
			period := float64(to-from) / float64(n)
			own[cause] = 100 * (period/(period-float64(injected)/float64(n)) - 1)
		}
		return rep
	}
	bases := map[string]*report.Report{"": run("none")}
	named, close, ran := 0, 0, 0
	var table []string
	for _, c := range injectedCauses {
		if only := os.Getenv("TPSPROF_CAUSES"); only != "1" && !strings.Contains(","+only+",", ","+c.cause+",") {
			continue
		}
		base := bases[c.base]
		if base == nil {
			base = run(c.base)
			bases[c.base] = base
		}
		rep := run(c.cause)
		ran++
		speedup := 100 * (base.Summary.AggregateTPS/rep.Summary.AggregateTPS - 1)
		if c.gap {
			speedup = 100 * (base.Summary.WallTPS/rep.Summary.WallTPS - 1)
		}
		if len(rep.Findings) == 0 {
			t.Errorf("%s: no finding", c.cause)
			table = append(table, fmt.Sprintf("| %s | - | - | - | %.1f%% |", c.cause, speedup))
			continue
		}
		f := rep.Findings[0]
		ok := strings.Contains("|"+c.bucket+"|", "|"+f.Bucket+"|")
		if c.rank >= 0 && !strings.Contains(f.Cause+" "+f.Evidence, fmt.Sprintf("rank %d", c.rank)) {
			ok = false
		}
		if ok {
			named++
		}
		jobs := own[c.cause]
		within := math.Abs(f.HeadroomPct-jobs) <= 0.2*jobs
		if within {
			close++
		}
		for _, g := range rep.Findings[1:] {
			t.Logf("%s: then %q (%s), headroom %.1f%%", c.cause, g.What, g.Cause, g.HeadroomPct)
		}
		t.Logf("%s: events %v, goodput badput %v of %.1f s", c.cause, rep.Events, rep.Goodput.BadputS, rep.Goodput.ElapsedS)
		table = append(table, fmt.Sprintf("| %s | %s | %v | %.1f%% | %.1f%% | %v | %.1f%% |", c.cause, f.Bucket, ok, f.HeadroomPct, jobs, within, speedup))
		t.Logf("%s: top finding %q (%s; %s), headroom %.1f%%, speed-up without it %.1f%% by the job's clock, %.1f%% a run without it (TPS %.0f against %.0f; wall %.0f against %.0f; step p50 %.1f ms (base %.1f); shares %+v)", c.cause, f.What, f.Cause, f.Evidence, f.HeadroomPct, own[c.cause], speedup,
			rep.Summary.AggregateTPS, base.Summary.AggregateTPS, rep.Summary.WallTPS, base.Summary.WallTPS, 1e3*rep.Summary.StepTimeS.P50, 1e3*base.Summary.StepTimeS.P50, rep.Breakdown.Shares)
	}
	t.Logf("\n| cause | top finding | names it | headroom | speed-up without it (job's clock) | within 20%% | speed-up, a run without it |\n|---|---|---|---:|---:|---|---:|\n%s", strings.Join(table, "\n"))
	// all but one of the causes run (the 9 of 10); each one when
	// a few are asked for
	want := ran
	if ran == len(injectedCauses) {
		want = ran - 1
	}
	if named < want {
		t.Errorf("the top finding named %d of %d causes, want %d", named, ran, want)
	}
	if close < want {
		t.Errorf("headroom within 20%% of the job's own speed-up for %d of %d causes, want %d", close, ran, want)
	}
}
