package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/natsconn"
)

// BenchmarkPythonHook: the Python hook's cost per training step, sending
// to a real agent, against a bare loop in the same Python process.
//
//	go test -run '^$' -bench PythonHook -benchtime 1x ./cmd/tpsprof/e2e/
func BenchmarkPythonHook(b *testing.B) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	dir, _ := os.MkdirTemp("", "tpsprof-hookb")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, ResubscribeGrace: time.Millisecond, MaxLinesPerSec: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	py, err := exec.LookPath("python3")
	if err != nil {
		b.Fatal(err)
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "examples", "pytorch", "bench_hook.py")
	cmd := exec.Command(py, script, "--steps", "20000")
	cmd.Env = append(os.Environ(), "TPSPROF_SOCKET="+a.Socket())
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	var r struct {
		BareMean float64 `json:"bare_mean_us"`
		HookMean float64 `json:"hook_mean_us"`
		HookP99  float64 `json:"hook_p99_us"`
		Dropped  int     `json:"dropped"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		b.Fatalf("%v: %s", err, out)
	}
	b.ReportMetric(r.HookMean, "hook_mean_us/step")
	b.ReportMetric(r.HookP99, "hook_p99_us/step")
	b.ReportMetric(r.BareMean, "bare_mean_us/step")
	b.ReportMetric(float64(r.Dropped), "dropped")
}

// BenchmarkTorchStepOverhead runs examples/pytorch/bench_torch.py against a
// real agent: a real PyTorch model on CPU, bare and instrumented with
// tpsprof.torch side by side in one process (alternating blocks of steps),
// and the same on a near-empty step for the per-step cost. One run per
// call; run with -benchtime 1x:
//
//	go test -run '^$' -bench BenchmarkTorchStepOverhead -benchtime 1x ./cmd/tpsprof/e2e
func BenchmarkTorchStepOverhead(b *testing.B) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	dir, _ := os.MkdirTemp("", "tpsprof-torchb")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, MaxLinesPerSec: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	py := ""
	for _, p := range []string{os.Getenv("TPSPROF_TORCH_PYTHON"), "/usr/bin/python3", "python3"} {
		if p != "" && exec.Command(p, "-c", "import torch").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		b.Fatal("no Python with PyTorch: install Debian's python3-torch")
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "examples", "pytorch", "bench_torch.py")
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(py, script)
		cmd.Env = append(os.Environ(), "TPSPROF_SOCKET="+a.Socket(), "TPSPROF_JOB=bench-torch")
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("bench_torch.py: %v\n%s", err, out)
		}
		var res struct {
			Model, Tiny struct {
				BareMs         float64 `json:"bare_ms"`
				InstrumentedMs float64 `json:"instrumented_ms"`
				OverheadPct    float64 `json:"overhead_pct"`
				OverheadUs     float64 `json:"overhead_us"`
				SenderUs       float64 `json:"sender_us"`
				CostUs         float64 `json:"cost_us"`
				SelfUs         float64 `json:"self_us"`
				Dropped        int     `json:"dropped"`
			}
		}
		raw := strings.ReplaceAll(strings.ReplaceAll(string(out), `"model_step"`, `"Model"`), `"tiny_step"`, `"Tiny"`)
		if err := json.Unmarshal([]byte(raw), &res); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		if res.Model.Dropped+res.Tiny.Dropped != 0 {
			b.Fatalf("records dropped: %s", out)
		}
		b.ReportMetric(res.Model.BareMs, "bare_step_ms")
		b.ReportMetric(res.Model.OverheadPct, "overhead_%")
		b.ReportMetric(res.Tiny.OverheadUs, "training_us/step")
		b.ReportMetric(res.Tiny.SenderUs, "sender_cpu_us/step")
		b.ReportMetric(res.Tiny.CostUs, "cost_us/step")
		b.ReportMetric(res.Tiny.SelfUs, "self_measured_us/step")
	}
}

// trackersBench times what the trackers add to a sent step record on the
// sender thread of a process that logs to no tracker (the package looks
// them up by name, never imports them): Profiler.send_step with the
// trackers against the same calls with them off, in alternating blocks of
// one process. It prints the two costs, and the tracker modules and
// threads the process ended with (none expected).
const trackersBench = `
import json, sys, threading, time
import tpsprof
from tpsprof import _trackers
p = tpsprof.Profiler(job="b", rank=0, world_size=1, socket_path="/nonexistent/x.sock")
t = _trackers.Trackers(0)
def block(tr, n=4000):
    p.trackers = tr
    t0 = time.perf_counter_ns()
    for s in range(n):
        p.send_step(s, 1, 20_000_000, 4096, {"fwd": 5_000_000, "bwd": 9_000_000, "exposed_comm": 1_000_000})
    return (time.perf_counter_ns() - t0) / n
off, on = [], []
for _ in range(10):
    off.append(block(None)); on.append(block(t))
off.sort(); on.sort()
mods = [m for m in ("wandb", "mlflow", "tensorboard", "torch.utils.tensorboard", "tensorboardX") if m in sys.modules]
threads = [x.name for x in threading.enumerate() if x.name.startswith("tpsprof-trackers")]
print(json.dumps({"off_ns": off[len(off)//2], "on_ns": on[len(on)//2], "modules": mods, "threads": threads}))
`

// BenchmarkTrackersNoTracker: the trackers' cost per step record where
// the job logs to no tracker, as a ratio against the record's own cost
// (the same send_step with trackers off), on the sender thread (the
// training thread does not run it). Fails if a tracker module was
// imported or a thread started.
func BenchmarkTrackersNoTracker(b *testing.B) {
	_, file, _, _ := runtime.Caller(0)
	pkg := filepath.Join(filepath.Dir(file), "..", "..", "..", "python")
	for i := 0; i < b.N; i++ {
		cmd := exec.Command("python3", "-c", trackersBench)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+pkg)
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		var res struct {
			OffNs, OnNs float64
			Modules     []string
			Threads     []string
		}
		if err := json.Unmarshal([]byte(strings.NewReplacer(`"off_ns"`, `"OffNs"`, `"on_ns"`, `"OnNs"`).Replace(string(out))), &res); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		if len(res.Modules)+len(res.Threads) > 0 {
			b.Fatalf("no tracker in the process, yet modules %v and threads %v", res.Modules, res.Threads)
		}
		b.ReportMetric(res.OffNs/1e3, "record_us")
		b.ReportMetric((res.OnNs-res.OffNs)/1e3, "trackers_us")
		b.ReportMetric(res.OnNs/res.OffNs, "ratio")
	}
}
