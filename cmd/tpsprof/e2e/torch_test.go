package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/kineto"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// torchPython is a Python with PyTorch: $TPSPROF_TORCH_PYTHON, Debian's
// /usr/bin/python3 (python3-torch installs for it), or python3 on PATH.
// .ci/run installs python3-torch, so its absence is a failure, not a skip.
func torchPython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("TPSPROF_TORCH_PYTHON"), "/usr/bin/python3", "python3"} {
		if p == "" {
			continue
		}
		if err := exec.Command(p, "-c", "import torch, torch.distributed as d; assert d.is_gloo_available()").Run(); err == nil {
			return p
		}
	}
	t.Fatal("no Python with PyTorch (gloo): install Debian's python3-torch (bash .ci/run does)")
	return ""
}

// torchrun is the command line of a torchrun on this machine (torch 1.13
// with Python 3.11 needs non-zero --redirects/--tee). Current torch
// (Debian sid's, built without libuv) meets at a file rendezvous: its TCP
// store rendezvous fails there. torchrun looks at its workers every
// --monitor_interval (5 s on torch 1.13): each job's end waited up to 5 s
// for it; 0.2 s, as current torch's 0.1 s.
func torchrun(py string, nproc int, extra ...string) []string {
	cmd := []string{py, "-m", "torch.distributed.run", "--nproc_per_node", strconv.Itoa(nproc), "--redirects", "2", "--tee", "2",
		"--monitor_interval", "0.2"}
	if torchMajor(py) >= 2 {
		f, err := os.CreateTemp("", "tpsprof-rdzv")
		if err == nil {
			f.Close()
			os.Remove(f.Name())
			cmd = append(cmd, "--rdzv_backend", "c10d", "--rdzv_endpoint", f.Name(), "--rdzv_conf", "store_type=file")
			return append(cmd, extra...)
		}
	}
	cmd = append(cmd, "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0")
	return append(cmd, extra...)
}

var torchVersions sync.Map

// torchMajor is the major version of py's torch (0 when unknown).
func torchMajor(py string) int {
	if v, ok := torchVersions.Load(py); ok {
		return v.(int)
	}
	out, _ := exec.Command(py, "-c", "import torch; print(torch.__version__)").Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	major, _ := strconv.Atoi(strings.SplitN(lines[len(lines)-1], ".", 2)[0])
	torchVersions.Store(py, major)
	return major
}

// launchTorch runs cmd under launch.Run with an agent of its own and
// returns the Parquet folder of the job once the collector has closed.
func launchTorch(t *testing.T, job string, auto bool, cmd []string, opts ...func(*launch.Config)) (string, string) {
	t.Helper()
	return launchTorchThen(t, job, auto, cmd, nil, opts...)
}

// launchTorchThen is launchTorch, with live called on the collector once
// the job ended and its rows are in, before the collector closes (its
// live page, /metrics).
func launchTorchThen(t *testing.T, job string, auto bool, cmd []string, live func(*collector.Collector), opts ...func(*launch.Config)) (string, string) {
	t.Helper()
	srv, col, out, sock := launchEnv(t)
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := launch.Config{Job: job, ChooseAttempt: true, Auto: auto, PythonDir: t.TempDir(),
		Agent:   agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "torch-node"},
		Command: cmd, Stdout: &log, Stderr: &log}
	for _, o := range opts {
		o(&cfg)
	}
	code, err := launch.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("launch: %v\n%s", err, log.String())
	}
	if code != 0 {
		t.Fatalf("launch: exit code %d\n%s", code, log.String())
	}
	if out := log.String(); auto && (strings.Contains(out, "tpsprof: zero-code capture not installed") ||
		strings.Contains(out, "tpsprof: zero-code capture unavailable")) {
		// (installed in part, or not at all: _auto.install, _boot/sitecustomize.py)
		t.Fatalf("zero-code mode did not install:\n%s", log.String())
	}
	if err := col.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if live != nil {
		live(col)
	}
	if err := col.Close(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(out, job), log.String()
}

func rankRows(t *testing.T, dir string) []tps.StepRecord {
	t.Helper()
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(dir, trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.Attempt != b.Attempt {
			return a.Attempt < b.Attempt
		}
		if a.Step != b.Step {
			return a.Step < b.Step
		}
		return a.Rank < b.Rank
	})
	return rows
}

