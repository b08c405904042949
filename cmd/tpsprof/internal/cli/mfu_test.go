package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/demo"
)

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = Main(args, &o, &e)
	return o.String(), e.String(), code
}

func TestMFUJSON(t *testing.T) {
	out, errOut, code := run(t, "mfu", "--model", "llama3-8b", "--gpus", "64", "--gpu", "NVIDIA H100 80GB HBM3",
		"--tps", "400k", "--train-tokens", "15T", "--gpu-hour-usd", "2.5", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, out)
	}
	for _, k := range []string{"params_total", "params_active", "flops_per_token", "hw_flops_per_token", "tokens_per_sec",
		"tokens_per_sec_per_gpu", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu", "hfu", "peak_tflops", "attention",
		"time_to_train_s", "cost_per_million_tokens_usd"} {
		if _, ok := got[k]; !ok {
			t.Errorf("key %q missing", k)
		}
	}
	// 400k tokens/s × 57.91 GFLOP/token / 64 / 989.4 TFLOP/s
	if mfu := got["mfu"].(float64); math.Abs(mfu-400e3*57.912852480e9/64/989.4e12) > 1e-9 {
		t.Errorf("mfu: got %g", mfu)
	}
	if s := got["time_to_train_s"].(float64); math.Abs(s-15e12/400e3) > 1e-3 {
		t.Errorf("time_to_train_s: got %g, want %g", s, 15e12/400e3)
	}
	if c := got["cost_per_million_tokens_usd"].(float64); math.Abs(c-2.5*64/3600/400e3*1e6) > 1e-12 {
		t.Errorf("cost: got %g", c)
	}
	if got["attention"] != "full" {
		t.Errorf("attention: got %v", got["attention"])
	}
}

func TestMFUTableAndInverse(t *testing.T) {
	out, errOut, code := run(t, "mfu", "--model", "llama3-70b", "--gpus", "512", "--gpu", "h100-sxm", "--mfu", "0.4")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "MFU                   40.0%") {
		t.Errorf("inverse does not round-trip to 40%%:\n%s", out)
	}
	out, _, code = run(t, "mfu", "--model", "llama3-8b")
	if code != 0 || !strings.Contains(out, "8.03B total") || strings.Contains(out, "MFU") {
		t.Errorf("model-only run (exit %d):\n%s", code, out)
	}
}

func TestMFUShapeFlagsAndConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	os.WriteFile(cfg, []byte(`{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,
	  "num_key_value_heads":8,"intermediate_size":14336,"vocab_size":128256,"max_position_embeddings":131072}`), 0o644)
	a, _, c1 := run(t, "mfu", "--hf-config", cfg, "--seq", "8192", "--json")
	b, _, c2 := run(t, "mfu", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--ffn", "14336",
		"--gated", "--vocab", "128256", "--seq", "8192", "--json")
	p, _, c3 := run(t, "mfu", "--model", "llama3-8b", "--json")
	if c1 != 0 || c2 != 0 || c3 != 0 {
		t.Fatalf("exit codes %d %d %d", c1, c2, c3)
	}
	fpt := func(s string) float64 {
		var m map[string]any
		json.Unmarshal([]byte(s), &m)
		return m["flops_per_token"].(float64)
	}
	if fpt(a) != fpt(p) || fpt(b) != fpt(p) {
		t.Errorf("config %g, shape %g and preset %g disagree", fpt(a), fpt(b), fpt(p))
	}
	// A preset with an override.
	o, _, _ := run(t, "mfu", "--model", "llama3-8b", "--seq", "4096", "--attention", "causal", "--json")
	if fpt(o) >= fpt(p) {
		t.Errorf("shorter causal sequence did not lower FLOPs/token")
	}
}

func TestMFUBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no model", []string{"mfu", "--tps", "1"}, "give a preset"},
		{"two models", []string{"mfu", "--model", "llama3-8b", "--hf-config", "x.json"}, "choose one"},
		{"unknown preset", []string{"mfu", "--model", "llama9"}, "presets:"},
		{"two throughputs", []string{"mfu", "--model", "llama3-8b", "--tps", "1", "--step-time", "1s", "--batch-tokens", "1"}, "give one throughput"},
		{"step time alone", []string{"mfu", "--model", "llama3-8b", "--step-time", "1s"}, "go together"},
		{"no gpus", []string{"mfu", "--model", "llama3-8b", "--tps", "1k", "--gpu", "h100"}, "--gpus is required"},
		{"no peak", []string{"mfu", "--model", "llama3-8b", "--tps", "1k", "--gpus", "8"}, "--gpu NAME or --peak-tflops"},
		{"unknown gpu", []string{"mfu", "--model", "llama3-8b", "--tps", "1k", "--gpus", "8", "--gpu", "RTX 9090"}, "--peak-tflops"},
		{"fp8 on A100", []string{"mfu", "--model", "llama3-8b", "--tps", "1k", "--gpus", "8", "--gpu", "a100-sxm", "--dtype", "fp8"}, "no dense fp8"},
		{"impossible", []string{"mfu", "--model", "llama3-8b", "--tps", "10M", "--gpus", "8", "--gpu", "h100-sxm"}, "above 100%"},
		{"bad number", []string{"mfu", "--model", "llama3-8b", "--tps", "fast"}, "not a number"},
		{"negative tps", []string{"mfu", "--model", "llama3-8b", "--tps", "-5", "--gpus", "8", "--gpu", "h100"}, "must be positive"},
		{"bad recompute", []string{"mfu", "--model", "llama3-8b", "--recompute", "some"}, "none, selective or full"},
		{"budget without throughput", []string{"mfu", "--model", "llama3-8b", "--train-tokens", "1T"}, "need a throughput"},
		{"shape without seq", []string{"mfu", "--layers", "2", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "100"}, "--seq is required"},
		{"params with shape", []string{"mfu", "--model", "llama3-8b", "--params", "8B"}, "--params replaces the shape"},
		{"stray argument", []string{"mfu", "--model", "llama3-8b", "extra"}, "unexpected argument"},
		{"bad partition", []string{"collector", "--out", "/nonexistent", "--partition", "2/2"}, "want I/N with 0 <= I < N"},
		{"partition and durable", []string{"collector", "--out", "/nonexistent", "--partition", "0/2", "--durable"}, "does not combine with --durable"},
		{"unknown codec", []string{"collector", "--out", "/nonexistent", "--parquet-codec", "lz9"}, "unknown Parquet codec \"lz9\" (zstd, zstd-fast, snappy, none)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, tc.args...)
			if code != 2 {
				t.Errorf("got exit %d, want 2 (stdout %q)", code, out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q does not contain %q", errOut, tc.want)
			}
			if n := strings.Count(strings.TrimSpace(errOut), "\n"); n != 0 {
				t.Errorf("want one error line, got %d:\n%s", n+1, errOut)
			}
		})
	}
}

func TestMFUHelpDocumentsEveryFlag(t *testing.T) {
	_, errOut, code := run(t, "mfu", "--help")
	if code != 0 {
		t.Fatalf("--help exit %d", code)
	}
	for _, f := range []string{"-model", "-hf-config", "-params", "-layers", "-hidden", "-heads", "-kv-heads", "-head-dim", "-ffn",
		"-gated", "-vocab", "-tied", "-experts", "-top-k", "-seq", "-tps", "-step-time", "-batch-tokens", "-gpus", "-gpu",
		"-peak-tflops", "-dtype", "-recompute", "-attention", "-train-tokens", "-gpu-hour-usd", "-mfu", "-json", "Examples:"} {
		if !strings.Contains(errOut, f) {
			t.Errorf("--help does not mention %s", f)
		}
	}
}

// The real binary, as a subprocess: exit codes and output reach the shell.
func TestBinaryExitCodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "tpsprof")
	build := exec.Command("go", "build", "-o", bin, "github.com/tpsprof/tpsprof/cmd/tpsprof")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "mfu", "--model", "gpt3-175b", "--gpus", "1024", "--gpu", "a100-sxm", "--tps", "100k", "--json").Output()
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("output does not parse: %v", err)
	}
	cmd := exec.Command(bin, "mfu", "--model", "nope")
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("bad flag: got %v, want exit status 2", err)
	}
}

