package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/internal/natsconn"
)

// BenchmarkPythonHook: the Python hook's cost per training step, sending
// to a real agent, against a bare loop in the same Python process.
//
//	go test -run '^$' -bench PythonHook -benchtime 1x ./internal/e2e/
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
	script := filepath.Join(filepath.Dir(file), "..", "..", "examples", "pytorch", "bench_hook.py")
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