// A real DDP job (2 ranks, gloo, torchrun) under tpsprof launch,
// instrumented with one call: every rank row has data wait, forward,
// backward, optimizer and communication measured; the data loader sleeps
// 150 ms per step and the data wait recovers it within 10%.
func TestTorchDDPMeasured(t *testing.T) {
	py := torchPython(t)
	const steps, sleep = 6, 0.150
	dir, log := launchTorch(t, "ddp-measured", false, torchrun(py, 2, filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"),
		"--steps", strconv.Itoa(steps), "--batch", "4", "--seq", "32", "--vocab", "256", "--dim", "64", "--data-sleep", "0.15"))
	if !strings.Contains(log, "attempt 0: 6 steps sent, 0 dropped, 0 errors") {
		t.Fatalf("the ranks did not report their steps:\n%s", log)
	}
	rows := rankRows(t, dir)
	if len(rows) != 2*steps {
		t.Fatalf("%d rank rows, want %d\n%s", len(rows), 2*steps, log)
	}
	for _, r := range rows {
		wait := float64(r.DataWaitNs) / 1e9
		switch {
		case r.Attempt != 0:
			t.Errorf("row %d/%d: attempt %d, want 0", r.Step, r.Rank, r.Attempt)
		case wait < sleep*0.9 || wait > sleep*1.1:
			t.Errorf("row %d/%d: data wait %.3fs, want %.3fs ± 10%%", r.Step, r.Rank, wait, sleep)
		case r.FwdNs <= 0 || r.BwdNs <= 0 || r.OptimNs <= 0:
			t.Errorf("row %d/%d: fwd %d bwd %d optim %d, want all measured", r.Step, r.Rank, r.FwdNs, r.BwdNs, r.OptimNs)
		case r.CommNs <= 0:
			t.Errorf("row %d/%d: comm_ns %d, want the DDP all-reduces measured", r.Step, r.Rank, r.CommNs)
		case r.ExposedCommNs > r.CommNs:
			t.Errorf("row %d/%d: exposed %d > comm %d", r.Step, r.Rank, r.ExposedCommNs, r.CommNs)
		case r.Tokens != 4*32:
			t.Errorf("row %d/%d: %d tokens, want 128 (4 sequences of 32 labels)", r.Step, r.Rank, r.Tokens)
		case r.DataWaitNs+r.FwdNs > r.DurationNs:
			t.Errorf("row %d/%d: data wait + forward %d above the step's %d ns", r.Step, r.Rank, r.DataWaitNs+r.FwdNs, r.DurationNs)
		}
	}
	// each replica read its own share (DistributedSampler): nothing to warn of
	if w := topologyWarnings(t, dir); len(w) != 0 {
		t.Errorf("topology warnings on a DDP job whose replicas read different data: %q", w)
	}
	// The report's loss is the ranks' own (loss.backward() noted it): its
	// last steady step's is the mean of that step's rank rows, over the steady
	// steps (on torch 2 the FLOP-counted third step is not one)
	rep, err := report.Analyze(dir, report.Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	var n int
	for _, r := range rows {
		if r.Step == steps-1 && r.Loss != nil {
			sum += *r.Loss
			n++
		}
	}
	if rep.Loss == nil || n != 2 || math.Abs(rep.Loss.Last-sum/2) > 1e-6*math.Abs(sum) || rep.Loss.Steps != int(rep.Summary.SteadySteps) {
		t.Errorf("report loss %+v; the last step's rank rows %d, mean %v", rep.Loss, n, sum/float64(max(n, 1)))
	}
}

// A hand-written pipeline (two stages, blocking sends and receives in
// GPipe order), on whichever PyTorch runs the capture tests (Debian's 1.13
// in the suite, current PyTorch in .ci/run's second pass): the time each
// stage blocks waiting for the other is pipeline wait (pp_wait_ns), near
// the job's own clock around its sends and receives, not communication;
// the sends' transfer is communication; tokens are each stage's batch and
// the agent warns that the two stages trained on identical batches
// (nothing in the job says they are one replica).
func TestTorchHandWrittenPipeline(t *testing.T) {
	py := torchPython(t)
	const steps = 10
	truthDir := t.TempDir()
	dir, log := launchTorch(t, "hand-pipeline", false, torchrun(py, 2, filepath.Join(repoRoot(t), "examples", "pytorch", "parallel_train.py"),
		"--mode", "pp", "--steps", strconv.Itoa(steps), "--truth", truthDir, "--stage-sleep", "0.02"))
	rows := rankRows(t, dir)
	truth := readTruth(t, truthDir)
	if len(rows) != 2*steps || len(truth) != 2*steps {
		t.Fatalf("%d rank rows and %d truth rows, want %d each\n%s", len(rows), len(truth), 2*steps, log)
	}
	var got, want [2]float64
	for _, r := range rows {
		tr := truth[[2]int64{r.Step, r.Rank}]
		switch {
		case r.Tokens != tr.Tokens:
			t.Errorf("row %d/%d: %d tokens, the stage trained on %d", r.Step, r.Rank, r.Tokens, tr.Tokens)
		case r.PPWaitNs <= 0:
			t.Errorf("row %d/%d: pp_wait_ns %d, the stage blocked %d ns on the other", r.Step, r.Rank, r.PPWaitNs, tr.PPWaitNs)
		case r.ExposedCommNs > r.CommNs:
			t.Errorf("row %d/%d: exposed %d > comm %d", r.Step, r.Rank, r.ExposedCommNs, r.CommNs)
		case r.PPWaitNs+r.ExposedCommNs > r.DurationNs:
			t.Errorf("row %d/%d: pipeline wait %d and exposed comm %d above the step's %d ns", r.Step, r.Rank, r.PPWaitNs, r.ExposedCommNs, r.DurationNs)
		}
		if r.Step > 0 {
			got[r.Rank] += float64(r.PPWaitNs)
			want[r.Rank] += float64(tr.PPWaitNs)
		}
	}
	for rank := range got {
		ratio := got[rank] / want[rank]
		t.Logf("rank %d (PyTorch %d): pipeline wait %.1f ms measured, %.1f ms by the job's own clock (ratio %.2f)", rank, torchMajor(py), got[rank]/1e6, want[rank]/1e6, ratio)
		if math.IsNaN(ratio) || ratio < 0.6 || ratio > 1.5 {
			t.Errorf("rank %d: pipeline wait %.1f ms, the job's own clock %.1f ms: ratio %.2f outside [0.6, 1.5]", rank, got[rank]/1e6, want[rank]/1e6, ratio)
		}
	}
	if w := topologyWarnings(t, dir); len(w) != 1 || !strings.Contains(w[0], "ranks 0 and 1 trained on identical batches") {
		t.Errorf("topology warnings %q, want one naming ranks 0 and 1", w)
	}
}

// topologyWarnings are the details of a job's topology_warning events.
func topologyWarnings(t *testing.T, dir string) []string {
	t.Helper()
	evs, err := trace.ReadAll[tps.Event](filepath.Join(dir, trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.Kind == tps.EventTopologyWarning {
			out = append(out, e.Detail)
		}
	}
	return out
}

// Two DDP ranks that read the same batches (no DistributedSampler: each
// counts the same tokens) draw one topology warning from the agent, naming
// both ranks, and the report says it first. TestTorchDDPMeasured is the
// same job with the sampler: no warning.
func TestIdenticalBatchesWarned(t *testing.T) {
	py := torchPython(t)
	dir, log := launchTorch(t, "same-batches", false, torchrun(py, 2, filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"),
		"--steps", "6", "--batch", "4", "--seq", "32", "--vocab", "256", "--dim", "64", "--same-batches"))
	w := topologyWarnings(t, dir)
	if len(w) != 1 || !strings.Contains(w[0], "ranks 0 and 1 trained on identical batches") {
		t.Fatalf("topology warnings %q, want one naming ranks 0 and 1\n%s", w, log)
	}
	rep, err := report.Analyze(dir, report.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	if !slices.ContainsFunc(rep.Notes, func(n string) bool { return strings.Contains(n, "identical batches") }) {
		t.Errorf("the report does not say it: notes %q", rep.Notes)
	}
	// A measure the job's torch cannot take is said, with why: torch 1.13
	// has no FlopCounterMode (the third step is the one counted on 2.x)
	var text bytes.Buffer
	report.WriteText(&text, rep)
	why := ""
	if rep.Meta != nil {
		why = rep.Meta.Unmeasured["counted_flops"]
	}
	if torchMajor(py) < 2 {
		if !strings.Contains(why, "FlopCounterMode") || !strings.Contains(text.String(), "not measured") {
			t.Errorf("torch 1.13: counted FLOPs missing without a word (meta %q)\n%s", why, text.String())
		}
	} else if why != "" || strings.Contains(text.String(), "not measured") {
		t.Errorf("current torch counts FLOPs, yet the report says %q", why)
	}
	// DDP on CPU, measured from its reducer: on torch 2 the part the
	// backward hides is sampled, and the report says it is an estimate;
	// on 1.13 it is not measured, and said so
	if rep.Meta == nil || rep.Meta.Hooks["ddp_buckets"] != "reducer" {
		t.Errorf("DDP on CPU: hooks %v, want ddp_buckets reducer", rep.Meta)
	} else if torchMajor(py) < 2 {
		if rep.Meta.Unmeasured["communication"] == "" || strings.Contains(text.String(), report.DDPHiddenEstimated) {
			t.Errorf("torch 1.13: the hidden part of DDP's communication is not measured, yet the report does not say so\n%s", text.String())
		}
	} else if !strings.Contains(text.String(), "estimated") || !strings.Contains(text.String(), "sampled backward passes") {
		t.Errorf("torch 2: the report does not say DDP's hidden communication is an estimate\n%s", text.String())
	}
	// Which hook families rank 0 installed, and how: collectives at their
	// dispatcher operators on torch 2, the torch.distributed functions
	// wrapped on 1.13; none off
	wantComm := "dispatcher"
	if torchMajor(py) < 2 {
		wantComm = "functions"
	}
	if rep.Meta == nil || rep.Meta.Hooks["communication"] != wantComm || rep.Meta.Hooks["loss"] != "on" || len(rep.Meta.HooksOff()) > 0 {
		var hooks map[string]string
		if rep.Meta != nil {
			hooks = rep.Meta.Hooks
		}
		t.Errorf("hooks %v: want communication %q, loss on, none off", hooks, wantComm)
	}
}

// torchrun --max_restarts 1: rank 0 dies at step 4 of attempt 0; the
// restarted group resumes from step 2. Both attempts are in rank_steps,
// the report counts one restart and the redone steps 2 and 3.
func TestTorchElasticRestartIsAnAttempt(t *testing.T) {
	py := torchPython(t)
	dir, log := launchTorch(t, "ddp-restart", false, torchrun(py, 2, "--max_restarts", "1",
		filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"),
		"--steps", "7", "--batch", "2", "--seq", "16", "--vocab", "128", "--dim", "32", "--crash-at", "4"))
	rows := rankRows(t, dir)
	got := map[int64][]int64{} // attempt → steps of rank 1
	for _, r := range rows {
		if r.Rank == 1 {
			got[r.Attempt] = append(got[r.Attempt], r.Step)
		}
	}
	if len(got[0]) < 4 || got[0][0] != 0 || got[0][3] != 3 {
		t.Fatalf("attempt 0 steps of rank 1: %v, want 0-3\n%s", got[0], log)
	}
	if want := []int64{2, 3, 4, 5, 6}; !equalSteps(got[1], want) {
		t.Fatalf("attempt 1 steps of rank 1: %v, want %v\n%s", got[1], want, log)
	}
	rep, err := report.Analyze(dir, report.Options{Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	if rep.Goodput.Restarts != 1 || rep.Goodput.RedoneSteps != 2 || rep.Goodput.Launches != 0 {
		t.Fatalf("report: %d restarts (%d launches), %d redone steps; want 1 restart inside the launch and 2 redone",
			rep.Goodput.Restarts, rep.Goodput.Launches, rep.Goodput.RedoneSteps)
	}
	// Each restart its own attempt with its own end: the launch's end is
	// the last attempt's (attempt 0 read "finished" with the restart's
	// whole time its shutdown badput: goodput a third of the truth).
	if len(rep.Attempts) != 2 || rep.Attempts[0].Outcome() != "restarted inside its launch" || rep.Attempts[1].Outcome() != "finished" {
		var outs []string
		for _, a := range rep.Attempts {
			outs = append(outs, a.Outcome())
		}
		t.Errorf("attempts %v: want restarted, finished", outs)
	}
	if g := rep.Goodput; g.BadputS["restart"] <= 0 {
		t.Errorf("badput %v: no restart", g.BadputS)
	}
}

// torchrun --max_restarts 1 with steps long enough for the goodput to
// mean something (rank 0 of attempt 0 dies at step 20, the restart
// resumes from step 10): the report's goodput is within 3 points of the
// kept steps' own time (each step's slowest rank, the redone steps 10-19
// of attempt 0 left out) over the launch's span (the restart's whole
// time was attempt 0's shutdown: 21.6% against about 57%).
func TestTorchElasticRestartGoodput(t *testing.T) {
	py := torchPython(t)
	dir, log := launchTorch(t, "ddp-restart-goodput", false, torchrun(py, 2, "--max_restarts", "1",
		filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"),
		"--steps", "30", "--batch", "4", "--seq", "64", "--vocab", "2048", "--dim", "128", "--crash-at", "20"))
	rows := rankRows(t, dir)
	rep, err := report.Analyze(dir, report.Options{Warmup: 0}) // (no step left out as warm-up: the truth counts them all)
	if err != nil {
		t.Fatal(err)
	}
	events, err := trace.ReadAll[tps.Event](filepath.Join(dir, trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	var from, to int64
	for _, e := range events {
		switch e.Kind {
		case tps.EventAttemptStart:
			from = e.StartUnixNs
		case tps.EventAttemptEnd:
			to = max(e.EndUnixNs, e.StartUnixNs)
		}
	}
	slowest := map[[2]int64]int64{}
	for _, r := range rows {
		k := [2]int64{r.Attempt, r.Step}
		slowest[k] = max(slowest[k], r.DurationNs)
	}
	var kept int64
	for k, d := range slowest {
		if (k[0] == 0 && k[1] < 10) || k[0] == 1 { // attempt 0's steps 10-19 were redone
			kept += d
		}
	}
	g := rep.Goodput
	truth := float64(kept) / float64(to-from)
	t.Logf("goodput %.1f%% (badput %v over %.1f s); the kept steps' time over the launch's span %.1f%%", 100*g.Goodput, g.BadputS, g.ElapsedS, 100*truth)
	if to <= from || math.Abs(g.Goodput-truth) > 0.03 {
		t.Errorf("goodput %.1f%%, the kept steps' time %.1f%% of the launch's span\n%s", 100*g.Goodput, 100*truth, log)
	}
}

func equalSteps(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// tpsprof launch --auto on a script that never imports tpsprof: the steps
// are found (optimizer.step), the DataLoader, forward, backward and the DDP
// all-reduces timed, real and padded tokens counted from the attention mask.
func TestTorchZeroCode(t *testing.T) {
	py := torchPython(t)
	dir, log := launchTorch(t, "zero-code", true, torchrun(py, 2, filepath.Join(repoRoot(t), "cmd", "tpsprof", "e2e", "testdata", "plain_ddp.py")))
	if !strings.Contains(log, "plain script done on rank 1") {
		t.Fatalf("the script did not run:\n%s", log)
	}
	rows := rankRows(t, dir)
	if len(rows) != 12 {
		t.Fatalf("%d rank rows, want 12 (6 steps × 2 ranks)\n%s", len(rows), log)
	}
	for _, r := range rows {
		if r.DataWaitNs < 30e6 || r.FwdNs <= 0 || r.BwdNs <= 0 || r.CommNs <= 0 || r.ExposedCommNs > r.CommNs {
			t.Errorf("row %d/%d not measured: %+v", r.Step, r.Rank, r)
		}
		if r.Tokens != 4*24 || r.PaddedTokens != 4*32 || r.Samples != 4 {
			t.Errorf("row %d/%d: tokens %d padded %d samples %d, want 96, 128, 4", r.Step, r.Rank, r.Tokens, r.PaddedTokens, r.Samples)
		}
	}
}

// The same job id launched twice against one collector, then once more
// against a new collector on the same folder: each launch is its own
// attempt (0, 1, 2), nothing is dropped as a duplicate, and the report
// tells the attempts apart.
func TestRerunIsANewAttempt(t *testing.T) {
	srv, col, out, sock := launchEnv(t)
	run := func(want int64) {
		t.Helper()
		var log bytes.Buffer
		code, err := launch.Run(context.Background(), launch.Config{Job: "rerun", ChooseAttempt: true, PythonDir: "-",
			Agent:   agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"},
			Command: []string{python(t), filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"), "--steps", "5", "--synthetic"},
			Stdout:  &log, Stderr: &log})
		if err != nil || code != 0 {
			t.Fatalf("launch: %d %v\n%s", code, err, log.String())
		}
		if !strings.Contains(log.String(), "tpsprof launch: attempt "+strconv.Itoa(int(want))+" (") {
			t.Fatalf("launch chose another attempt than %d:\n%s", want, log.String())
		}
		if err := col.Sync(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	run(0)
	run(1)
	if s := col.Stats(); s.Duplicates != 0 || s.Records != 10 {
		t.Fatalf("collector: %d records, %d duplicates; want 10 and 0", s.Records, s.Duplicates)
	}
	if err := col.Close(); err != nil {
		t.Fatal(err)
	}
	// A collector started afresh learns the job's attempts from its folder.
	var err error
	col, err = collectorOn(srv.URL(), out)
	if err != nil {
		t.Fatal(err)
	}
	run(2)
	col.Close()
	rows := rankRows(t, filepath.Join(out, "rerun"))
	per := map[int64]int{}
	for _, r := range rows {
		per[r.Attempt]++
	}
	if len(rows) != 15 || per[0] != 5 || per[1] != 5 || per[2] != 5 {
		t.Fatalf("rank rows by attempt: %v (%d rows), want 5 in each of 0, 1, 2", per, len(rows))
	}
	rep, err := report.Analyze(filepath.Join(out, "rerun"), report.Options{Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	if rep.Goodput.Restarts != 2 || rep.Goodput.Launches != 2 {
		t.Fatalf("report: %d restarts, %d of them launches; want the 3 launches told apart", rep.Goodput.Restarts, rep.Goodput.Launches)
	}
}

// torch.profiler over a real gloo DDP job (2 ranks): each rank's trace is
// read back by the kineto package; the gloo all-reduces are found as
// communication, the steps as profiled.
func TestKinetoOnRealProfilerTraces(t *testing.T) {
	py := torchPython(t)
	out := t.TempDir()
	argv := torchrun(py, 2, filepath.Join(repoRoot(t), "cmd", "tpsprof", "e2e", "testdata", "profile_ddp.py"), out)
	cmd := exec.Command(argv[0], argv[1:]...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("profile_ddp.py: %v\n%s", err, b)
	}
	files, _ := filepath.Glob(filepath.Join(out, "*.json*"))
	if len(files) != 2 {
		t.Fatalf("traces: %v", files)
	}
	for _, f := range files {
		r, err := kineto.AnalyzeFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Steps) != 3 {
			t.Errorf("%s: %d steps, want 3 (ProfilerStep#2-4)", f, len(r.Steps))
		}
		for _, s := range r.Steps {
			// (the gloo thread's op of the last step may fall after the
			// step's annotation: communication is checked over the trace)
			if s.ComputeUs <= 0 || s.ExposedCommUs > s.CommUs || s.DurationUs <= 0 {
				t.Errorf("%s step %d: %+v", f, s.Step, s)
			}
		}
		if r.Device != "cpu" || r.Total.CommUs <= 0 || len(r.Collectives) == 0 || r.Collectives[0].Kind != "all_reduce" || r.Collectives[0].Count < 2 {
			t.Errorf("%s: device %s, comm %.1f µs, collectives %+v", f, r.Device, r.Total.CommUs, r.Collectives)
		}
	}
}

// Live trace sampling: a real DDP job with TPSPROF_TRACE_EVERY=2 profiles
// steps 0, 2 and 4 on each rank; the agent analyses each trace off the
// training process, publishes its figures as trace_analysis events and
// deletes it; the report puts them beside the event-timed figures.
func TestTorchTraceSampling(t *testing.T) {
	py := torchPython(t)
	srv, col, out, sock := launchEnv(t)
	var log bytes.Buffer
	code, err := launch.Run(context.Background(), launch.Config{Job: "sampled", PythonDir: t.TempDir(),
		Agent: agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"},
		Command: torchrun(py, 2, filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"),
			"--steps", "6", "--batch", "2", "--seq", "16", "--vocab", "128", "--dim", "32"),
		Env: []string{"TPSPROF_TRACE_EVERY=2"}, Stdout: &log, Stderr: &log})
	if err != nil || code != 0 {
		t.Fatalf("launch: %d %v\n%s", code, err, log.String())
	}
	col.Sync(10 * time.Second)
	col.Close()
	events, err := trace.ReadAll[tps.Event](filepath.Join(out, "sampled", trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	got := map[[2]int64]tps.TraceFigures{}
	for _, e := range events {
		if e.Kind != tps.EventTraceAnalysis {
			continue
		}
		var f tps.TraceFigures
		if err := json.Unmarshal([]byte(e.Detail), &f); err != nil {
			t.Fatalf("detail %q: %v", e.Detail, err)
		}
		got[[2]int64{e.Rank, e.Step}] = f
	}
	for _, rank := range []int64{0, 1} {
		for _, step := range []int64{0, 2, 4} {
			f, ok := got[[2]int64{rank, step}]
			if !ok {
				t.Fatalf("no trace analysis for rank %d step %d: %v\n%s", rank, step, got, log.String())
			}
			if f.CommUs <= 0 || f.ExposedCommUs > f.CommUs || f.ComputeUs <= 0 || len(f.Collectives) == 0 {
				t.Errorf("rank %d step %d: %+v", rank, step, f)
			}
		}
	}
	if len(got) != 6 {
		t.Errorf("%d analysed traces, want 6 (steps 0, 2, 4 of 2 ranks)", len(got))
	}
	// The rank rows of the traced steps carry the trace's figures; the
	// others none.
	for _, r := range rankRows(t, filepath.Join(out, "sampled")) {
		traced := r.Step%2 == 0
		if traced != (r.TraceCommNs > 0) || r.TraceExposedCommNs > r.TraceCommNs || (traced && r.TraceComputeNs <= 0) {
			t.Errorf("row %d/%d: trace compute %d comm %d exposed %d", r.Step, r.Rank, r.TraceComputeNs, r.TraceCommNs, r.TraceExposedCommNs)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(agent.DefaultTraceDir(sock), "*")); len(left) != 0 {
		t.Errorf("traces left after analysis: %v", left)
	}
	rep, err := report.Analyze(filepath.Join(out, "sampled"), report.Options{Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range rep.Attempts { // (its invariant has read -1.0% unaccounted under the suite's load)
		t.Logf("attempt %d: span %.3f s, steps %.3f s, named gaps %.3f s, unaccounted %.4f s", a.Attempt, a.Time.SpanS, a.Time.StepsS, a.Time.GapsS, a.Time.UnaccountedS)
	}
	checkInvariants(t, rep)
	if rep.Traces == nil || rep.Traces.Profiled != 6 || rep.Traces.EventTimedExposedUs == nil || len(rep.Traces.Collectives) == 0 {
		t.Fatalf("report traces: %+v", rep.Traces)
	}
}

// An RL-style job (2 ranks, gloo, torchrun): each step generates 4
// rollouts of 16 tokens with the policy (greedy, token by token), then
// updates on them, instrumented with prof.rollout(). Checked end to end:
// the generation fields of every rank row, the cluster rows' generation
// throughput and share, the rollout events' sketches, and the report's
// generation section, against figures recomputed from the rows.
func TestTorchRLRollouts(t *testing.T) {
	py := torchPython(t)
	const steps, requests, prompt, newTok = 5, 4, 8, 16
	dir, log := launchTorch(t, "rl", false, torchrun(py, 2, filepath.Join(repoRoot(t), "examples", "pytorch", "rl_train.py"),
		"--steps", strconv.Itoa(steps), "--requests", strconv.Itoa(requests), "--prompt", strconv.Itoa(prompt), "--new", strconv.Itoa(newTok)))
	rows := rankRows(t, dir)
	if len(rows) != 2*steps {
		t.Fatalf("%d rank rows, want %d\n%s", len(rows), 2*steps, log)
	}
	genMax := map[int64]int64{}
	var out int64
	for _, r := range rows {
		switch {
		case r.GenRequests != requests || r.GenPromptTokens != requests*prompt || r.GenOutputTokens != requests*newTok:
			t.Errorf("row %d/%d: %d requests, %d prompt, %d output tokens", r.Step, r.Rank, r.GenRequests, r.GenPromptTokens, r.GenOutputTokens)
		case r.GenNs <= 0 || r.GenNs >= r.DurationNs:
			t.Errorf("row %d/%d: generation %d ns of a %d ns step", r.Step, r.Rank, r.GenNs, r.DurationNs)
		case r.Tokens != requests*(prompt+newTok-1) || r.Bytes != r.Tokens:
			t.Errorf("row %d/%d: %d tokens, %d bytes; want %d each", r.Step, r.Rank, r.Tokens, r.Bytes, requests*(prompt+newTok-1))
		case r.FwdNs <= 0 || r.FwdNs > r.DurationNs-r.GenNs:
			t.Errorf("row %d/%d: forward %d ns: the generation's forwards counted in the update's?", r.Step, r.Rank, r.FwdNs)
		}
		genMax[r.Step] = max(genMax[r.Step], r.GenNs)
		out += r.GenOutputTokens
	}
	cl, err := trace.ReadAll[tps.ClusterStep](filepath.Join(dir, trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cl {
		want := float64(c.GenOutputTokens) / (float64(genMax[c.Step]) / 1e9)
		if c.GenNsMax != genMax[c.Step] || c.GenOutputTokens != 2*requests*newTok || math.Abs(c.GenOutputTPS-want) > 1e-9*want ||
			c.GenFractionMean <= 0 || c.GenFractionMean >= 1 || c.BytesPerSecond <= 0 {
			t.Errorf("cluster step %d: %+v (want generation TPS %.1f)", c.Step, c, want)
		}
	}
	rep, err := report.Analyze(dir, report.Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	g := rep.Generation
	if g == nil || g.TTFT == nil || g.ITL == nil {
		t.Fatalf("report without the generation section: %+v", rep.Generation)
	}
	// steady: all but the warm-up step and a step PyTorch counted the
	// FLOPs of (torch >= 2.1: left out of the figures, as profiled ones)
	events, err := trace.ReadAll[tps.Event](filepath.Join(dir, trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	counted := map[int64]bool{}
	for _, e := range events {
		if e.Kind == tps.EventFlopCount && e.Step >= 1 {
			counted[e.Step] = true
		}
	}
	want := int64(steps - 1 - len(counted))
	steady := int64(g.Steps)
	if steady != want || g.TTFT.Count != steady*2*requests || g.ITL.Count != steady*2*requests*(newTok-1) {
		t.Errorf("generation over %d steps: %d TTFT and %d ITL samples; want %d steps, %d and %d", g.Steps, g.TTFT.Count, g.ITL.Count,
			want, want*2*requests, want*2*requests*(newTok-1))
	}
	if f := rep.CountedFLOPs; len(counted) > 0 && (f == nil || f.Samples != 0 || f.Partial != len(counted)) {
		t.Errorf("counted FLOPs %+v: a step with a generation phase gives no FLOPs a trained token", f)
	}
	// A request is its first token then 15 gaps; a rank's 4 requests run
	// one after another inside its generation time, over the same steps
	// as the latencies (a step whose FLOPs PyTorch counted is out of
	// both: its generation runs several times slower under the counter,
	// and with it in the mean the requests read 0.49 of the generation
	// time in CI)
	var genMean float64
	for _, r := range rows {
		if r.Step > 0 && !counted[r.Step] {
			genMean += float64(r.GenNs) / 1e9 / float64(2*want)
		}
	}
	perRequest := g.TTFT.Mean + float64(newTok-1)*g.ITL.Mean
	t.Logf("requests take %.4fs each, %d a step: %.2f of the ranks' generation time (%.4fs a step; %d steps counted apart)", perRequest, requests, perRequest*requests/genMean, genMean, len(counted))
	if perRequest*requests > genMean*1.02 || perRequest*requests < genMean*0.5 {
		t.Errorf("requests take %.4fs each (TTFT %.4f + 15 × ITL %.4f), ranks generate for %.4fs per step", perRequest, g.TTFT.Mean, g.ITL.Mean, genMean)
	}
	if !(g.TTFT.P50 > 0 && g.TTFT.P50 <= g.TTFT.P99 && g.ITL.P50 > 0 && g.GenShare > 0 && g.GenShare+g.TrainingShare+g.WaitingShare > 0.99) {
		t.Errorf("generation figures: %+v TTFT %+v ITL %+v", g, *g.TTFT, *g.ITL)
	}
	if rep.Text == nil || math.Abs(rep.Text.TokensPerByte-1) > 1e-9 {
		t.Errorf("text rate: %+v (one byte a token)", rep.Text)
	}
	var text bytes.Buffer
	report.WriteText(&text, rep)
	for _, want := range []string{"generation", "time to first token", "inter-token latency", "text rate"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, text.String())
		}
	}
}
