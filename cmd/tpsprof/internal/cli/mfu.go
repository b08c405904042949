package cli

import (
	"encoding/json"
	"errors"

	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/tps"
)

const mfuExamples = `  # MFU of a Llama 3 8B job on 64 H100s running at 400K tokens/s
  tpsprof mfu --model llama3-8b --gpus 64 --gpu h100-sxm --tps 400k

  # the same from step time and global batch, with full recompute, as JSON
  tpsprof mfu --model llama3-8b --gpus 64 --gpu h100-sxm --step-time 2.6s --batch-tokens 1M --recompute full --json

  # a model from its Hugging Face config, trained at 4096 tokens
  tpsprof mfu --hf-config config.json --seq 4096 --gpus 8 --gpu "NVIDIA A100-SXM4-80GB" --tps 30k

  # what TPS does 40% MFU mean for Llama 3 70B on 512 H100s, and how long is 15T tokens?
  tpsprof mfu --model llama3-70b --gpus 512 --gpu h100-sxm --mfu 0.4 --train-tokens 15T --gpu-hour-usd 2.5
`

// mfuJSON is the --json output. The first keys are always present (null when
// their inputs are not given); the last two only with their inputs.
type mfuJSON struct {
	Model              string   `json:"model"`
	ParamsTotal        float64  `json:"params_total"`
	ParamsActive       float64  `json:"params_active"`
	FLOPsPerToken      float64  `json:"flops_per_token"`
	HWFLOPsPerToken    float64  `json:"hw_flops_per_token"`
	DenseFLOPsPerToken float64  `json:"dense_flops_per_token"`
	AttnFLOPsPerToken  float64  `json:"attention_flops_per_token"`
	Attention          string   `json:"attention"`
	Recompute          string   `json:"recompute"`
	GPU                *string  `json:"gpu"`
	DType              string   `json:"dtype"`
	GPUs               *int     `json:"gpus"`
	PeakTFLOPS         *float64 `json:"peak_tflops"`
	TokensPerSec       *float64 `json:"tokens_per_sec"`
	TokensPerSecPerGPU *float64 `json:"tokens_per_sec_per_gpu"`
	TFLOPSPerGPU       *float64 `json:"tflops_per_gpu"`
	HWTFLOPSPerGPU     *float64 `json:"hw_tflops_per_gpu"`
	MFU                *float64 `json:"mfu"`
	HFU                *float64 `json:"hfu"`
	TimeToTrainS       *float64 `json:"time_to_train_s,omitempty"`
	CostPerMTokUSD     *float64 `json:"cost_per_million_tokens_usd,omitempty"`
}

// mfuFlags are the mfu command's flags, and which were given.
type mfuFlags struct {
	preset, hfConfig, gpuName, dtype, recompute, attention *string
	ints                                                   map[string]*int // shape flags by name
	gated, tied, asJSON, listGPUs                          *bool
	gpus                                                   *int
	params, tps, batchTok, peakTF, trainTok, usd, target   quantity
	stepTime                                               seconds
	set                                                    map[string]bool
}

func runMFU(args []string, stdout, stderr io.Writer) int {
	const cmd = "mfu"
	fs := newFlagSet(cmd, "mfu (--model PRESET | --hf-config FILE | shape flags | --params N) [throughput] [--gpus N --gpu NAME | --peak-tflops X] [flags]", mfuExamples, stderr)
	f := mfuFlagsOf(fs)
	if code, ok := parseFlags(fs, args, stderr); !ok {
		return code
	}
	f.set = setFlags(fs)
	if *f.listGPUs {
		return printGPUTable(stdout, *f.asJSON)
	}
	out, err := f.figures()
	if err != nil {
		return usageErr(stderr, cmd, "%s", err)
	}
	if *f.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			failErr(stderr, "mfu", err)
			return exitError
		}
		return exitOK
	}
	printMFUTable(stdout, *out, float64(f.trainTok), float64(f.usd))
	return exitOK
}

