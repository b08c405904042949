package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/cli"
	"github.com/tpsprof/tpsprof/report"

	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// A 2-rank DDP job (torchrun, gloo, current PyTorch) under tpsprof launch
// that logs its loss to its own tracker, created on rank 0 the usual way:
// a W&B run in offline mode (wandb.log with W&B counting the steps), a
// TensorBoard SummaryWriter, an MLflow run on a local file store. tpsprof
// is told nothing. Each run is read back with the tracker's own code
// (testdata/read_trackers.py: wandb's record definitions, tensorboard's
// EventAccumulator, the MLflow client) and every step's tpsprof/ figures
// must equal rank 0's row of that step: tokens ÷ step time, step time and
// the shares, for every step the job ran. Under launch --tensorboard DIR
// each rank writes event files of its own, the job having no tracker.
func TestTrackersCarryFigures(t *testing.T) {
	py := modernTorchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "trackers_train.py")
	reader := filepath.Join(repoRoot(t), "cmd", "tpsprof", "e2e", "testdata", "read_trackers.py")
	const steps = 40
	cases := []struct {
		name, tracker string
		rank          int64
		logEvery      int
		// closed: the job finishes its tracker before tpsprof is closed (at
		// exit), under launch --auto (nothing of tpsprof's in the job): the
		// last rows went missing, or into a second, unclosed event file
		closed bool
	}{
		{"tensorboard", "tensorboard", 0, 1, false}, {"mlflow", "mlflow", 0, 1, false}, {"wandb", "wandb", 0, 1, false},
		// tpsprof launch --tensorboard DIR: event files of each rank's own,
		// with no tracker in the job (rank 1's read back)
		{"launch-tensorboard", "none", 1, 1, false},
		// a job that logs to W&B every 10 steps: tpsprof's rows ride on
		// those calls and keep up with the job (the newest past 64 waiting)
		{"wandb-every-10", "wandb", 0, 10, false},
		{"tensorboard-closed", "tensorboard", 0, 1, true}, {"mlflow-closed", "mlflow", 0, 1, true}, {"wandb-closed", "wandb", 0, 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kind := c.tracker
			if kind == "none" {
				kind = "tensorboard"
			}
			if out, err := exec.Command(py, "-c", "import "+kind).CombinedOutput(); err != nil {
				t.Fatalf("%s is not importable by %s (bash .ci/sid-chroot installs it; .ci/run does): %v\n%s", kind, py, err, tail(out))
			}
			out := t.TempDir()
			read := out
			var opts []func(*launch.Config)
			if c.tracker == "none" {
				opts = append(opts, func(cfg *launch.Config) { cfg.TensorBoard = out })
				read = filepath.Join(out, fmt.Sprintf("rank%d", c.rank))
			}
			n, sleep := steps, "0.01"
			if c.logEvery > 1 {
				n, sleep = 200, "0.005"
			}
			if c.tracker == "none" {
				sleep = "0.06" // several of the trackers' 1 s drains (each row went twice from the second on)
			}
			args := []string{script, "--tracker", c.tracker, "--out", out, "--steps", fmt.Sprint(n), "--sleep", sleep, "--log-every", fmt.Sprint(c.logEvery)}
			if c.closed {
				args = append(args, "--finish-first", "--auto")
			}
			dir, log := launchTorch(t, "trk-"+c.name, c.closed, torchrun(py, 2, args...), opts...)
			rows := map[int64]tps.StepRecord{}
			for _, r := range rankRows(t, dir) {
				if r.Rank == c.rank {
					rows[r.Step] = r
				}
			}
			if len(rows) != n {
				t.Fatalf("%d rows of rank %d, the job ran %d steps\n%s", len(rows), c.rank, n, log)
			}
			raw, err := exec.Command(py, reader, kind, read).Output()
			if err != nil {
				t.Fatalf("reading the %s run back: %v\n%s", kind, err, raw)
			}
			var got struct {
				Rows  [][]json.RawMessage `json:"rows"`
				Extra map[string]any      `json:"extra"`
			}
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if files, _ := filepath.Glob(filepath.Join(read, "events.out.tfevents.*")); kind == "tensorboard" && len(files) != 1 {
				t.Errorf("%d event files in %s: want the writer's one", len(files), read)
			}
			if pts, _ := got.Extra["step_points"].(float64); kind == "tensorboard" && pts != float64(n) {
				// (launch --tensorboard wrote each row twice: our writer was
				// also taken for one of the job's)
				t.Errorf("%v tpsprof/step_time_s points for %d steps: want each row once", got.Extra["step_points"], n)
			}
			seen := map[int64]bool{}
			cluster := map[int64]map[string]float64{}
			for _, row := range got.Rows {
				var step int64
				var fig map[string]float64
				if err := json.Unmarshal(row[0], &step); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(row[1], &fig); err != nil {
					t.Fatal(err)
				}
				for k, v := range fig {
					if strings.HasPrefix(k, "tpsprof/cluster/") {
						if cluster[step] == nil {
							cluster[step] = map[string]float64{}
						}
						cluster[step][k] = v
						delete(fig, k)
					}
				}
				if len(fig) == 0 {
					continue // the cluster's figures alone (a W&B row of its own)
				}
				r, ok := rows[step]
				if !ok {
					t.Errorf("tpsprof/ figures at step %d: the job ran no such step", step)
					continue
				}
				if seen[step] {
					t.Errorf("step %d logged twice", step)
				}
				seen[step] = true
				dur := float64(r.DurationNs)
				want := map[string]float64{
					"tpsprof/step_time_s":        dur / 1e9,
					"tpsprof/tokens_per_s":       float64(r.Tokens) / (dur / 1e9),
					"tpsprof/share/compute":      float64(r.ComputeNs()) / dur,
					"tpsprof/share/exposed_comm": float64(r.ExposedCommNs) / dur,
					"tpsprof/share/data_stall":   float64(r.DataWaitNs) / dur,
					"tpsprof/share/bubble":       float64(r.PPWaitNs) / dur,
					"tpsprof/share/checkpoint":   float64(r.CkptNs) / dur,
					"tpsprof/share/host_other":   float64(r.HostNs) / dur,
				}
				if r.Tokens <= 0 {
					t.Fatalf("step %d: no tokens counted (the job feeds token ids to its model)", step)
				}
				for k, w := range want {
					g, ok := fig[k]
					// TensorBoard keeps 32-bit floats
					if !ok || math.Abs(g-w) > 1e-6*math.Abs(w)+1e-7 {
						t.Errorf("step %d: %s = %v (present %v), rank %d's row gives %v", step, k, g, ok, c.rank, w)
					}
				}
				var sum float64
				for k, v := range fig {
					if strings.HasPrefix(k, "tpsprof/share/") {
						sum += v
					}
				}
				if math.Abs(sum-1) > 1e-5 {
					t.Errorf("step %d: shares add up to %v", step, sum)
				}
			}
			if c.logEvery == 1 && len(seen) != n {
				t.Errorf("%s run has tpsprof/ figures for %d of the job's %d steps", kind, len(seen), n)
			}
			if c.logEvery > 1 {
				// one row on each of the job's n/10 calls (but the first
				// ones, before W&B was found), none far behind the job
				var last int64 = -1
				for s := range seen {
					last = max(last, s)
				}
				if len(seen) < n/c.logEvery/2 || last < int64(n-64-2*c.logEvery) {
					t.Errorf("W&B every %d steps: %d rows, the last at step %d of %d", c.logEvery, len(seen), last, n)
				}
			}
			t.Logf("%s: %d steps, each equal to rank %d's row", c.name, len(seen), c.rank)
			if c.tracker != "none" && c.logEvery == 1 {
				clusterFiguresMatch(t, dir, cluster)
				reportInto(t, py, reader, kind, dir, out)
			}
		})
	}
}

