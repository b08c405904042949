package e2e

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
)

// A plain loop over a Hugging Face Llama, and GPT-2 (2-rank DDP over
// gloo, current PyTorch) under launch --auto, with nothing declared but the model's
// config.json: PyTorch's FlopCounterMode counts the sampled steps (every
// 3rd here), and the report's FLOPs a token are the analytic model's of
// the same config within 3% (docs/flops.md's formulas against PyTorch's own
// count; on an H200 a 0.95 B Llama read 2.1% apart). With gradient
// checkpointing the count says so (recomputed activations: hardware FLOPs)
// and is larger. On CPU there is no GPU peak: no MFU from the count, and
// the report says why.
func TestModernTorchCountedFLOPs(t *testing.T) {
	py := modernTorchPython(t)
	const seq = 64
	cfg := []byte(`{"model_type": "llama", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128, "tie_word_embeddings": false}`)
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	model, err := mfu.FromHFConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "llama_flops.py")
	perToken := map[bool]float64{}
	for _, ckpt := range []bool{false, true} {
		name := "plain"
		args := []string{script, "--config", cfgPath, "--steps", "12", "--seq", strconv.Itoa(seq)}
		meta := tps.RunMeta{Model: &model, Seq: seq}
		if ckpt {
			name = "checkpointing"
			args = append(args, "--checkpointing")
			meta.Recompute = string(mfu.RecomputeFull)
		}
		t.Run(name, func(t *testing.T) {
			dir, log := launchTorch(t, "flops-"+name, true, torchrun(py, 2, args...), func(c *launch.Config) {
				c.Meta = meta
				every := int64(3)
				c.FlopsEvery = &every // launch --flops-every 3
			})
			rep, err := report.Analyze(dir, report.Options{Warmup: 1})
			if err != nil {
				t.Fatal(err)
			}
			f := rep.CountedFLOPs
			if f == nil || f.Samples != 4 || f.Partial != 0 {
				t.Fatalf("counted FLOPs %+v: want steps 2, 5, 8 and 11 of both ranks\n%s", f, log)
			}
			perToken[ckpt] = f.PerToken
			t.Logf("%s: %.4g FLOPs a token counted, analytic %v, gap %v, recompute %v", name, f.PerToken, deref(f.AnalyticPerToken), deref(f.Gap), f.Recompute)
			if f.Recompute != ckpt {
				t.Errorf("recompute %v, the job checkpointed: %v", f.Recompute, ckpt)
			}
			if !ckpt && (f.Gap == nil || math.Abs(*f.Gap) > 0.03 || f.Flagged) {
				t.Errorf("counted %.4g a token against the analytic %v: want within 3%%", f.PerToken, deref(f.AnalyticPerToken))
			}
			if f.MFU != nil || f.HFU != nil || f.Unknown == "" {
				t.Errorf("on CPU: MFU %v, HFU %v from the count, unknown %q", f.MFU, f.HFU, f.Unknown)
			}
			if rep.Summary.SteadySteps != 12-1-4 {
				t.Errorf("%d steady steps: want 7 (12, less the warm-up step and the 4 counted)", rep.Summary.SteadySteps)
			}
		})
	}
	if perToken[true] <= perToken[false] {
		t.Errorf("checkpointing counted %.4g a token, not more than without (%.4g)", perToken[true], perToken[false])
	}

	// GPT-2's shape (learned positions, a two-matrix GELU MLP, the head
	// tied to the embedding), declared as the model: the count matches it
	gpt := []byte(`{"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 128}`)
	gptPath := filepath.Join(t.TempDir(), "gpt2.json")
	if err := os.WriteFile(gptPath, gpt, 0o644); err != nil {
		t.Fatal(err)
	}
	gm := mfu.Model{Layers: 2, Hidden: 64, Heads: 4, HeadDim: 16, FFN: 256, Vocab: 512, Tied: true, Seq: seq}
	t.Run("gpt2", func(t *testing.T) {
		dir, log := launchTorch(t, "flops-gpt2", true, torchrun(py, 2, script, "--gpt2", "--config", gptPath, "--steps", "12", "--seq", strconv.Itoa(seq)),
			func(c *launch.Config) {
				c.Meta = tps.RunMeta{Model: &gm, Seq: seq}
				every := int64(3)
				c.FlopsEvery = &every
			})
		rep, err := report.Analyze(dir, report.Options{Warmup: 1})
		if err != nil {
			t.Fatal(err)
		}
		f := rep.CountedFLOPs
		if f == nil || f.Samples != 4 {
			t.Fatalf("counted FLOPs %+v\n%s", f, log)
		}
		t.Logf("gpt2: %.4g FLOPs a token counted, analytic %v, gap %v", f.PerToken, deref(f.AnalyticPerToken), deref(f.Gap))
		if f.Gap == nil || math.Abs(*f.Gap) > 0.03 || f.Recompute {
			t.Errorf("counted %.4g a token against the analytic %v: want within 3%%", f.PerToken, deref(f.AnalyticPerToken))
		}
	})
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