func mfuFlagsOf(fs *flagSet) *mfuFlags {
	f := &mfuFlags{
		preset:    fs.String("model", "", "model preset: "+strings.Join(mfu.PresetNames(), ", ")),
		hfConfig:  fs.String("hf-config", "", "Hugging Face config.json of the model (Llama, Mistral/Mixtral, Qwen, Gemma 2/3, DeepSeek-V2/V3 and Kimi K2 keys)"),
		ints:      map[string]*int{},
		gpus:      fs.Int("gpus", 0, "GPUs in the whole job (world size)"),
		gpuName:   fs.String("gpu", "", "GPU model: a table key (h100-sxm) or the name NVML reports (\"NVIDIA H100 80GB HBM3\")"),
		dtype:     fs.String("dtype", "bf16", "training dtype: fp32, tf32, bf16, fp16, fp8, fp4"),
		recompute: fs.String("recompute", "none", "activation recompute, for HFU: none, selective, full"),
		attention: fs.String("attention", "full", "causal-attention FLOPs convention: full (PaLM, Megatron) or causal (halved)"),
		asJSON:    fs.Bool("json", false, "print one JSON object instead of the table"),
		listGPUs:  fs.Bool("list-gpus", false, "print the peak table with sources and exit"),
	}
	for _, x := range []struct{ name, usage string }{
		{"layers", "transformer layers"}, {"hidden", "hidden size"}, {"heads", "attention heads"},
		{"kv-heads", "key/value heads (GQA; default: heads)"}, {"head-dim", "head dimension (default: hidden/heads)"},
		{"ffn", "FFN (intermediate) size"},
	} {
		f.ints[x.name] = fs.Int(x.name, 0, x.usage)
	}
	f.gated = fs.Bool("gated", false, "gated FFN with three matrices (SwiGLU)")
	f.ints["vocab"] = fs.Int("vocab", 0, "vocabulary size")
	f.tied = fs.Bool("tied", false, "input embedding and output projection share weights")
	for _, x := range []struct{ name, usage string }{
		{"experts", "routed experts (MoE)"}, {"top-k", "experts per token (MoE)"}, {"shared-experts", "always-active shared experts (MoE)"},
		{"moe-ffn", "expert FFN size (MoE; default: --ffn)"}, {"dense-layers", "leading layers with a dense FFN (MoE)"},
		{"seq", "training sequence length (sets the attention term)"},
	} {
		f.ints[x.name] = fs.Int(x.name, 0, x.usage)
	}
	fs.Var(&f.params, "params", "bare parameter count instead of a shape (e.g. 540B); with --layers --heads --head-dim --seq it gets the attention term")
	fs.Var(&f.tps, "tps", "cluster training throughput in tokens/s, counted once per data-parallel replica (e.g. 1.2M)")
	fs.Var(&f.stepTime, "step-time", "seconds per optimizer step (e.g. 2.5s, 850ms), with --batch-tokens")
	fs.Var(&f.batchTok, "batch-tokens", "tokens per optimizer step, whole job (global batch × sequence length)")
	fs.Var(&f.peakTF, "peak-tflops", "dense peak TFLOP/s of one GPU at --dtype; overrides the table")
	fs.Var(&f.trainTok, "train-tokens", "token budget, for the time to train (e.g. 15T)")
	fs.Var(&f.usd, "gpu-hour-usd", "price of one GPU-hour in USD, for the cost per million tokens")
	fs.Var((*fraction)(&f.target), "mfu", "target MFU, a fraction (0.4) or a percentage (40%): print the tokens/s it means")
	return f
}

// base is the model of --model or --hf-config (the zero Model: neither).
func (f *mfuFlags) base() (mfu.Model, error) {
	var m mfu.Model
	set := f.set
	switch {
	case set["model"] && set["hf-config"]:
		return m, errors.New("--model and --hf-config both given: choose one")
	case set["model"]:
		p, err := mfu.Preset(*f.preset)
		if err != nil {
			return m, err
		}
		m = p
	case set["hf-config"]:
		data, err := os.ReadFile(*f.hfConfig)
		if err != nil {
			return m, fmt.Errorf("read --hf-config: %v", err)
		}
		if m, err = mfu.FromHFConfig(data); err != nil {
			return m, fmt.Errorf("%s: %v", *f.hfConfig, err)
		}
	}
	return m, nil
}

