// Package mfu counts a transformer's parameters and FLOPs per token, holds the
// table of dense peak FLOP/s per accelerator and dtype, and turns throughput
// into model and hardware FLOPs utilisation (MFU, HFU).
//
// It owns the FLOP formulas and the peak table, each figure with its
// published source in the tests. It never measures and does no I/O.
//
// Conventions, printed by every tool that uses them:
//
//   - Model FLOPs per token = 6 × (matmul parameters a token touches, the
//     output projection included, the embedding lookup excluded) + the
//     attention-score term 12·L·H·Q·T (PaLM, Chowdhery et al. 2022, app. B;
//     Narayanan et al. 2021). Norms, biases, softmax and activations are left
//     out, as in those papers.
//   - Attention "full" counts the whole T×T score matrix (PaLM, Megatron 2021);
//     "causal" halves that term, counting only the unmasked half.
//   - Hardware FLOPs add what activation recompute re-executes: "selective"
//     re-runs the attention core (Korthikanti et al. 2022), "full" re-runs every
//     layer's forward pass. HFU uses them; MFU never does.
//   - Peaks are dense (no 2:4 sparsity) and per GPU (or per TPU chip).
//
// A typical call:
//
//	m, _ := mfu.Preset("llama3-8b")
//	gpu, _ := mfu.LookupGPU("NVIDIA H100 80GB HBM3")
//	peak, _ := gpu.Peak(mfu.BF16)
//	r, _ := mfu.Compute(mfu.Inputs{Model: m, TokensPerSec: 1.2e6, GPUs: 128, PeakFLOPS: peak})
//	fmt.Printf("MFU %.1f%%\n", 100*r.MFU)
package mfu
