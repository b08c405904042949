package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// modernTorchPython is a Python with current PyTorch:
// $TPSPROF_MODERN_TORCH_PYTHON, else .ci/sid-python (the Debian sid chroot
// .ci/run builds). Its absence is a failure: CI builds it.
func modernTorchPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("TPSPROF_MODERN_TORCH_PYTHON")
	if py == "" {
		py = filepath.Join(repoRoot(t), ".ci", "sid-python")
	}
	if torchMajor(py) < 2 {
		out, err := exec.Command(py, "-c", "import torch; print(torch.__version__)").CombinedOutput()
		t.Fatalf("no current PyTorch at %s (%v: %s): bash .ci/sid-chroot builds it (.ci/run does)", py, err, out)
	}
	return py
}

type truthRow struct {
	Step     int64 `json:"step"`
	Rank     int64 `json:"rank"`
	CommNs   int64 `json:"comm_ns"`
	PPWaitNs int64 `json:"pp_wait_ns"`
	Tokens   int64 `json:"tokens"`
}

func readTruth(t *testing.T, dir string) map[[2]int64]truthRow {
	t.Helper()
	out := map[[2]int64]truthRow{}
	for _, r := range readTruthLines[truthRow](t, dir) {
		out[[2]int64{r.Step, r.Rank}] = r
	}
	return out
}

// readTruthLines decodes the JSON lines of a job's own truth files
// (truth.*.jsonl in dir, one per process), in file order.
func readTruthLines[T any](t *testing.T, dir string) []T {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "truth.*.jsonl"))
	var out []T
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var r T
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		fh.Close()
	}
	return out
}

