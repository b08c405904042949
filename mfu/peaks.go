package mfu

import (
	"fmt"
	"slices"
	"strings"
)

// DType is a training number format.
type DType string

// DTypes with peak figures.
const (
	FP32 DType = "fp32"
	TF32 DType = "tf32"
	BF16 DType = "bf16"
	FP16 DType = "fp16"
	FP8  DType = "fp8"
	FP4  DType = "fp4"
)

// ParseDType accepts the usual spellings (bfloat16, float16, half, e4m3, mxfp4…).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "fp32", "float32", "float", "f32":
		return FP32, nil
	case "tf32", "tensorfloat32":
		return TF32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp16", "float16", "half", "f16":
		return FP16, nil
	case "fp8", "float8", "e4m3", "e5m2", "fp8_e4m3", "fp8_e5m2", "mxfp8":
		return FP8, nil
	case "fp4", "float4", "mxfp4", "nvfp4":
		return FP4, nil
	}
	return "", fmt.Errorf("%w: dtype %q: want fp32, tf32, bf16, fp16, fp8 or fp4", ErrBadInput, s)
}

// GPU is one accelerator's dense peak throughput per dtype, in TFLOP/s.
type GPU struct {
	Key   string            `json:"key"`
	Name  string            `json:"name"`
	Peaks map[DType]float64 `json:"peak_tflops"`
	// Source is where the figures come from. Vendor figures "with sparsity"
	// are halved to the dense figure.
	Source string `json:"source"`
	// match lists the name tokens that identify the GPU in the names NVML
	// and other tools report; all must be present.
	match []string
}

// Peak returns the dense peak FLOP/s (not TFLOP/s) at dtype.
func (g GPU) Peak(dt DType) (float64, error) {
	t, ok := g.Peaks[dt]
	if !ok || t <= 0 {
		have := make([]string, 0, len(g.Peaks))
		for d := range g.Peaks {
			have = append(have, string(d))
		}
		slices.Sort(have)
		return 0, fmt.Errorf("%w: %s has no dense %s figure (it has %s); give the peak with --peak-tflops", ErrNoPeak, g.Name, dt, strings.Join(have, ", "))
	}
	return t * 1e12, nil
}

func p(fp32, tf32, bf16, fp8, fp4 float64) map[DType]float64 {
	m := map[DType]float64{}
	for dt, v := range map[DType]float64{FP32: fp32, TF32: tf32, BF16: bf16, FP16: bf16, FP8: fp8, FP4: fp4} {
		if v > 0 {
			m[dt] = v
		}
	}
	return m
}

