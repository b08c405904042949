package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

type hfTruth struct {
	Kind   string `json:"kind"`
	Step   int64  `json:"step"`
	Tokens int64  `json:"tokens"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
}

// A Hugging Face Trainer run (transformers from Debian sid, a tiny GPT-2
// built from a config, gradient accumulation of 2, evaluation every 5
// steps, a checkpoint every 6) measured by tpsprof.hf.TpsprofCallback and
// nothing else. The job logs its own truth: each optimizer step's trained
// tokens (labels other than -100 after the shift, counted from the
// micro-batches the Trainer trained) and end, evaluations and checkpoints
// with its own clock around them. Every step is one row with exactly those
// tokens and a loss; evaluations and checkpoints are events inside the
// job's own windows, never in a step; the model's shape reaches the run
// metadata from its config (MFU needs nothing declared); a resumed run
// numbers its steps from the Trainer's own global step.
func TestHFTrainerCallback(t *testing.T) {
	py := modernTorchPython(t)
	if out, err := exec.Command(py, "-c", "import transformers").CombinedOutput(); err != nil {
		t.Fatalf("transformers missing in %s (.ci/sid-chroot installs python3-transformers): %v\n%s", py, err, out)
	}
	hf := callbackCase{job: "hf-trainer", script: filepath.Join(repoRoot(t), "examples", "pytorch", "hf_train.py"),
		resume: "checkpoint-6", modelMeta: true}
	t.Run("callback", func(t *testing.T) { callbackRun(t, py, hf, false) })
	// Under tpsprof launch --auto the callback adds its token count and
	// metadata to the profiler zero-code mode set up.
	t.Run("auto", func(t *testing.T) { callbackRun(t, py, hf, true) })
	// With no callback in the job, zero-code mode adds it to the Trainer:
	// the same tokens, events and step numbers.
	zc := hf
	zc.job, zc.args = "hf-trainer-zc", []string{"--no-callback"}
	t.Run("auto-no-callback", func(t *testing.T) { callbackRun(t, py, zc, true) })
}

// callbackCase is a framework's example job measured by its callback: 12
// optimizer steps, evaluations and checkpoints between them, a checkpoint
// at step 6 to resume from (resume: its name in the --out folder).
type callbackCase struct {
	job, script, resume string
	modelMeta           bool     // the callback sends the model's shape
	args                []string // the script's further arguments
}

// callbackRun runs c's job under tpsprof launch and holds its rows to the
// job's own truth (see TestHFTrainerCallback).
func callbackRun(t *testing.T, py string, c callbackCase, auto bool) {
	ckpt := t.TempDir()
	truthDir := t.TempDir()
	job := c.job
	if auto {
		job += "-auto"
	}
	tb := t.TempDir()
	dir, log := launchTorch(t, job, auto, append([]string{py, c.script, "--out", ckpt, "--truth", truthDir, "--tensorboard", tb}, c.args...))
	rows := rankRows(t, dir)
	rowsAtJobSteps(t, py, tb, len(rows))
	truth := readTruthLines[hfTruth](t, truthDir)
	steps := map[int64]hfTruth{}
	var windows []hfTruth
	evals := 0
	for _, r := range truth {
		switch r.Kind {
		case "step":
			steps[r.Step] = r
		case "eval":
			evals++
			windows = append(windows, r)
		case "save":
			windows = append(windows, r)
		}
	}
	if len(rows) != 12 || len(steps) != 12 {
		t.Fatalf("%d rank rows and %d steps in the job's truth, want 12 each\n%s", len(rows), len(steps), log)
	}
	var skipped []int64
	for _, r := range rows {
		if r.Skipped {
			skipped = append(skipped, r.Step)
		}
	}
	if len(skipped) > 0 {
		t.Errorf("steps %v marked skipped: every optimizer step ran", skipped)
	}
	var got, want float64
	for _, r := range rows {
		tr, ok := steps[r.Step]
		if !ok {
			t.Fatalf("row for step %d: the Trainer ran no such step", r.Step)
		}
		if r.Tokens != tr.Tokens {
			t.Errorf("step %d: %d tokens, the Trainer trained on %d", r.Step, r.Tokens, tr.Tokens)
		}
		if r.Loss == nil {
			t.Errorf("step %d: no loss", r.Step)
		}
		// forward, backward and the update measured, apart: the update is
		// not the whole step (Lightning runs forward and backward inside
		// optimizer.step)
		if r.FwdNs <= 0 || r.BwdNs <= 0 || r.OptimNs <= 0 || r.FwdNs+r.BwdNs+r.OptimNs > r.DurationNs {
			t.Errorf("step %d: fwd %d, bwd %d, optim %d ns in a %d ns step", r.Step, r.FwdNs, r.BwdNs, r.OptimNs, r.DurationNs)
		}
		// Each step is the job's own: from the previous optimizer step's
		// end (before its on_step_end: 0.3 ms, 4 ms under the race detector's load) to this one's.
		if prev, ok := steps[r.Step-1]; ok {
			if r.StartUnixNs < prev.End-25e6 || r.EndUnixNs > tr.End+2e6 {
				t.Errorf("step %d: [%d, %d] outside the job's step (%d, %d]", r.Step, r.StartUnixNs, r.EndUnixNs, prev.End, tr.End)
			}
			period := float64(tr.End - prev.End)
			for _, w := range windows {
				if w.Start >= prev.End && w.End <= tr.End {
					period -= float64(w.End - w.Start) // evaluation or a checkpoint between the steps
				}
			}
			got += float64(r.DurationNs)
			want += period
		}
	}
	ratio := got / want
	t.Logf("steps 1-11: %.1f ms measured, %.1f ms of the job's own periods without evaluation and checkpoints (ratio %.2f)", got/1e6, want/1e6, ratio)
	if ratio < 0.9 || ratio > 1.05 { // (a step is the loop's period: 0.98-1.00 measured)
		t.Errorf("measured steps %.1f ms against the job's %.1f ms (ratio %.2f)", got/1e6, want/1e6, ratio)
	}
	events, err := trace.ReadAll[tps.Event](filepath.Join(dir, trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, e := range events {
		if e.Rank < 0 {
			continue
		}
		kinds[e.Kind]++
		if e.Kind != "eval" && e.Kind != "checkpoint_save" {
			continue
		}
		// An event holds the job's own window of its kind and, as the
		// gap rule gives it the whole gap between two steps (docs/capture.md),
		// may begin where the job's previous step ended and end where the
		// next began; it never reaches into a step.
		holds := false
		for _, w := range windows {
			if (w.Kind == "eval") == (e.Kind == "eval") && e.StartUnixNs <= w.Start+2e6 && e.EndUnixNs >= w.End-2e6 {
				holds = true
			}
		}
		if !holds {
			t.Errorf("%s event [%d, %d] holds none of the job's own windows of its kind", e.Kind, e.StartUnixNs, e.EndUnixNs)
		}
		for _, r := range rows {
			if r.Rank == e.Rank && e.StartUnixNs < r.EndUnixNs-2e6 && e.EndUnixNs > r.StartUnixNs+2e6 {
				t.Errorf("%s event [%d, %d] reaches into step %d [%d, %d]", e.Kind, e.StartUnixNs, e.EndUnixNs, r.Step, r.StartUnixNs, r.EndUnixNs)
			}
		}
	}
	t.Logf("events %v; the job ran %d evaluations and %d checkpoints", kinds, evals, len(windows)-evals)
	if kinds["eval"] != evals || kinds["checkpoint_save"] != len(windows)-evals {
		t.Errorf("events %v, the job ran %d evaluations and %d checkpoints", kinds, evals, len(windows)-evals)
	}
	if c.modelMeta {
		modelMetaSent(t, dir)
	}
	// what people read first: tokens the job trained over the steps' time
	tok := map[int64]int64{}
	for n, tr := range steps {
		tok[n] = tr.Tokens
	}
	headlineHolds(t, dir, tok)

	// Resumed from its checkpoint at step 6: steps 6-11 again, numbered so.
	dir2, log2 := launchTorch(t, job+"-resume", auto, append([]string{py, c.script, "--out", ckpt, "--truth", t.TempDir(), "--resume", filepath.Join(ckpt, c.resume)}, c.args...))
	rows2 := rankRows(t, dir2)
	var nums []int64
	for _, r := range rows2 {
		nums = append(nums, r.Step)
	}
	if !equalSteps(nums, []int64{6, 7, 8, 9, 10, 11}) {
		t.Errorf("resumed run's steps %v, want 6-11\n%s", nums, log2)
	}
}

// rowsAtJobSteps: the job's framework logged its loss to TensorBoard each
// step and closed its writer at the fit's end (Lightning's logger, the
// Trainer's on_train_end): tpsprof's rows are all in the job's one event
// file, each once, at the steps the job logged its loss at (the HF
// Trainer's global_step, Lightning's).
func rowsAtJobSteps(t *testing.T, py, tb string, n int) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(tb, "events.out.tfevents.*"))
	if len(files) != 1 {
		t.Errorf("%d event files in %s: want the job's writer's one", len(files), tb)
	}
	raw, err := exec.Command(py, filepath.Join(repoRoot(t), "cmd", "tpsprof", "e2e", "testdata", "read_trackers.py"), "tensorboard", tb).Output()
	if err != nil {
		t.Fatalf("reading the TensorBoard run back: %v\n%s", err, raw)
	}
	var got struct {
		Rows  [][]json.RawMessage `json:"rows"`
		Extra struct {
			StepPoints int                `json:"step_points"`
			JobSteps   map[string][]int64 `json:"job_steps"`
		} `json:"extra"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	var ours []int64
	for _, r := range got.Rows {
		var s int64
		json.Unmarshal(r[0], &s)
		ours = append(ours, s)
	}
	jobs := got.Extra.JobSteps["train/loss"]
	slices.Sort(jobs)
	jobs = slices.Compact(jobs)
	t.Logf("TensorBoard: tpsprof/ rows at steps %v, the job's loss at %v", ours, jobs)
	if got.Extra.StepPoints != n || !equalSteps(ours, jobs) {
		t.Errorf("tpsprof/ rows at steps %v (%d step-time points for %d steps), the job's loss at %v", ours, got.Extra.StepPoints, n, jobs)
	}
}

// modelMetaSent: the run metadata has hf_train.py's model shape from its config.
func modelMetaSent(t *testing.T, dir string) {
	t.Helper()
	md, err := trace.FileMetadata(mustPart(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	var meta tps.RunMeta
	if err := json.Unmarshal([]byte(md[trace.MetaRun]), &meta); err != nil {
		t.Fatalf("run metadata %q: %v", md[trace.MetaRun], err)
	}
	if m := meta.Model; m == nil || m.Layers != 2 || m.Hidden != 32 || m.Heads != 2 || m.Vocab != 128 || meta.Seq != 32 {
		t.Errorf("run metadata %s: want the model's shape from its config (2 layers, 32 wide, 2 heads, vocab 128) at seq 32", md[trace.MetaRun])
	}
}

// mustPart is the newest cluster_steps part of a job's folder.
func mustPart(t *testing.T, dir string) string {
	t.Helper()
	files, err := trace.PartFiles(filepath.Join(dir, trace.ClusterSteps))
	if err != nil || len(files) == 0 {
		t.Fatalf("no cluster_steps parts in %s: %v", dir, err)
	}
	return files[len(files)-1]
}
