package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

type periodTruth struct {
	Iter   int64 `json:"iter"`
	Tokens int64 `json:"tokens"`
	EndNs  int64 `json:"end_ns"`
	DataNs int64 `json:"data_ns"`
	// of it the thread's CPU time: building the batch is host work, the
	// rest the data wait (host_ns; on torch 2.14 the stacking took ~2% of
	// the step: 0.781 against 0.803 failed CI's sid stage)
	DataCPUNs int64 `json:"data_cpu_ns"`
	PreNs     int64 `json:"pre_ns"`
}

// sampledSteps are the steps of dir whose FLOPs were counted or that a
// trace analysed: out of the report's figures, as they run slower.
func sampledSteps(t *testing.T, dir string) map[int64]bool {
	t.Helper()
	events, err := trace.ReadAll[tps.Event](filepath.Join(dir, trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	sampled := map[int64]bool{}
	for _, e := range events {
		if e.Kind == tps.EventFlopCount || e.Kind == tps.EventTraceAnalysis {
			sampled[e.Step] = true
		}
	}
	return sampled
}

// A step is the loop's period (docs/capture.md): a loop with no DataLoader
// whose get_batch takes 30 ms at the top of each iteration, unmodified
// under launch --auto, on 2 ranks (DDP over gloo) and in one process with
// --tokens-per-step. The job logs its own clock: each iteration's end and
// its get_batch's time. Every row after the first lasts the job's own
// iteration (from the previous one's end to its end) within max(3 ms,
// 5%); the report's data stall is the get_batch's share within 0.02 and
// its headline the job's tokens over its own time within 2%; the attempt's
// time is its steps' (report.Invariants). tpsprof used to start a step at
// its first forward: the get_batch fell between steps (+35-46% TPS, data
// stall 0%).
func TestTorchStepIsTheLoop(t *testing.T) {
	py := torchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "nanogpt_train.py")
	const iters = 16
	for _, c := range []struct {
		name    string
		ranks   int
		perStep int64
	}{
		{"2 ranks", 2, 0},
		{"one process", 1, 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			truthDir := t.TempDir()
			args := []string{script, "--iters", fmt.Sprint(iters), "--accum", "1", "--batch-delay", "0.03", "--fetch-first", "--truth", truthDir}
			cmd := append([]string{py}, args...)
			if c.ranks > 1 {
				cmd = torchrun(py, c.ranks, args...)
			}
			dir, log := launchTorch(t, "loop-period", true, cmd, func(cfg *launch.Config) { cfg.TokensPerStep = c.perStep })
			truth := map[[2]int64]periodTruth{} // (iteration, rank)
			for rank := range c.ranks {
				// one rank's file at a time: its lines do not name it
				one := t.TempDir()
				if err := os.Link(filepath.Join(truthDir, fmt.Sprintf("truth.%d.jsonl", rank)), filepath.Join(one, "truth.x.jsonl")); err != nil {
					t.Fatalf("%v\n%s", err, log)
				}
				for _, r := range readTruthLines[periodTruth](t, one) {
					truth[[2]int64{r.Iter, int64(rank)}] = r
				}
			}
			rows := rankRows(t, dir)
			if len(rows) != c.ranks*iters || len(truth) != c.ranks*iters {
				t.Fatalf("%d rank rows and %d truth iterations, want %d each\n%s", len(rows), len(truth), c.ranks*iters, log)
			}
			off := 0
			for _, r := range rows {
				if r.Step == 0 {
					continue // the first step begins at its first activity (its fetch is before it)
				}
				tr, prev := truth[[2]int64{r.Step, r.Rank}], truth[[2]int64{r.Step - 1, r.Rank}]
				want := float64(tr.EndNs - prev.EndNs)
				if d := math.Abs(float64(r.DurationNs) - want); d > max(3e6, 0.05*want) {
					off++
					t.Errorf("rank %d step %d: %.1f ms, the job's iteration %.1f ms", r.Rank, r.Step, float64(r.DurationNs)/1e6, want/1e6)
				}
				// the data wait is the time before the first forward: the
				// job's from its last optimizer step's return to its forward
				// (its get_batch, zero_grad, the truth line it writes)
				// (max(6 ms, 10%): 3.8 ms over it under the race detector's load)
				if d := math.Abs(float64(r.DataWaitNs - tr.PreNs)); d > max(6e6, 0.1*float64(tr.PreNs)) {
					t.Errorf("rank %d step %d: data wait %.1f ms, the job's time before its forward %.1f ms (get_batch %.1f ms)", r.Rank, r.Step,
						float64(r.DataWaitNs)/1e6, float64(tr.PreNs)/1e6, float64(tr.DataNs)/1e6)
				}
			}
			t.Logf("%d of %d rows beyond max(3 ms, 5%%) of the job's iteration", off, len(rows)-c.ranks)

			rep, err := report.Analyze(dir, report.Options{Warmup: 1})
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, rep)
			if rep.Meta == nil || rep.Meta.Steps != tps.StepsLoop || rep.Meta.DataSource != "before_forward" {
				t.Errorf("run metadata %+v: want steps %q, data source before_forward\n%s", rep.Meta, tps.StepsLoop, log)
			}
			// the job's own figures over the report's steady steps (the FLOP
			// counter's sampled steps are out of the figures: left out here too)
			cluster, err := trace.ReadAll[tps.ClusterStep](filepath.Join(dir, trace.ClusterSteps))
			if err != nil {
				t.Fatal(err)
			}
			sampled := sampledSteps(t, dir)
			var tok, ns, data float64
			for _, cs := range cluster {
				if cs.Step == 0 || sampled[cs.Step] {
					continue
				}
				var end, prevEnd, dataNs int64
				for rank := range int64(c.ranks) {
					tr, prev := truth[[2]int64{cs.Step, rank}], truth[[2]int64{cs.Step - 1, rank}]
					end, prevEnd = max(end, tr.EndNs), max(prevEnd, prev.EndNs)
					dataNs += tr.DataNs - tr.DataCPUNs
					if c.perStep > 0 {
						tok += float64(c.perStep)
					} else {
						tok += float64(tr.Tokens)
					}
				}
				if c.perStep > 0 && c.ranks > 1 {
					tok -= float64(c.perStep) * float64(c.ranks-1) // a declared count is the replica's
				}
				ns += float64(end - prevEnd)
				data += float64(dataNs) / float64(c.ranks)
			}
			wantTPS, wantStall := tok/(ns/1e9), data/ns
			if got := rep.Summary.AggregateTPS; math.Abs(got-wantTPS) > 0.02*wantTPS {
				t.Errorf("headline %s tokens/s, the job's tokens over its own time %s", tps.SI(got), tps.SI(wantTPS))
			}
			if got := rep.Breakdown.DataStall; math.Abs(got-wantStall) > 0.02 {
				t.Errorf("data stall %.3f, the job's get_batch's wait %.3f of its time", got, wantStall)
			}
			t.Logf("headline %s tokens/s (the job's %s), data stall %.3f (the job's %.3f)", tps.SI(rep.Summary.AggregateTPS), tps.SI(wantTPS), rep.Breakdown.DataStall, wantStall)
			var text strings.Builder
			report.WriteText(&text, rep)
			if !strings.Contains(text.String(), "before its first forward") && !strings.Contains(text.String(), "to its first forward") {
				t.Errorf("the report does not say what the data wait is:\n%s", text.String())
			}
		})
	}
}