// gpus is ordered so that the more specific match comes first.
var gpus = []GPU{
	{Key: "a100-pcie", Name: "NVIDIA A100 PCIe", Peaks: p(19.5, 156, 312, 0, 0), Source: "NVIDIA A100 datasheet (2021): TF32 312 and BF16 624 with sparsity, halved", match: []string{"a100", "pcie"}},
	{Key: "a100-sxm", Name: "NVIDIA A100 SXM", Peaks: p(19.5, 156, 312, 0, 0), Source: "NVIDIA A100 datasheet (2021)", match: []string{"a100"}},
	{Key: "h100-pcie", Name: "NVIDIA H100 PCIe", Peaks: p(51, 378, 756, 1513, 0), Source: "NVIDIA H100 datasheet: BF16 1,513 and FP8 3,026 with sparsity, halved", match: []string{"h100", "pcie"}},
	{Key: "h100-nvl", Name: "NVIDIA H100 NVL", Peaks: p(60, 417.5, 835.5, 1670.5, 0), Source: "NVIDIA H100 datasheet (NVL): BF16 1,671 and FP8 3,341 with sparsity, halved", match: []string{"h100", "nvl"}},
	{Key: "h100-sxm", Name: "NVIDIA H100 SXM", Peaks: p(67, 494.7, 989.4, 1978.9, 0), Source: "NVIDIA H100 datasheet (SXM5): BF16 1,979 and FP8 3,958 with sparsity, halved", match: []string{"h100"}},
	{Key: "gh200", Name: "NVIDIA GH200", Peaks: p(67, 494.7, 989.4, 1978.9, 0), Source: "NVIDIA GH200 datasheet: same Hopper GPU figures as H100 SXM", match: []string{"gh200"}},
	{Key: "h200-nvl", Name: "NVIDIA H200 NVL", Peaks: p(60, 417.5, 835.5, 1670.5, 0), Source: "NVIDIA H200 datasheet (NVL): BF16 1,671 and FP8 3,341 with sparsity, halved", match: []string{"h200", "nvl"}},
	{Key: "h200", Name: "NVIDIA H200 SXM", Peaks: p(67, 494.7, 989.4, 1978.9, 0), Source: "NVIDIA H200 datasheet (SXM): BF16 1,979 and FP8 3,958 with sparsity, halved", match: []string{"h200"}},
	{Key: "h800-pcie", Name: "NVIDIA H800 PCIe", Peaks: p(0, 378, 756, 1513, 0), Source: "NVIDIA H800 PCIe: the H100 PCIe's tensor figures (its export variant differs in interconnect), BF16 1,513 and FP8 3,026 with sparsity, halved", match: []string{"h800", "pcie"}},
	{Key: "h800", Name: "NVIDIA H800 SXM", Peaks: p(0, 494.7, 989.4, 1978.9, 0), Source: "NVIDIA H800 SXM: the H100 SXM's tensor figures (NVLink reduced to 400 GB/s, compute unchanged); DeepSeek-V3 report (arXiv:2412.19437) trains on it", match: []string{"h800"}},
	{Key: "a800", Name: "NVIDIA A800", Peaks: p(19.5, 156, 312, 0, 0), Source: "NVIDIA A800 datasheet: the A100's figures (TF32 312 and BF16 624 with sparsity, halved)", match: []string{"a800"}},
	{Key: "l20", Name: "NVIDIA L20", Peaks: p(0, 0, 119.5, 239, 0), Source: "NVIDIA L20 product brief: FP16/BF16 tensor 119.5, FP8 239 dense", match: []string{"l20"}},
	{Key: "h20", Name: "NVIDIA H20", Peaks: p(44, 74, 148, 296, 0), Source: "NVIDIA H20 product brief: BF16 148, FP8 296 dense", match: []string{"h20"}},
	{Key: "gb200", Name: "NVIDIA GB200 (per GPU)", Peaks: p(80, 1250, 2500, 5000, 10000), Source: "NVIDIA GB200 NVL72 datasheet, rack figures with sparsity divided by 72 and halved", match: []string{"gb200"}},
	{Key: "gb300", Name: "NVIDIA GB300 (per GPU)", Peaks: p(80, 1250, 2500, 5000, 15000), Source: "NVIDIA GB300 NVL72 datasheet, per-GPU dense figures", match: []string{"gb300"}},
	{Key: "b200", Name: "NVIDIA B200 (HGX)", Peaks: p(80, 1100, 2250, 4500, 9000), Source: "NVIDIA HGX B200 datasheet: per-GPU dense figures at 1,000 W", match: []string{"b200"}},
	{Key: "b300", Name: "NVIDIA B300 (HGX)", Peaks: p(75, 1100, 2250, 4500, 13500), Source: "NVIDIA HGX B300 datasheet: 108 PFLOPS dense FP4 per 8 GPUs; BF16 and FP8 as B200", match: []string{"b300"}},
	{Key: "l40s", Name: "NVIDIA L40S", Peaks: p(91.6, 183, 362, 733, 0), Source: "NVIDIA L40S datasheet: TF32 366, BF16 733, FP8 1,466 with sparsity, halved", match: []string{"l40s"}},
	{Key: "l4", Name: "NVIDIA L4", Peaks: p(30.3, 60, 121, 242.5, 0), Source: "NVIDIA L4 datasheet: TF32 120, BF16 242, FP8 485 with sparsity, halved", match: []string{"l4"}},
	{Key: "a10g", Name: "NVIDIA A10G (AWS)", Peaks: p(31.2, 35, 70, 0, 0), Source: "AWS G5 (A10G) figures as compiled by Baseten, 'NVIDIA A10 vs A10G' (2023): 70 TFLOPS FP16/BF16 tensor dense", match: []string{"a10g"}},
	{Key: "a10", Name: "NVIDIA A10", Peaks: p(31.2, 62.5, 125, 0, 0), Source: "NVIDIA A10 datasheet: TF32 125, BF16 250 with sparsity, halved", match: []string{"a10"}},
	{Key: "mi250x", Name: "AMD Instinct MI250X", Peaks: p(95.7, 0, 383, 0, 0), Source: "AMD Instinct MI250X datasheet: FP32 matrix 95.7, BF16 383", match: []string{"mi250x"}},
	{Key: "mi250", Name: "AMD Instinct MI250", Peaks: p(90.5, 0, 362.1, 0, 0), Source: "AMD Instinct MI250 datasheet: FP32 matrix 90.5, BF16 362.1", match: []string{"mi250"}},
	{Key: "mi300a", Name: "AMD Instinct MI300A", Peaks: p(122.6, 490.3, 980.6, 1961.2, 0), Source: "AMD Instinct MI300A datasheet, dense figures", match: []string{"mi300a"}},
	{Key: "mi300x", Name: "AMD Instinct MI300X", Peaks: p(163.4, 653.7, 1307.4, 2614.9, 0), Source: "AMD Instinct MI300X datasheet, dense figures", match: []string{"mi300x"}},
	{Key: "mi325x", Name: "AMD Instinct MI325X", Peaks: p(163.4, 653.7, 1307.4, 2614.9, 0), Source: "AMD Instinct MI325X datasheet, dense figures", match: []string{"mi325x"}},
	{Key: "mi355x", Name: "AMD Instinct MI355X", Peaks: p(157.3, 0, 2516.6, 5033.2, 10066.3), Source: "AMD Instinct MI355X datasheet, dense figures (FP4 20.1 PF with sparsity, halved)", match: []string{"mi355x"}},
	{Key: "tpu-v4", Name: "Google TPU v4", Peaks: p(0, 0, 275, 0, 0), Source: "Google Cloud TPU v4 documentation: 275 TFLOPS BF16 per chip", match: []string{"tpu", "v4"}},
	{Key: "tpu-v5e", Name: "Google TPU v5e", Peaks: p(0, 0, 197, 0, 0), Source: "Google Cloud TPU v5e documentation: 197 TFLOPS BF16 per chip", match: []string{"tpu", "v5e"}},
	{Key: "tpu-v5p", Name: "Google TPU v5p", Peaks: p(0, 0, 459, 0, 0), Source: "Google Cloud TPU v5p documentation: 459 TFLOPS BF16 per chip", match: []string{"tpu", "v5p"}},
	{Key: "tpu-v6e", Name: "Google TPU v6e (Trillium)", Peaks: p(0, 0, 918, 0, 0), Source: "Google Cloud TPU v6e documentation: 918 TFLOPS BF16 per chip", match: []string{"tpu", "v6e"}},
}

