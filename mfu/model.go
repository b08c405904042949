package mfu

import (
	"errors"
	"fmt"
	"math"
)

// Attention is the causal-attention FLOPs convention.
type Attention string

// Attention conventions.
const (
	AttentionFull   Attention = "full"   // whole score matrix (PaLM, Megatron 2021)
	AttentionCausal Attention = "causal" // only the unmasked half
)

// Recompute is the activation-recompute policy, for hardware FLOPs.
type Recompute string

// Recompute policies.
const (
	RecomputeNone      Recompute = "none"
	RecomputeSelective Recompute = "selective"
	RecomputeFull      Recompute = "full"
)

// Sentinel errors, wrapped with detail.
var (
	ErrBadModel      = errors.New("mfu: invalid model")
	ErrUnknownGPU    = errors.New("mfu: unknown GPU")
	ErrNoPeak        = errors.New("mfu: no peak figure")
	ErrImpossibleMFU = errors.New("mfu: utilisation above 100%")
	ErrBadInput      = errors.New("mfu: invalid input")
)

// Model is a decoder-only transformer's shape, or a bare parameter count.
// Sizes left zero take their usual defaults (KVHeads = Heads, HeadDim =
// Hidden/Heads, MoEFFN = FFN, TopK = 1 for MoE).
type Model struct {
	Name    string `json:"name,omitempty"`
	Layers  int    `json:"layers,omitempty"`
	Hidden  int    `json:"hidden,omitempty"`
	Heads   int    `json:"heads,omitempty"`
	KVHeads int    `json:"kv_heads,omitempty"`
	HeadDim int    `json:"head_dim,omitempty"`
	FFN     int    `json:"ffn,omitempty"`
	// Gated is a three-matrix FFN (SwiGLU, GeGLU) instead of two.
	Gated bool `json:"gated,omitempty"`
	Vocab int  `json:"vocab,omitempty"`
	// Tied shares the input embedding and output projection weights. The
	// output projection's matmul is counted either way.
	Tied bool `json:"tied,omitempty"`

	// Mixture of experts: routed experts, experts per token, always-on shared
	// experts, the expert FFN size, and the number of leading dense layers.
	Experts       int `json:"experts,omitempty"`
	TopK          int `json:"top_k,omitempty"`
	SharedExperts int `json:"shared_experts,omitempty"`
	MoEFFN        int `json:"moe_ffn,omitempty"`
	DenseLayers   int `json:"dense_layers,omitempty"`

	// Seq is the training sequence length, which sets the attention term.
	Seq int `json:"seq,omitempty"`

	// Params is a bare parameter count, used when no shape is given. With
	// Layers, Heads, HeadDim and Seq it also gets the attention term.
	Params float64 `json:"params,omitempty"`
}

// HasShape reports whether the model is given by its shape rather than a
// bare parameter count.
func (m Model) HasShape() bool { return m.Hidden > 0 }

func (m Model) withDefaults() Model {
	if m.KVHeads == 0 {
		m.KVHeads = m.Heads
	}
	if m.HeadDim == 0 && m.Heads > 0 {
		m.HeadDim = m.Hidden / m.Heads
	}
	if m.Experts > 0 {
		if m.TopK == 0 {
			m.TopK = 1
		}
		if m.MoEFFN == 0 {
			m.MoEFFN = m.FFN
		}
	}
	return m
}

// Validate checks that the model is complete and consistent.
func (m Model) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadModel, fmt.Sprintf(format, args...))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", m.Layers}, {"hidden", m.Hidden}, {"heads", m.Heads}, {"kv-heads", m.KVHeads}, {"head-dim", m.HeadDim},
		{"ffn", m.FFN}, {"vocab", m.Vocab}, {"experts", m.Experts}, {"top-k", m.TopK}, {"shared-experts", m.SharedExperts},
		{"moe-ffn", m.MoEFFN}, {"dense-layers", m.DenseLayers}, {"seq", m.Seq}} {
		if f.v < 0 {
			return bad("%s=%d must not be negative", f.name, f.v)
		}
		if f.v > 1<<30 {
			return bad("%s=%d is absurdly large", f.name, f.v)
		}
	}
	if math.IsNaN(m.Params) || math.IsInf(m.Params, 0) || m.Params < 0 {
		return bad("params=%g must be a positive number", m.Params)
	}
	if !m.HasShape() {
		if m.Params <= 0 {
			return bad("give a preset, a config file, a shape (--layers --hidden --heads --ffn --vocab) or --params")
		}
		if m.Layers > 0 || m.Heads > 0 || m.HeadDim > 0 {
			if m.Layers == 0 || m.Heads == 0 || m.HeadDim == 0 {
				return bad("with --params, the attention term needs all of --layers, --heads and --head-dim (or none of them)")
			}
		}
		return nil
	}
	if m.Params > 0 {
		return bad("give either a shape or --params, not both (params=%g with hidden=%d)", m.Params, m.Hidden)
	}
	d := m.withDefaults()
	switch {
	case d.Layers == 0:
		return bad("layers is required with a shape")
	case d.Heads == 0:
		return bad("heads is required with a shape")
	case d.FFN == 0 && d.MoEFFN == 0:
		return bad("ffn is required with a shape")
	case d.Vocab == 0:
		return bad("vocab is required with a shape")
	case d.HeadDim == 0:
		return bad("head-dim is zero: hidden=%d over heads=%d", d.Hidden, d.Heads)
	case d.KVHeads > d.Heads || d.Heads%d.KVHeads != 0:
		return bad("kv-heads=%d must divide heads=%d", d.KVHeads, d.Heads)
	case d.Experts == 0 && (d.TopK > 0 || d.SharedExperts > 0 || d.DenseLayers > 0):
		return bad("top-k, shared-experts and dense-layers need --experts")
	case d.Experts > 0 && d.TopK > d.Experts:
		return bad("top-k=%d exceeds experts=%d", d.TopK, d.Experts)
	case d.DenseLayers > d.Layers:
		return bad("dense-layers=%d exceeds layers=%d", d.DenseLayers, d.Layers)
	case d.DenseLayers > 0 && d.FFN == 0:
		return bad("dense-layers need the dense ffn size")
	}
	return nil
}