// Current PyTorch (Debian sid's, 2.14 today) with the parallelisms teams
// run, two ranks over gloo under tpsprof launch. Each job profiles itself
// with torch.profiler and logs its own truth (communication as the union
// of gloo's own events; its own clock around the receives it blocks in).
// Every rank row must have communication measured (summed over the steady
// steps, in the bounds below against the job's truth) and tokens exact; the
// pipeline job's wait for the other stage is pp_wait_ns, near its own clock.
func TestModernTorchParallelisms(t *testing.T) {
	py := modernTorchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "parallel_train.py")
	// "+auto": the same job without its instrument() call, under
	// tpsprof launch --auto (zero-code mode).
	// zero-code mode for each
	for _, mode := range []string{"fsdp2", "tp", "fsdp2-tp", "pp", "pp-gpipe", "pp-1f1b", "ddp-compile", "fsdp2-compile",
		"fsdp2+auto", "tp+auto", "fsdp2-tp+auto", "pp+auto", "pp-gpipe+auto", "pp-1f1b+auto", "ddp-compile+auto", "fsdp2-compile+auto"} {
		mode, auto := strings.CutSuffix(mode, "+auto")
		name := mode
		if auto {
			name += "+auto"
		}
		pipeline := strings.HasPrefix(mode, "pp")
		world := 2
		if mode == "fsdp2-tp" {
			world = 4 // 2 replicas of 2 tensor-parallel ranks
		}
		t.Run(name, func(t *testing.T) {
			const steps = 10
			if strings.HasPrefix(mode, "fsdp2") || mode == "tp" {
				// sampling from the fourth step: steps 3, 5, 6, 7 and 9 time
				// FSDP2's synchronous all-gathers and reduce-scatters, and
				// tensor parallelism's functional all-reduces, by their
				// waits alone, past our kernels (docs/capture.md)
				t.Setenv("TPSPROF_COMM_SAMPLE_FIRST", "3")
			}
			truthDir := t.TempDir()
			args := []string{script, "--mode", mode, "--steps", strconv.Itoa(steps), "--truth", truthDir}
			if pipeline {
				args = append(args, "--stage-sleep", "0.02")
			}
			if auto {
				args = append(args, "--auto")
			}
			dir, log := launchTorch(t, "modern-"+strings.ReplaceAll(name, "+", "-"), auto, torchrun(py, world, args...))
			if !strings.Contains(log, "c10d ops hooked") || strings.Contains(log, "c10d ops hooked: 0") {
				t.Fatalf("the dispatcher capture is not in use:\n%s", log)
			}
			rows := rankRows(t, dir)
			truth := readTruth(t, truthDir)
			if len(rows) != world*steps || len(truth) != world*steps {
				t.Fatalf("%d rank rows and %d truth rows, want %d each\n%s", len(rows), len(truth), world*steps, log)
			}
			got, want := make([]float64, world), make([]float64, world)
			for _, r := range rows {
				tr, ok := truth[[2]int64{r.Step, r.Rank}]
				if !ok {
					t.Fatalf("row %d/%d has no truth", r.Step, r.Rank)
				}
				if r.Tokens != tr.Tokens {
					t.Errorf("row %d/%d: %d tokens, the job trained on %d", r.Step, r.Rank, r.Tokens, tr.Tokens)
				}
				if r.ExposedCommNs > r.CommNs {
					t.Errorf("row %d/%d: exposed %d > comm %d", r.Step, r.Rank, r.ExposedCommNs, r.CommNs)
				}
				if pipeline {
					if r.PPWaitNs <= 0 {
						t.Errorf("row %d/%d: pp_wait_ns %d, the job blocked %d ns in receives", r.Step, r.Rank, r.PPWaitNs, tr.PPWaitNs)
					}
					if r.Step > 0 {
						got[r.Rank] += float64(r.PPWaitNs)
						want[r.Rank] += float64(tr.PPWaitNs)
					}
					continue
				}
				if r.CommNs <= 0 {
					t.Errorf("row %d/%d: comm_ns %d, the job's own profile shows %d ns", r.Step, r.Rank, r.CommNs, tr.CommNs)
				}
				if r.Step > 0 {
					got[r.Rank] += float64(r.CommNs)
					want[r.Rank] += float64(tr.CommNs)
				}
			}
			// Tokens once per data-parallel replica, from the job's own
			// mesh (nothing declared): the tensor-parallel ranks of one
			// replica trained on one batch.
			cl, err := trace.ReadAll[tps.ClusterStep](filepath.Join(dir, trace.ClusterSteps))
			if err != nil {
				t.Fatal(err)
			}
			if len(cl) != steps {
				t.Fatalf("%d cluster rows, want %d", len(cl), steps)
			}
			incomplete := 0
			defer func() {
				if incomplete > 1 {
					t.Errorf("%d of %d cluster steps without every rank", incomplete, len(cl))
				}
			}()
			for _, c := range cl {
				want := truth[[2]int64{c.Step, 0}].Tokens + truth[[2]int64{c.Step, 1}].Tokens
				replicas := int64(2)
				if mode == "fsdp2-tp" {
					want = truth[[2]int64{c.Step, 0}].Tokens + truth[[2]int64{c.Step, 2}].Tokens
				}
				if mode == "tp" || pipeline {
					// one replica: tensor-parallel peers from the mesh, the
					// stages of a torch.distributed.pipelining schedule
					want, replicas = truth[[2]int64{c.Step, 0}].Tokens, 1
				}
				if mode == "pp" {
					continue // stages set up by hand: nothing in the job says so (declare the topology; warned below)
				}
				// The layout reaches the collector as run metadata, on a
				// subject of its own: steps that win that race are held
				// for it (collector.Config.MetaWait), so the first step's
				// replicas are right too.
				if c.RanksReported < c.WorldSize {
					// a rank's record later than the collector's wait for
					// it (CI once, under ten times this test's usual load:
					// communication read 4 s against 0.35 s): the row says
					// so, and counts what came (TestEndToEndMissingAndLateRanks)
					incomplete++
					t.Logf("cluster step %d: %d of %d ranks reported in time", c.Step, c.RanksReported, c.WorldSize)
					continue
				}
				if c.Tokens != want || c.Replicas != replicas {
					t.Errorf("cluster step %d: %d tokens over %d replicas, the job trained on %d over %d", c.Step, c.Tokens, c.Replicas, want, replicas)
				}
			}
			// Hand-written stages read the same batches, yet nothing in the
			// job says they are one replica: the agent says so (each stage
			// counts the batch's tokens). The others say nothing.
			warned := topologyWarnings(t, dir)
			switch {
			case mode == "pp" && (len(warned) != 1 || !strings.Contains(warned[0], "ranks 0 and 1 trained on identical batches")):
				t.Errorf("hand-written pipeline: topology warnings %q, want one naming ranks 0 and 1", warned)
			case mode != "pp" && len(warned) != 0:
				t.Errorf("topology warnings on a job whose layout is known: %q", warned)
			}
			if mode == "tp" || mode == "fsdp2-tp" {
				for _, r := range rows {
					dp, tp := int64(0), r.Rank
					if mode == "fsdp2-tp" {
						dp, tp = r.Rank/2, r.Rank%2
					}
					if r.DPRank == nil || int64(*r.DPRank) != dp || r.TPRank == nil || int64(*r.TPRank) != tp {
						t.Errorf("row %d/%d: coordinates dp %v tp %v, the mesh puts it at dp %d, tp %d", r.Step, r.Rank, r.DPRank, r.TPRank, dp, tp)
					}
				}
			}
			if strings.HasPrefix(mode, "fsdp2") || mode == "tp" {
				// the steps between samples pass FSDP2's collectives and
				// tensor parallelism's functional ones past our kernels:
				// the communication component's own time on the training
				// thread falls (FSDP2 on 2 ranks here: ~0.2 ms a step
				// against 0.9-2.7 ms on sampled steps; tensor parallel
				// 0.11-0.18 ms against 1.1-2.0 in five runs)
				var on, off []float64
				for _, r := range rows {
					switch r.Step {
					case 1, 2, 4, 8:
						on = append(on, float64(r.CaptureCommNs))
					case 3, 5, 6, 7, 9:
						off = append(off, float64(r.CaptureCommNs))
					}
				}
				mOn, _ := tps.MedianMAD(on)
				mOff, _ := tps.MedianMAD(off)
				t.Logf("the communication component's time a step: %.0f us sampled, %.0f us between samples", mOn/1e3, mOff/1e3)
				if (mode == "fsdp2" || mode == "tp") && !(mOff < mOn/2) {
					t.Errorf("between samples the communication component took %.0f us a step against %.0f on sampled steps: the collectives not past our kernels", mOff/1e3, mOn/1e3)
				}
				if mode == "tp" {
					// their hidden part carried from the sampled steps: the
					// report says so
					rep, err := report.Analyze(dir, report.Options{})
					if err != nil {
						t.Fatal(err)
					}
					var text bytes.Buffer
					report.WriteText(&text, rep)
					if rep.Meta == nil || !strings.Contains(rep.Meta.Hooks["sync_collectives"], "_c10d_functional::all_reduce") ||
						!strings.Contains(text.String(), report.FunctionalHiddenEstimated) {
						t.Errorf("tensor parallel: hooks %v; the report does not say the functional all-reduces' hidden part is carried\n%s", rep.Meta, text.String())
					}
				}
			}
			what := "communication"
			if pipeline {
				what = "pipeline wait"
			}
			// Against the job's own truth: within 20% on a machine that
			// runs nothing else (docs/capture.md has the figures: 0.94-1.18
			// on this 2-core machine). .ci/run checks that bar in a pass of
			// its own, TPSPROF_COMM_BAR=0.2; under the load of the whole
			// suite a starved completion poller, a descheduled rank, runs
			// late (seen: 0.86-1.25), so the bound there is [0.5, 2].
			lo, hi := 0.5, 2.0
			if pipeline {
				lo, hi = 0.6, 1.5
			}
			if v := os.Getenv("TPSPROF_COMM_BAR"); v != "" {
				bar, err := strconv.ParseFloat(v, 64)
				if err != nil || bar <= 0 || bar >= 1 {
					t.Fatalf("TPSPROF_COMM_BAR=%q: want a fraction such as 0.2", v)
				}
				if world > runtime.NumCPU() {
					// more ranks than cores (the 4-rank 2-D job on CI's 2):
					// each rank has half a core, and completions are seen
					// late (1.04-1.18 in seven quiet runs here)
					bar += 0.05
				}
				lo, hi = 1-bar, 1+bar
			}
			for rank := range got {
				ratio := got[rank] / want[rank]
				t.Logf("rank %d: %s %.1f ms measured, %.1f ms by the job's own truth (ratio %.2f)", rank, what, got[rank]/1e6, want[rank]/1e6, ratio)
				if math.IsNaN(ratio) || ratio < lo || ratio > hi {
					t.Errorf("rank %d: %s %.1f ms, the job's own truth %.1f ms: ratio %.2f outside [%.2f, %.2f]", rank, what, got[rank]/1e6, want[rank]/1e6, ratio, lo, hi)
				}
			}
		})
	}
}