// GPUs returns the peak table.
func GPUs() []GPU { return slices.Clone(gpus) }

func tokens(s string) []string {
	s = strings.ToLower(s)
	s = strings.NewReplacer("trillium", "tpu v6e", "v5litepod", "tpu v5e", "v5lite", "tpu v5e").Replace(s)
	return strings.FieldsFunc(s, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') })
}

// LookupGPU finds the table entry for a GPU key ("h100-sxm") or a name as
// NVML reports it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB").
// An unknown GPU is an error: a wrong peak is worse than none.
func LookupGPU(name string) (GPU, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	for _, g := range gpus {
		if n == g.Key {
			return g, nil
		}
	}
	toks := tokens(name)
	for _, g := range gpus {
		if containsAll(toks, g.match) {
			return g, nil
		}
	}
	keys := make([]string, len(gpus))
	for i, g := range gpus {
		keys[i] = g.Key
	}
	return GPU{}, fmt.Errorf("%w %q: known GPUs are %s; for another, give its dense peak with --peak-tflops", ErrUnknownGPU, name, strings.Join(keys, ", "))
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// PeakConvention says what an MFU against dt's peak means, for mixed
// precision and FP8 training, where the choice of peak sets the figure.
func PeakConvention(dt DType) string {
	switch dt {
	case FP8:
		return "MFU against the dense FP8 peak: the share of FP8 tensor throughput used; FP8 peaks are twice the BF16 ones, so the figure is about half the BF16-peak MFU and not comparable with BF16 runs"
	case FP4:
		return "MFU against the dense FP4 peak: the share of FP4 tensor throughput used; not comparable with BF16 or FP8 runs"
	case BF16, FP16, "":
		return "MFU against the dense BF16/FP16 peak (the default, also for FP8 and mixed-precision training, as most published MFU figures are): comparable across precisions; --dtype fp8 rates FP8 training against the FP8 peak"
	}
	return fmt.Sprintf("MFU against the dense %s peak", dt)
}