// model is the model: a preset or config file, then shape flags on top.
func (f *mfuFlags) model() (mfu.Model, error) {
	m, err := f.base()
	if err != nil {
		return m, err
	}
	set := f.set
	if set["params"] {
		if m.HasShape() || set["hidden"] || set["ffn"] || set["vocab"] {
			return m, errors.New("--params replaces the shape: drop --model/--hf-config/--hidden/--ffn/--vocab, or drop --params")
		}
		m.Params = float64(f.params)
	}
	fields := map[string]*int{"layers": &m.Layers, "hidden": &m.Hidden, "heads": &m.Heads, "kv-heads": &m.KVHeads, "head-dim": &m.HeadDim,
		"ffn": &m.FFN, "vocab": &m.Vocab, "experts": &m.Experts, "top-k": &m.TopK, "shared-experts": &m.SharedExperts,
		"moe-ffn": &m.MoEFFN, "dense-layers": &m.DenseLayers, "seq": &m.Seq}
	for name, dst := range fields {
		if set[name] {
			*dst = *f.ints[name]
		}
	}
	if set["gated"] {
		m.Gated = *f.gated
	}
	if set["tied"] {
		m.Tied = *f.tied
	}
	if m.HasShape() && m.Seq == 0 {
		return m, errors.New("--seq is required: the training sequence length sets the attention FLOPs (a config's max_position_embeddings is the model's limit, not the training length)")
	}
	return m, nil
}

// throughput is tokens/s from --tps, or --step-time with --batch-tokens
// (0: none given; --mfu asks for it).
func (f *mfuFlags) throughput() (float64, error) {
	set := f.set
	switch {
	case set["tps"] && (set["step-time"] || set["batch-tokens"]):
		return 0, errors.New("--tps and --step-time/--batch-tokens both given: give one throughput")
	case set["mfu"] && (set["tps"] || set["step-time"]):
		return 0, errors.New("--mfu asks for the throughput; drop --tps/--step-time")
	case set["step-time"] != set["batch-tokens"]:
		return 0, errors.New("--step-time and --batch-tokens go together")
	case set["tps"]:
		if f.tps <= 0 || math.IsInf(float64(f.tps), 0) {
			return 0, fmt.Errorf("--tps %v must be positive", float64(f.tps))
		}
		return float64(f.tps), nil
	case set["step-time"]:
		if f.stepTime <= 0 || f.batchTok <= 0 {
			return 0, errors.New("--step-time and --batch-tokens must be positive")
		}
		return float64(f.batchTok) / time.Duration(f.stepTime).Seconds(), nil
	}
	return 0, nil
}

// peak is one GPU's dense peak FLOP/s at dt and the GPU's key (0 and nil
// when neither --gpu nor --peak-tflops is given and none is needed).
func (f *mfuFlags) peak(dt mfu.DType, needHW bool) (float64, *string, error) {
	if needHW && *f.gpus <= 0 {
		return 0, nil, errors.New("--gpus is required with a throughput or --mfu (the whole job's GPU count)")
	}
	switch {
	case f.set["peak-tflops"]:
		if f.peakTF <= 0 {
			return 0, nil, errors.New("--peak-tflops must be positive")
		}
		s := "custom"
		return float64(f.peakTF) * 1e12, &s, nil
	case f.set["gpu"]:
		g, err := mfu.LookupGPU(*f.gpuName)
		if err != nil {
			return 0, nil, err
		}
		peak, err := g.Peak(dt)
		if err != nil {
			return 0, nil, err
		}
		return peak, &g.Key, nil
	case needHW:
		return 0, nil, errors.New("give --gpu NAME or --peak-tflops X for the GPU's dense peak")
	}
	return 0, nil, nil
}