// Instrumenting a compiled model, or compiling an instrumented one, must not
// change what torch.compile does: dynamo's own counters (graph breaks and
// their reasons, frames, unique graphs, recompilations) and the warnings
// raised are those of the same job without tpsprof, for a plain model, DDP
// and FSDP2 (inductor on CPU, one process), instrumented before or after
// compiling and in zero-code mode (which used to cost a second graph and
// PyTorch's warning about global module hooks); for the plain model also
// compiled before its optimizer exists. Every step is still measured, and
// the model's forward timed.
func TestModernTorchCompileUnchanged(t *testing.T) {
	py := modernTorchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "compile_check.py")
	type counts struct {
		GraphBreaks  int            `json:"graph_breaks"`
		BreakReasons []string       `json:"break_reasons"`
		UniqueGraphs int            `json:"unique_graphs"`
		Recompiles   int            `json:"recompiles"`
		FrameCounts  map[string]int `json:"frame_counts"`
		Warnings     []string       `json:"warnings"`
		Profiled     bool           `json:"profiled"`
		Steps        int            `json:"steps_measured"`
		Errors       int            `json:"profiler_errors"`
		Watched      int            `json:"models_watched"`
	}
	run := func(t *testing.T, wrap, how string, extra ...string) counts {
		cmd := exec.Command(py, append([]string{script, "--wrap", wrap, "--instrument", how, "--steps", "4"}, extra...)...)
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "TPSPROF_SOCKET="+filepath.Join(cmd.Dir, "none.sock"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", wrap, how, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var c counts
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &c); err != nil {
			t.Fatalf("%s %s: %v\n%s", wrap, how, err, out)
		}
		return c
	}
	for _, wrap := range []string{"plain", "ddp", "fsdp2", "plain/compile-first"} {
		t.Run(wrap, func(t *testing.T) {
			hows, extra := []string{"before", "after", "auto"}, []string(nil)
			if w, ok := strings.CutSuffix(wrap, "/compile-first"); ok {
				wrap, hows, extra = w, []string{"auto"}, []string{"--compile-first"}
			}
			base := run(t, wrap, "none", extra...)
			for _, how := range hows {
				got := run(t, wrap, how, extra...)
				t.Logf("%s, instrumented %s compile: %d graph breaks (bare %d), %d unique graphs (bare %d), frames %v (bare %v), %d steps measured",
					wrap, how, got.GraphBreaks, base.GraphBreaks, got.UniqueGraphs, base.UniqueGraphs, got.FrameCounts, base.FrameCounts, got.Steps)
				if got.GraphBreaks != base.GraphBreaks || strings.Join(got.BreakReasons, "|") != strings.Join(base.BreakReasons, "|") {
					t.Errorf("%s, instrumented %s compile: %d graph breaks %q, bare %d", wrap, how, got.GraphBreaks, got.BreakReasons, base.GraphBreaks)
				}
				if got.UniqueGraphs != base.UniqueGraphs || got.Recompiles != base.Recompiles || !reflect.DeepEqual(got.FrameCounts, base.FrameCounts) {
					t.Errorf("%s, instrumented %s compile: graphs %d recompiles %d frames %v; bare %d %d %v",
						wrap, how, got.UniqueGraphs, got.Recompiles, got.FrameCounts, base.UniqueGraphs, base.Recompiles, base.FrameCounts)
				}
				if !reflect.DeepEqual(got.Warnings, base.Warnings) {
					t.Errorf("%s, instrumented %s compile: warnings %q, bare %q", wrap, how, got.Warnings, base.Warnings)
				}
				if !got.Profiled || got.Steps != 4 || got.Errors != 0 || got.Watched < 1 {
					t.Errorf("%s, instrumented %s compile: profiled %v, %d steps measured of 4, %d errors, %d models' forward timed", wrap, how, got.Profiled, got.Steps, got.Errors, got.Watched)
				}
			}
		})
	}
}
