package e2e

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
)

// frameworkTruth is a framework job's own line for one optimizer step of
// one rank: the tokens it trained on and its own clock at the step's end.
type frameworkTruth struct {
	Step   int64 `json:"step"`
	Rank   int64 `json:"rank"`
	Tokens int64 `json:"tokens"`
	End    int64 `json:"end"`
}

// checkAgainstTruth holds a job's rank rows to its own truth: a row for
// every (step, rank) the job ran and no other, each with exactly its
// tokens, and the steps' durations (past the first) within 5% of the
// job's own periods between optimizer steps.
func checkAgainstTruth(t *testing.T, rows []tps.StepRecord, truth []frameworkTruth, log string) {
	t.Helper()
	want := map[[2]int64]frameworkTruth{}
	for _, r := range truth {
		want[[2]int64{r.Step, r.Rank}] = r
	}
	if len(rows) != len(want) {
		t.Errorf("%d rank rows, the job ran %d rank-steps\n%s", len(rows), len(want), log)
	}
	var got, period float64
	exact := 0
	for _, r := range rows {
		tr, ok := want[[2]int64{r.Step, r.Rank}]
		if !ok {
			t.Errorf("a row for step %d of rank %d: the job ran no such step", r.Step, r.Rank)
			continue
		}
		if r.Tokens == tr.Tokens {
			exact++
		} else {
			t.Errorf("step %d rank %d: %d tokens, the job trained on %d", r.Step, r.Rank, r.Tokens, tr.Tokens)
		}
		if prev, ok := want[[2]int64{r.Step - 1, r.Rank}]; ok {
			got += float64(r.DurationNs)
			period += float64(tr.End - prev.End)
		}
	}
	ratio := got / period
	t.Logf("%d of %d rows' tokens exact; steps past the first: %.1f ms measured, %.1f ms of the job's own periods (ratio %.3f)", exact, len(rows), got/1e6, period/1e6, ratio)
	if period <= 0 || ratio < 0.95 || ratio > 1.05 {
		t.Errorf("measured steps %.1f ms against the job's %.1f ms (ratio %.3f)", got/1e6, period/1e6, ratio)
	}
}

// Hugging Face Accelerate on 2 ranks (torchrun, gloo, current torch),
// gradient accumulation 2: tpsprof.torch.instrument() on what
// accelerator.prepare returned (its AcceleratedOptimizer skipped
// Optimizer.__init__: instrument() raised AttributeError at set-up on
// every rank; its step() runs every micro-batch, so hooked as it is every
// micro-batch ended a step), and zero-code mode. Every optimizer step of
// every rank is one row with the tokens its two micro-batches held, its
// duration the job's own period.
func TestAccelerateJob(t *testing.T) {
	py := modernTorchPython(t)
	if out, err := exec.Command(py, "-c", "import accelerate").CombinedOutput(); err != nil {
		t.Fatalf("accelerate missing in %s (.ci/sid-chroot installs python3-accelerate): %v\n%s", py, err, out)
	}
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "accelerate_train.py")
	for _, mode := range []string{"instrument", "auto"} {
		t.Run(mode, func(t *testing.T) {
			truthDir := t.TempDir()
			dir, log := launchTorch(t, "accelerate-"+mode, mode == "auto", torchrun(py, 2, script, "--truth", truthDir, "--mode", mode))
			checkAgainstTruth(t, rankRows(t, dir), readTruthLines[frameworkTruth](t, truthDir), log)
		})
	}
}

// Lightning DDP on 2 ranks (torchrun, gloo, current torch), rank 1 sleeping
// 100 ms in each training_step: Lightning runs forward and backward inside
// optimizer.step(closure), and the healthy rank's wait in DDP's
// all-reduce was booked as its optimizer's time ("compute 99.7%, waiting
// for slower peers 0.0%, straggler ranks none", 3 of 3 runs). The rows
// hold the job's tokens and periods; the report's waiting is at least 30%
// (the job's clocks put 40% of rank 0's step in the wait), and rank 1 is
// named.
func TestLightningDDPStraggler(t *testing.T) {
	py := modernTorchPython(t)
	if out, err := exec.Command(py, "-c", "import lightning").CombinedOutput(); err != nil {
		t.Fatalf("Lightning is not importable by %s (bash .ci/sid-chroot installs it): %v\n%s", py, err, tail(out))
	}
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "lightning_ddp.py")
	truthDir := t.TempDir()
	dir, log := launchTorch(t, "lightning-ddp", false, torchrun(py, 2, script, "--truth", truthDir, "--slow-rank", "1"))
	rows := rankRows(t, dir)
	checkAgainstTruth(t, rows, readTruthLines[frameworkTruth](t, truthDir), log)
	rep, err := report.Analyze(dir, report.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	report.WriteText(&text, rep)
	t.Logf("%s", text.String())
	if w := rep.Breakdown.WaitingForPeers; w < 0.30 {
		t.Errorf("waiting for slower peers %.1f%% of step time, want at least 30%%", 100*w)
	}
	if len(rep.Stragglers) == 0 || rep.Stragglers[0].Rank != 1 {
		t.Errorf("stragglers %+v: want rank 1 first", rep.Stragglers)
	}
}