// figures is what the command prints, from the flags.
func (f *mfuFlags) figures() (*mfuJSON, error) {
	m, err := f.model()
	if err != nil {
		return nil, err
	}
	att, rc := mfu.Attention(*f.attention), mfu.Recompute(*f.recompute)
	counts, err := m.Count(att, rc)
	if err != nil {
		return nil, err
	}
	dt, err := mfu.ParseDType(*f.dtype)
	if err != nil {
		return nil, err
	}
	tokensPerSec, err := f.throughput()
	if err != nil {
		return nil, err
	}
	peak, gpuKey, err := f.peak(dt, tokensPerSec > 0 || f.set["mfu"])
	if err != nil {
		return nil, err
	}
	if f.set["mfu"] {
		if tokensPerSec, err = mfu.TokensPerSecForMFU(m, att, float64(f.target), *f.gpus, peak); err != nil {
			return nil, err
		}
	}
	if err := f.needsThroughput(tokensPerSec); err != nil {
		return nil, err
	}
	out := &mfuJSON{
		Model: describeModel(m), ParamsTotal: counts.ParamsTotal, ParamsActive: counts.ParamsActive,
		FLOPsPerToken: counts.FLOPsPerToken, HWFLOPsPerToken: counts.HWFLOPsPerToken,
		DenseFLOPsPerToken: counts.DenseFLOPsPerToken, AttnFLOPsPerToken: counts.AttentionFLOPsPerToken,
		Attention: string(counts.Attention), Recompute: string(counts.Recompute), GPU: gpuKey, DType: string(dt),
	}
	if peak > 0 {
		p := peak / 1e12
		out.PeakTFLOPS = &p
	}
	if *f.gpus > 0 {
		out.GPUs = f.gpus
	}
	if tokensPerSec > 0 {
		r, err := mfu.Compute(mfu.Inputs{Model: m, Attention: att, Recompute: rc, TokensPerSec: tokensPerSec, GPUs: *f.gpus, PeakFLOPS: peak})
		if err != nil {
			return nil, err
		}
		out.TokensPerSec, out.TokensPerSecPerGPU = &r.TokensPerSec, &r.TokensPerSecPerGPU
		out.TFLOPSPerGPU, out.HWTFLOPSPerGPU = &r.TFLOPSPerGPU, &r.HWTFLOPSPerGPU
		out.MFU, out.HFU = &r.MFU, &r.HFU
	}
	return out, f.budget(out, tokensPerSec)
}

func (f *mfuFlags) needsThroughput(tokensPerSec float64) error {
	if (f.set["train-tokens"] || f.set["gpu-hour-usd"]) && tokensPerSec == 0 {
		return errors.New("--train-tokens and --gpu-hour-usd need a throughput (--tps, --step-time with --batch-tokens, or --mfu)")
	}
	return nil
}

// budget adds the time to train and the cost per million tokens.
func (f *mfuFlags) budget(out *mfuJSON, tokensPerSec float64) error {
	if f.set["train-tokens"] {
		d, err := tps.TimeToTrain(float64(f.trainTok), tokensPerSec)
		if err != nil {
			return err
		}
		s := d.Seconds()
		out.TimeToTrainS = &s
	}
	if f.set["gpu-hour-usd"] {
		c, err := tps.CostPerMillionTokens(tokensPerSec, *f.gpus, float64(f.usd))
		if err != nil {
			return err
		}
		out.CostPerMTokUSD = &c
	}
	return nil
}