// reportInto runs tpsprof report JOB_DIR --<kind> into the job's own run
// (TensorBoard: a folder beside it) and reads the run back: every
// whole-run figure equal to the report's, the report's text and plots
// there.
func reportInto(t *testing.T, py, reader, kind, jobDir, out string) {
	t.Helper()
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // the package extracted where the Python can read it
	rep, err := report.Analyze(jobDir, report.Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	want := rep.TrackerFigures()
	if want[report.TrackerPrefix+"aggregate_tps"] <= 0 || want[report.TrackerPrefix+"share/compute"] <= 0 {
		t.Fatalf("the report's figures lack the headline or the breakdown: %v", want)
	}
	read := out
	args := []string{"report", jobDir, "--plots", filepath.Join(t.TempDir(), "plots"), "--python", py}
	switch kind {
	case "tensorboard":
		read = filepath.Join(out, "report")
		args = append(args, "--tensorboard", read)
	case "mlflow", "wandb":
		id, err := os.ReadFile(filepath.Join(out, "run_id"))
		if err != nil {
			t.Fatal(err)
		}
		if kind == "mlflow" {
			t.Setenv("MLFLOW_TRACKING_URI", "file://"+out)
			t.Setenv("MLFLOW_ALLOW_FILE_STORE", "true")
			args = append(args, "--mlflow", string(id))
		} else {
			t.Setenv("WANDB_MODE", "offline")
			t.Setenv("WANDB_DIR", out)
			args = append(args, "--wandb", string(id), "--wandb-project", "tpsprof-test")
		}
	}
	var o, e bytes.Buffer
	if rc := cli.Main(args, &o, &e); rc != 0 {
		t.Fatalf("tpsprof %s: exit %d\n%s\n%s", strings.Join(args, " "), rc, o.String(), e.String())
	}
	raw, err := exec.Command(py, reader, kind, read).Output()
	if err != nil {
		t.Fatalf("reading the %s run back: %v\n%s", kind, err, raw)
	}
	var got struct {
		Rows  [][]json.RawMessage `json:"rows"`
		Extra map[string]any      `json:"extra"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	figs := map[string]float64{}
	if kind == "wandb" {
		for k, v := range got.Extra["summary"].(map[string]any) {
			// (a plot's entry is an object: its width and size come back as
			// nested keys, not figures)
			rest, ok := strings.CutPrefix(k, report.TrackerPrefix)
			if f, num := v.(float64); ok && num && (!strings.Contains(rest, "/") || strings.HasPrefix(rest, "share/") || strings.HasPrefix(rest, "split/") || strings.HasPrefix(rest, "mfu_lost/")) {
				figs[k] = f
			}
		}
	} else {
		for _, row := range got.Rows {
			var fig map[string]float64
			if err := json.Unmarshal(row[1], &fig); err != nil {
				t.Fatal(err)
			}
			for k, v := range fig {
				if strings.HasPrefix(k, report.TrackerPrefix) {
					figs[k] = v
				}
			}
		}
	}
	for k, w := range want {
		g, ok := figs[k]
		if !ok || math.Abs(g-w) > 1e-6*math.Abs(w)+1e-7 {
			t.Errorf("report into %s: %s = %v (present %v), the report's %v", kind, k, g, ok, w)
		}
	}
	if len(figs) != len(want) {
		t.Errorf("report into %s: %d figures, the report has %d", kind, len(figs), len(want))
	}
	switch kind {
	case "tensorboard":
		if got.Extra["images"].(float64) < 3 || got.Extra["texts"].(float64) < 1 {
			t.Errorf("report into TensorBoard: %v images and texts, want the plots and the report's text", got.Extra)
		}
	case "mlflow":
		if got.Extra["artifacts"].(float64) < 4 {
			t.Errorf("report into MLflow: %v artifacts under tpsprof/, want the plots and report.md", got.Extra["artifacts"])
		}
	}
	t.Logf("report into %s: %d figures equal to the report's (%s)", kind, len(figs), strings.TrimSpace(o.String()[strings.LastIndex(strings.TrimSpace(o.String()), "\n")+1:]))
}

// clusterFiguresMatch holds rank 0's tpsprof/cluster/* figures (published by
// the collector, handed on by the agent) to the job's cluster rows: the
// throughput at step S over its window equals the cluster rows' tokens
// over their step time for steps S-window+1 .. S; the shares add up to 1.
func clusterFiguresMatch(t *testing.T, dir string, cluster map[int64]map[string]float64) {
	t.Helper()
	if len(cluster) == 0 {
		t.Errorf("no tpsprof/cluster/ figures: the collector publishes them every 300 ms here")
		return
	}
	rows, err := trace.ReadAll[tps.ClusterStep](filepath.Join(dir, trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	byStep := map[int64]tps.ClusterStep{}
	for _, r := range rows {
		byStep[r.Step] = r
	}
	for step, fig := range cluster {
		k := int64(fig["tpsprof/cluster/window_steps"])
		var tokens, ns float64
		for s := step - k + 1; s <= step; s++ {
			r, ok := byStep[s]
			if !ok {
				t.Fatalf("cluster figures at step %d over %d steps: no cluster row %d", step, k, s)
			}
			tokens += float64(r.Tokens)
			ns += float64(r.StepTimeNs)
		}
		want := tokens / (ns / 1e9)
		if g := fig["tpsprof/cluster/tokens_per_s"]; k < 1 || math.Abs(g-want) > 1e-6*want {
			t.Errorf("step %d: cluster tokens/s %v over %d steps, the cluster rows give %v", step, g, k, want)
		}
		var sum float64
		for name, v := range fig {
			if strings.HasPrefix(name, "tpsprof/cluster/share/") {
				sum += v
			}
		}
		if math.Abs(sum-1) > 1e-5 {
			t.Errorf("step %d: cluster shares add up to %v", step, sum)
		}
	}
	t.Logf("%d cluster figures rows, each equal to the cluster rows' tokens ÷ time", len(cluster))
}
