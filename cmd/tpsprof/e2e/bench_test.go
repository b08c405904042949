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