func describeModel(m mfu.Model) string {
	name := m.Name
	if name == "" {
		name = "custom"
	}
	if !m.HasShape() {
		return fmt.Sprintf("%s (%s parameters)", name, tps.Count(m.Params))
	}
	ffn := "FFN"
	if m.Gated {
		ffn = "gated FFN"
	}
	kv := m.KVHeads
	if kv == 0 {
		kv = m.Heads
	}
	s := fmt.Sprintf("%s: %d layers, hidden %d, %d heads (%d kv), %s %d, vocab %d, seq %d", name, m.Layers, m.Hidden, m.Heads, kv, ffn, m.FFN, m.Vocab, m.Seq)
	if m.Experts > 0 {
		s += fmt.Sprintf(", %d experts top-%d", m.Experts, max(m.TopK, 1))
		if m.SharedExperts > 0 || m.DenseLayers > 0 {
			s += fmt.Sprintf(" (+%d shared, %d dense layers)", m.SharedExperts, m.DenseLayers)
		}
	}
	if m.KVLoRARank > 0 {
		s += fmt.Sprintf(", latent attention (q rank %d, kv rank %d, qk %d+%d, v %d)", m.QLoRARank, m.KVLoRARank, m.QKNopeDim, m.QKRopeDim, m.VHeadDim)
	}
	if m.MTPLayers > 0 {
		s += fmt.Sprintf(", %d MTP module(s)", m.MTPLayers)
	}
	if m.Window > 0 {
		n := m.WindowLayers
		if n == 0 {
			n = m.Layers
		}
		s += fmt.Sprintf(", sliding window %d on %d layers", m.Window, n)
	}
	return s
}

func printMFUTable(w io.Writer, o mfuJSON, trainTokens, usd float64) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("model", "%s", o.Model)
	row("parameters", "%s total, %s active", tps.Count(o.ParamsTotal), tps.Count(o.ParamsActive))
	row("model FLOPs/token", "%.2f GFLOP (dense %.2f + attention %.2f; attention=%s)", o.FLOPsPerToken/1e9, o.DenseFLOPsPerToken/1e9, o.AttnFLOPsPerToken/1e9, o.Attention)
	row("hardware FLOPs/token", "%.2f GFLOP (recompute=%s)", o.HWFLOPsPerToken/1e9, o.Recompute)
	if o.PeakTFLOPS != nil {
		row("peak", "%.1f TFLOP/s dense per GPU (%s, %s)", *o.PeakTFLOPS, *o.GPU, o.DType)
		row("peak convention", "%s", mfu.PeakConvention(mfu.DType(o.DType)))
	}
	if o.TokensPerSec != nil {
		row("throughput", "%s tokens/s cluster, %s tokens/s per GPU on %d GPUs", tps.Count(*o.TokensPerSec), tps.Count(*o.TokensPerSecPerGPU), *o.GPUs)
		row("TFLOP/s per GPU", "%.1f model, %.1f hardware", *o.TFLOPSPerGPU, *o.HWTFLOPSPerGPU)
		row("MFU", "%.1f%%", 100**o.MFU)
		row("HFU", "%.1f%%", 100**o.HFU)
	}
	if o.TimeToTrainS != nil {
		d := time.Duration(*o.TimeToTrainS * 1e9)
		row("time to train", "%s tokens in %.1f days (%s)", tps.Count(trainTokens), d.Hours()/24, d.Round(time.Minute))
	}
	if o.CostPerMTokUSD != nil {
		row("cost", "$%.4f per million tokens at $%.2f per GPU-hour", *o.CostPerMTokUSD, usd)
		if o.TimeToTrainS != nil {
			row("cost to train", "$%s", tps.Count(*o.CostPerMTokUSD*trainTokens/1e6))
		}
	}
	tw.Flush()
}

func printGPUTable(w io.Writer, asJSON bool) int {
	gs := mfu.GPUs()
	if asJSON {
		if err := json.NewEncoder(w).Encode(gs); err != nil {
			return exitError
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "key\tname\tfp32\ttf32\tbf16\tfp8\tfp4\tsource")
	for _, g := range gs {
		cell := func(d mfu.DType) string {
			if v, ok := g.Peaks[d]; ok {
				return fmt.Sprintf("%g", v)
			}
			return "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Key, g.Name, cell(mfu.FP32), cell(mfu.TF32), cell(mfu.BF16), cell(mfu.FP8), cell(mfu.FP4), g.Source)
	}
	tw.Flush()
	return exitOK
}