// Without an NVIDIA driver (CI, this machine), tpsprof gpus says so clearly.
func TestGPUsWithoutDriver(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("an NVIDIA driver is present; the real path is exercised instead")
	}
	_, errOut, code := run(t, "gpus")
	if code != 1 || !strings.Contains(errOut, "no GPU telemetry on this node") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

func TestReportCommand(t *testing.T) {
	out := t.TempDir()
	cfg := demo.Defaults()
	cfg.Out, cfg.Steps, cfg.StepInterval = out, 30, 0
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	js, errOut, code := run(t, "report", "--json", "--no-plots", res.JobDir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep map[string]any
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatalf("report --json does not parse: %v", err)
	}
	for _, k := range []string{"summary", "breakdown", "goodput", "straggler_ranks", "straggler_nodes", "comm_fit"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("key %s missing", k)
		}
	}
	txt, _, code := run(t, "report", res.JobDir, "--plots", filepath.Join(out, "plots"))
	if code != 0 || !strings.Contains(txt, "plots written to") {
		t.Errorf("text report (exit %d):\n%s", code, txt)
	}
	// a second demo into the same folder replaces the first's run (it was
	// added to it: 60 steps as one attempt, "goodput 3.1%, idle 96.7%")
	if _, err := demo.Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	txt, _, _ = run(t, "report", "--no-plots", res.JobDir)
	if !strings.Contains(txt, "steps              30 (") {
		t.Errorf("the second demo's report:\n%s", txt)
	}
	// a folder the demo did not write is left alone
	other := t.TempDir()
	os.MkdirAll(filepath.Join(other, cfg.Job, "cluster_steps"), 0o700)
	cfg.Out = other
	if _, err := demo.Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "did not write") {
		t.Errorf("a demo over another run's folder: %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(out, "plots", "*.png")); len(files) < 5 {
		t.Errorf("got %d PNG plots", len(files))
	}
	cmp, _, code := run(t, "report", "--compare", res.JobDir, res.JobDir)
	if code != 0 || !strings.Contains(cmp, "+0.0%") {
		t.Errorf("compare (exit %d):\n%s", code, cmp)
	}
	if _, e, code := run(t, "report"); code != 2 || !strings.Contains(e, "job folder") {
		t.Errorf("no folder: exit %d %q", code, e)
	}
	if _, e, code := run(t, "report", filepath.Join(out, "missing")); code != 1 || !strings.Contains(e, "not a job folder") {
		t.Errorf("missing folder: exit %d %q", code, e)
	}
}

// report on a collector's folder lists its jobs; on a running job (a part
// still being written) it reports what is finalised and says so.
func TestReportOutDirAndRunningJob(t *testing.T) {
	out := t.TempDir()
	cfg := demo.Defaults()
	cfg.Out, cfg.Steps, cfg.StepInterval = out, 20, 0
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	txt, errOut, code := run(t, "report", out)
	if code != 0 || !strings.Contains(txt, "collector's output folder with 1 job") || !strings.Contains(txt, filepath.Base(res.JobDir)) {
		t.Fatalf("report OUT (exit %d): %s %s", code, txt, errOut)
	}
	js, _, code := run(t, "report", "--json", out)
	var jobs []map[string]any
	if code != 0 || json.Unmarshal([]byte(js), &jobs) != nil || len(jobs) != 1 {
		t.Errorf("report --json OUT (exit %d): %s", code, js)
	}
	// a part still being written, as a live collector leaves it
	tmp := filepath.Join(res.JobDir, "cluster_steps", ".part-live-1.parquet.tmp")
	if err := os.WriteFile(tmp, []byte("PAR1"), 0o644); err != nil {
		t.Fatal(err)
	}
	txt, _, code = run(t, "report", "--no-plots", res.JobDir)
	if code != 0 || !strings.Contains(txt, "running: this report covers steps 0-19, written so far (1 part(s) still being written)") {
		t.Errorf("running job (exit %d):\n%s", code, txt)
	}
	txt, _, _ = run(t, "report", out)
	if !strings.Contains(txt, "running") {
		t.Errorf("job list does not say running:\n%s", txt)
	}
}