// Counts are a model's parameter and FLOPs figures. FLOPs are per token of
// training (forward and backward).
type Counts struct {
	ParamsTotal  float64 `json:"params_total"`
	ParamsActive float64 `json:"params_active"`
	// MatmulParams are the parameters a token multiplies with, the output
	// projection included (the N of 6N).
	MatmulParams float64 `json:"matmul_params"`
	// DenseFLOPsPerToken is 6 × MatmulParams.
	DenseFLOPsPerToken float64 `json:"dense_flops_per_token"`
	// AttentionFLOPsPerToken is the score term under the chosen convention.
	AttentionFLOPsPerToken float64 `json:"attention_flops_per_token"`
	// FLOPsPerToken is the model FLOPs (dense + attention), the MFU basis.
	FLOPsPerToken float64 `json:"flops_per_token"`
	// HWFLOPsPerToken adds recomputed work, the HFU basis.
	HWFLOPsPerToken float64   `json:"hw_flops_per_token"`
	Attention       Attention `json:"attention"`
	Recompute       Recompute `json:"recompute"`
}

// Count computes parameters and FLOPs per token.
func (m Model) Count(att Attention, rc Recompute) (Counts, error) {
	if err := m.Validate(); err != nil {
		return Counts{}, err
	}
	switch att {
	case "":
		att = AttentionFull
	case AttentionFull, AttentionCausal:
	default:
		return Counts{}, fmt.Errorf("%w: attention %q: want full or causal", ErrBadInput, att)
	}
	switch rc {
	case "":
		rc = RecomputeNone
	case RecomputeNone, RecomputeSelective, RecomputeFull:
	default:
		return Counts{}, fmt.Errorf("%w: recompute %q: want none, selective or full", ErrBadInput, rc)
	}
	d := m.withDefaults()
	c := Counts{Attention: att, Recompute: rc}
	attnFactor := 1.0
	if att == AttentionCausal {
		attnFactor = 0.5
	}
	// Attention scores and weighted sum, forward: 2·T·H·Q each per layer per token.
	attnFwd := 4 * float64(d.Layers) * float64(d.Seq) * float64(d.Heads) * float64(d.HeadDim) * attnFactor

	var layerMatmul float64 // matmul params inside the layers, active per token
	if !m.HasShape() {
		c.ParamsTotal, c.ParamsActive, c.MatmulParams = m.Params, m.Params, m.Params
		layerMatmul = m.Params
	} else {
		h, L := float64(d.Hidden), float64(d.Layers)
		qDim, kvDim := float64(d.Heads*d.HeadDim), float64(d.KVHeads*d.HeadDim)
		attn := h*qDim + 2*h*kvDim + qDim*h
		mats := 2.0
		if d.Gated {
			mats = 3
		}
		dense := mats * h * float64(d.FFN)
		norms := 2 * h
		perLayerTotal, perLayerActive := attn+dense, attn+dense
		if d.Experts > 0 {
			expert := mats * h * float64(d.MoEFFN)
			router := h * float64(d.Experts)
			moeL, denseL := L-float64(d.DenseLayers), float64(d.DenseLayers)
			total := attn*L + dense*denseL + moeL*(float64(d.Experts+d.SharedExperts)*expert+router)
			active := attn*L + dense*denseL + moeL*(float64(d.TopK+d.SharedExperts)*expert+router)
			perLayerTotal, perLayerActive = total/L, active/L
		}
		emb := float64(d.Vocab) * h
		head := emb
		if d.Tied {
			head = 0
		}
		c.ParamsTotal = L*(perLayerTotal+norms) + h + emb + head
		c.ParamsActive = L*(perLayerActive+norms) + h + emb + head
		layerMatmul = L * perLayerActive
		c.MatmulParams = layerMatmul + emb // output projection: always a matmul
	}
	c.DenseFLOPsPerToken = 6 * c.MatmulParams
	c.AttentionFLOPsPerToken = 3 * attnFwd
	c.FLOPsPerToken = c.DenseFLOPsPerToken + c.AttentionFLOPsPerToken
	c.HWFLOPsPerToken = c.FLOPsPerToken
	switch rc {
	case RecomputeSelective:
		c.HWFLOPsPerToken += attnFwd
	case RecomputeFull:
		c.HWFLOPsPerToken += 2*layerMatmul + attnFwd
	}
	return c, nil
}
