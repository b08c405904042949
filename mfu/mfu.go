package mfu

import (
	"fmt"
	"math"
)

// Inputs are what utilisation is computed from.
type Inputs struct {
	Model     Model
	Attention Attention
	Recompute Recompute
	// TokensPerSec is the cluster-wide training throughput, tokens counted
	// once per data-parallel replica.
	TokensPerSec float64
	GPUs         int
	// PeakFLOPS is one GPU's dense peak at the training dtype, in FLOP/s.
	PeakFLOPS float64
}

// Result is utilisation and the throughput figures behind it.
type Result struct {
	Counts
	TokensPerSec       float64 `json:"tokens_per_sec"`
	TokensPerSecPerGPU float64 `json:"tokens_per_sec_per_gpu"`
	TFLOPSPerGPU       float64 `json:"tflops_per_gpu"`
	HWTFLOPSPerGPU     float64 `json:"hw_tflops_per_gpu"`
	MFU                float64 `json:"mfu"`
	HFU                float64 `json:"hfu"`
	PeakTFLOPS         float64 `json:"peak_tflops"`
}

func positive(name string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return fmt.Errorf("%w: %s = %g must be a positive number", ErrBadInput, name, v)
	}
	return nil
}

// Compute returns MFU and HFU. A utilisation above 100% is not a result but
// an error in the inputs, and is returned as ErrImpossibleMFU with the
// inputs most likely to be wrong.
func Compute(in Inputs) (Result, error) {
	c, err := in.Model.Count(in.Attention, in.Recompute)
	if err != nil {
		return Result{}, err
	}
	if err := positive("tokens/s", in.TokensPerSec); err != nil {
		return Result{}, err
	}
	if in.GPUs <= 0 {
		return Result{}, fmt.Errorf("%w: GPU count %d must be positive", ErrBadInput, in.GPUs)
	}
	if err := positive("peak FLOP/s", in.PeakFLOPS); err != nil {
		return Result{}, err
	}
	r := Result{Counts: c, TokensPerSec: in.TokensPerSec, PeakTFLOPS: in.PeakFLOPS / 1e12}
	r.TokensPerSecPerGPU = in.TokensPerSec / float64(in.GPUs)
	r.TFLOPSPerGPU = r.TokensPerSecPerGPU * c.FLOPsPerToken / 1e12
	r.HWTFLOPSPerGPU = r.TokensPerSecPerGPU * c.HWFLOPsPerToken / 1e12
	r.MFU = r.TFLOPSPerGPU * 1e12 / in.PeakFLOPS
	r.HFU = r.HWTFLOPSPerGPU * 1e12 / in.PeakFLOPS
	if r.HFU > 1 {
		what := "MFU"
		v := r.MFU
		if r.MFU <= 1 {
			what, v = "HFU", r.HFU
		}
		return r, fmt.Errorf("%w: %s = %.1f%% (%.0f TFLOP/s per GPU against a peak of %.0f): check that tokens/s is cluster-wide and counted once per data-parallel replica (not summed over TP/PP/CP ranks), that the GPU count is the whole job's, the model size, and that the peak is for the dtype you train in",
			ErrImpossibleMFU, what, 100*v, r.HWTFLOPSPerGPU, r.PeakTFLOPS)
	}
	return r, nil
}

// TokensPerSecForMFU is the inverse: the cluster tokens/s that a given MFU
// means for this model, GPU count and peak.
func TokensPerSecForMFU(m Model, att Attention, mfu float64, gpus int, peakFLOPS float64) (float64, error) {
	if err := positive("mfu", mfu); err != nil {
		return 0, err
	}
	if mfu > 1 {
		return 0, fmt.Errorf("%w: target MFU %g is above 1 (give a fraction: 0.4 for 40%%)", ErrImpossibleMFU, mfu)
	}
	if gpus <= 0 {
		return 0, fmt.Errorf("%w: GPU count %d must be positive", ErrBadInput, gpus)
	}
	if err := positive("peak FLOP/s", peakFLOPS); err != nil {
		return 0, err
	}
	c, err := m.Count(att, RecomputeNone)
	if err != nil {
		return 0, err
	}
	return mfu * float64(gpus) * peakFLOPS / c.FLOPsPerToken, nil
}