// tpsprof mfu --hf-config with DeepSeek-V3's config.json: latent attention,
// 256 routed experts, MTP. The DeepSeek-V3 report (arXiv:2412.19437) gives
// 2.788M H800 GPU-hours for 14.8T tokens: 1,474 tokens/s per GPU, which is
// 38-39% of the H800's dense BF16 peak at 2.6e11 FLOPs/token.
func TestMFUDeepSeekV3Config(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(`{"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
 "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
 "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
 "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
 "num_nextn_predict_layers": 1, "vocab_size": 129280, "tie_word_embeddings": false}`), 0o644)
	tpsPerGPU := 14.8e12 / 2.788e6 / 3600
	out, errOut, code := run(t, "mfu", "--hf-config", cfg, "--seq", "4096", "--attention", "causal", "--gpus", "2048", "--gpu", "NVIDIA H800",
		"--tps", fmt.Sprintf("%.0f", tpsPerGPU*2048), "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var o struct {
		ParamsTotal  float64  `json:"params_total"`
		ParamsActive float64  `json:"params_active"`
		MFU          *float64 `json:"mfu"`
	}
	if err := json.Unmarshal([]byte(out), &o); err != nil {
		t.Fatal(err)
	}
	if o.MFU == nil || *o.MFU < 0.37 || *o.MFU > 0.40 || o.ParamsTotal < 665e9 || o.ParamsTotal > 677e9 {
		t.Errorf("DeepSeek-V3: %+v MFU %v", o, o.MFU)
	}
	txt, _, _ := run(t, "mfu", "--hf-config", cfg, "--seq", "4096", "--gpus", "2048", "--gpu", "h800", "--tps", "3M", "--dtype", "fp8")
	for _, want := range []string{"latent attention", "1 MTP module", "FP8 peak"} {
		if !strings.Contains(txt, want) {
			t.Errorf("text lacks %q:\n%s", want, txt)
		}
	}
}

// The small things a first contact trips on.
func TestFirstContactDetails(t *testing.T) {
	if out, _, code := run(t, "--version"); code != 0 || !strings.HasPrefix(out, "tpsprof ") {
		t.Errorf("--version: exit %d %q", code, out)
	}
	if _, e, code := run(t, "demo", "--dp", "0"); code != 2 || !strings.Contains(e, "--dp 0 must be at least 1") {
		t.Errorf("demo --dp 0: exit %d %q", code, e)
	}
	out, e, code := run(t, "mfu", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "40%", "--json")
	var m map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &m) != nil {
		t.Errorf("mfu --mfu 40%%: exit %d %s %s", code, out, e)
	}
	out2, _, _ := run(t, "mfu", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mfu", "0.4", "--json")
	if out != out2 {
		t.Errorf("40%% and 0.4 differ:\n%s\n%s", out, out2)
	}
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		out, _, code := run(t, "gpus", "--json")
		if code != 1 || json.Unmarshal([]byte(out), &m) != nil || m["error"] == nil {
			t.Errorf("gpus --json without a GPU: exit %d %q", code, out)
		}
	}
	// one prefix, not "tpsprof report: report:"
	if _, e, _ := run(t, "report", t.TempDir()); strings.Count(e, "report:") != 1 {
		t.Errorf("doubled prefix: %q", e)
	}
	if d := demo.Defaults(); !strings.HasPrefix(d.Out, os.TempDir()) {
		t.Errorf("the demo writes into %s, not the temporary folder", d.Out)
	}
	// launch takes --hf-config and --seq (and wants --seq with it)
	cfg := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfg, []byte(`{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":100}`), 0o644)
	if _, e, code := run(t, "launch", "--job", "j", "--hf-config", cfg, "--", "true"); code != 2 || !strings.Contains(e, "needs --seq") {
		t.Errorf("launch --hf-config without --seq: exit %d %q", code, e)
	}
}
