package e2e

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

func repoRoot(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

func python(t *testing.T) string {
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed for the hook tests: %v", err)
	}
	return p
}

// The example training loop, through the Python hook, into a real agent and
// on to Parquet.
func TestPythonHookExample(t *testing.T) {
	e := startEnv(t, 1, 5*time.Second)
	cmd := exec.Command(python(t), filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"), "--steps", "25", "--synthetic")
	cmd.Env = append(os.Environ(), "TPSPROF_SOCKET="+e.agents[0].Socket(), "TPSPROF_JOB=pyhook", "RANK=0", "WORLD_SIZE=1",
		"LOCAL_RANK=0", "TPSPROF_TOPOLOGY=dp=1,tp=1,pp=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("train.py: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "25 steps sent, 0 dropped") {
		t.Fatalf("train.py output: %s", out)
	}
	e.finish(t, 25)
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(e.out, "pyhook", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 25 {
		t.Fatalf("got %d rank rows, want 25", len(rows))
	}
	for i, r := range rows {
		if r.Step != int64(i) || r.Tokens != 8*256 || r.DataWaitNs <= 0 || r.FwdNs <= 0 || r.DPRank == nil || r.Node != "node-0" {
			t.Fatalf("row %d: %+v", i, r)
		}
	}
}

// With the agent gone, or alive but not reading, a step call returns at
// once: the hook never blocks the training loop. The bound (50 ms for the
// slowest of 3000 calls) is far above a normal call (microseconds) and far
// below what a blocking write would take (forever).
func TestPythonHookNeverBlocks(t *testing.T) {
	dir, _ := os.MkdirTemp("", "tpsprof-hook")
	t.Cleanup(func() { os.RemoveAll(dir) })
	stuck := filepath.Join(dir, "stuck.sock")
	ln, err := net.Listen("unix", stuck) // accepts, never reads
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	script := `
import json, sys, time
sys.path.insert(0, sys.argv[1])
from tpsprof import Profiler as TPSProf
res = {}
for name, path in (("missing", sys.argv[2]), ("stuck", sys.argv[3])):
    p = TPSProf(job="j", rank=0, world_size=1, socket_path=path, reconnect_interval=0.0, max_pending_bytes=1 << 16)
    worst = 0.0
    for s in range(3000):
        p.start(s)
        t = time.perf_counter()
        p.end(tokens=1, loss=1.0)
        worst = max(worst, time.perf_counter() - t)
    res[name] = {"worst_s": worst, "sent": p.sent, "dropped": p.dropped}
print(json.dumps(res))
`
	cmd := exec.Command(python(t), "-c", script, filepath.Join(repoRoot(t), "python"), filepath.Join(dir, "none.sock"), stuck)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	var res map[string]struct {
		WorstS        float64 `json:"worst_s"`
		Sent, Dropped int
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for name, r := range res {
		if r.WorstS > 0.05 {
			t.Errorf("%s agent: slowest step call took %.3fs", name, r.WorstS)
		}
		if r.Sent+r.Dropped != 3000 {
			t.Errorf("%s agent: %d sent + %d dropped, want 3000 in all", name, r.Sent, r.Dropped)
		}
	}
	if res["missing"].Dropped != 3000 {
		t.Errorf("missing agent: %d dropped, want all 3000", res["missing"].Dropped)
	}
	if res["stuck"].Dropped == 0 {
		t.Errorf("stuck agent: nothing dropped although it never reads")
	}
}

// The package's own unit tests (interval arithmetic, token counting, the
// CUDA path's deferred event reading with a fake event), under a Python
// with PyTorch.
func TestPythonPackageUnit(t *testing.T) { pythonUnit(t, torchPython(t)) }

// The same on current PyTorch (Debian sid's): the guard beside the job's
// own torch.profiler above all (a second session crashed torch 2.14).
func TestModernTorchPythonUnit(t *testing.T) { pythonUnit(t, modernTorchPython(t)) }

func pythonUnit(t *testing.T, py string) {
	cmd := exec.Command(py, "-W", "ignore", "-m", "unittest", "discover", "-s", "tests", "-v")
	cmd.Dir = filepath.Join(repoRoot(t), "python")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\nOK") {
		t.Fatalf("python unit tests: %v\n%s", err, out)
	}
}

// pip installs the package from the checkout with no package index, and
// the installed copy imports.
func TestPythonPackageInstallsOffline(t *testing.T) {
	py := torchPython(t) // Debian's Python, with pip, setuptools and wheel (.ci/run)
	target := t.TempDir()
	build := t.TempDir()
	src := filepath.Join(build, "python")
	if out, err := exec.Command("cp", "-r", filepath.Join(repoRoot(t), "python"), src).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	cmd := exec.Command(py, "-m", "pip", "install", "--no-index", "--no-build-isolation", "--target", target, src)
	cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	cmd = exec.Command(py, "-c", "import tpsprof, tpsprof.torch, sys; print(tpsprof.__file__); assert tpsprof.Profiler().attempt == 3")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PYTHONPATH="+target, "TPSPROF_ATTEMPT=1", "TORCHELASTIC_RESTART_COUNT=2")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), target) {
		t.Fatalf("installed package: %v\n%s", err, out)
	}
}

// The Python package's sketch and Go's are the same sketch: the same
// values give the same buckets, so the collector merges what ranks send
// exactly.
func TestPythonSketchMatchesGo(t *testing.T) {
	script := `import json, sys, random
sys.path.insert(0, sys.argv[1])
from tpsprof._rollout import Sketch
r = random.Random(5)
s = Sketch()
vals = [r.lognormvariate(-3, 1) for _ in range(5000)] + [0.0, 1e-12]
for v in vals:
    s.add(v)
print(json.dumps({"values": vals, "sketch": s.to_json()}))`
	out, err := exec.Command(python(t), "-c", script, filepath.Join(repoRoot(t), "python")).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Values []float64  `json:"values"`
		Sketch tps.Sketch `json:"sketch"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	var want tps.Sketch
	for _, v := range got.Values {
		want.Add(v)
	}
	if err := got.Sketch.Check(); err != nil {
		t.Fatalf("the Python sketch does not check: %v", err)
	}
	if got.Sketch.Offset != want.Offset || !slices.Equal(got.Sketch.Bins, want.Bins) || got.Sketch.Zero != want.Zero || got.Sketch.Count != want.Count {
		t.Errorf("Python sketch offset %d, %d bins, zero %d; Go's offset %d, %d bins, zero %d", got.Sketch.Offset, len(got.Sketch.Bins), got.Sketch.Zero,
			want.Offset, len(want.Bins), want.Zero)
	}
}
