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

	// Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): queries and
	// keys/values go through low-rank projections (QLoRARank 0: a full
	// query projection); each head's query/key has QKNopeDim + QKRopeDim
	// dimensions and its value VHeadDim (default QKNopeDim). KVLoRARank > 0
	// selects MLA; KVHeads and HeadDim are then unused.
	QLoRARank  int `json:"q_lora_rank,omitempty"`
	KVLoRARank int `json:"kv_lora_rank,omitempty"`
	QKNopeDim  int `json:"qk_nope_head_dim,omitempty"`
	QKRopeDim  int `json:"qk_rope_head_dim,omitempty"`
	VHeadDim   int `json:"v_head_dim,omitempty"`

	// MTPLayers are multi-token-prediction modules (DeepSeek-V3): each a
	// transformer layer (sparse when the model is), a 2h×h projection,
	// and a second pass through the shared output head. Their FLOPs count;
	// their weights are reported apart (Counts.ParamsMTP), as published
	// totals leave them out.
	MTPLayers int `json:"mtp_layers,omitempty"`

	// Window is a sliding-attention window (Mistral, Gemma 2/3) used by
	// WindowLayers of the layers (default all of them when Window > 0):
	// those layers attend to at most Window keys (see Count).
	Window       int `json:"sliding_window,omitempty"`
	WindowLayers int `json:"window_layers,omitempty"`

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
	if m.KVLoRARank > 0 && m.VHeadDim == 0 {
		m.VHeadDim = m.QKNopeDim
	}
	if m.Window > 0 && m.WindowLayers == 0 {
		m.WindowLayers = m.Layers
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
	if err := m.validateFields(); err != nil {
		return err
	}
	if !m.HasShape() {
		return m.validateParams()
	}
	if m.Params > 0 {
		return badModel("give either a shape or --params, not both (params=%g with hidden=%d)", m.Params, m.Hidden)
	}
	d := m.withDefaults()
	if err := d.validateRequired(); err != nil {
		return err
	}
	return d.validateConsistent()
}

func badModel(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadModel, fmt.Sprintf(format, args...))
}

// validateFields bounds every field.
func (m Model) validateFields() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", m.Layers}, {"hidden", m.Hidden}, {"heads", m.Heads}, {"kv-heads", m.KVHeads}, {"head-dim", m.HeadDim},
		{"ffn", m.FFN}, {"vocab", m.Vocab}, {"experts", m.Experts}, {"top-k", m.TopK}, {"shared-experts", m.SharedExperts},
		{"moe-ffn", m.MoEFFN}, {"dense-layers", m.DenseLayers}, {"seq", m.Seq},
		{"q-lora-rank", m.QLoRARank}, {"kv-lora-rank", m.KVLoRARank}, {"qk-nope-head-dim", m.QKNopeDim}, {"qk-rope-head-dim", m.QKRopeDim},
		{"v-head-dim", m.VHeadDim}, {"mtp-layers", m.MTPLayers}, {"sliding-window", m.Window}, {"window-layers", m.WindowLayers}} {
		if f.v < 0 {
			return badModel("%s=%d must not be negative", f.name, f.v)
		}
		if f.v > 1<<30 {
			return badModel("%s=%d is absurdly large", f.name, f.v)
		}
	}
	if math.IsNaN(m.Params) || math.IsInf(m.Params, 0) || m.Params < 0 {
		return badModel("params=%g must be a positive number", m.Params)
	}
	return nil
}

// validateParams checks a model given by its parameter count alone.
func (m Model) validateParams() error {
	if m.Params <= 0 {
		return badModel("give a preset, a config file, a shape (--layers --hidden --heads --ffn --vocab) or --params")
	}
	if (m.Layers > 0 || m.Heads > 0 || m.HeadDim > 0) && (m.Layers == 0 || m.Heads == 0 || m.HeadDim == 0) {
		return badModel("with --params, the attention term needs all of --layers, --heads and --head-dim (or none of them)")
	}
	return nil
}

// validateRequired checks that a shape (with its defaults) has what every
// count needs, and the attention's dimensions.
func (m Model) validateRequired() error {
	switch {
	case m.Layers == 0:
		return badModel("layers is required with a shape")
	case m.Heads == 0:
		return badModel("heads is required with a shape")
	case m.FFN == 0 && m.MoEFFN == 0:
		return badModel("ffn is required with a shape")
	case m.Vocab == 0:
		return badModel("vocab is required with a shape")
	case m.HeadDim == 0 && m.KVLoRARank == 0:
		return badModel("head-dim is zero: hidden=%d over heads=%d", m.Hidden, m.Heads)
	case m.KVLoRARank > 0 && (m.QKNopeDim+m.QKRopeDim == 0 || m.VHeadDim == 0):
		return badModel("multi-head latent attention needs qk-nope-head-dim, qk-rope-head-dim and v-head-dim")
	case m.KVLoRARank == 0 && (m.QLoRARank > 0 || m.QKNopeDim > 0 || m.QKRopeDim > 0 || m.VHeadDim > 0):
		return badModel("q-lora-rank and the qk/v head dims of latent attention need kv-lora-rank")
	}
	return nil
}

// validateConsistent checks a complete shape's parts against each other.
func (m Model) validateConsistent() error {
	switch {
	case m.WindowLayers > m.Layers:
		return badModel("window-layers=%d exceeds layers=%d", m.WindowLayers, m.Layers)
	case m.WindowLayers > 0 && m.Window == 0:
		return badModel("window-layers needs sliding-window")
	case m.MTPLayers > 16:
		return badModel("mtp-layers=%d: at most 16", m.MTPLayers)
	case m.KVLoRARank == 0 && (m.KVHeads > m.Heads || m.Heads%m.KVHeads != 0):
		return badModel("kv-heads=%d must divide heads=%d", m.KVHeads, m.Heads)
	}
	return m.validateExperts()
}

func (m Model) validateExperts() error {
	switch {
	case m.Experts == 0 && (m.TopK > 0 || m.SharedExperts > 0 || m.DenseLayers > 0):
		return badModel("top-k, shared-experts and dense-layers need --experts")
	case m.Experts > 0 && m.TopK > m.Experts:
		return badModel("top-k=%d exceeds experts=%d", m.TopK, m.Experts)
	case m.DenseLayers > m.Layers:
		return badModel("dense-layers=%d exceeds layers=%d", m.DenseLayers, m.Layers)
	case m.DenseLayers > 0 && m.FFN == 0:
		return badModel("dense-layers need the dense ffn size")
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
	// ParamsMTP are the multi-token-prediction modules' own weights (the
	// embedding and output head they share are not counted again); they
	// are not in ParamsTotal, as published totals leave them out, but
	// their FLOPs are in FLOPsPerToken.
	ParamsMTP float64 `json:"params_mtp,omitempty"`
	// AttentionFLOPsPerSeqSq is the attention term per squared document
	// length, under the chosen convention: a batch of documents of n_i
	// tokens costs Σ n_i² of it instead of the per-token term at the
	// training sequence (packed or variable-length batches). Zero for
	// models with sliding-window layers, where the term is not quadratic.
	AttentionFLOPsPerSeqSq float64 `json:"attention_flops_per_seq_sq,omitempty"`
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
	// Attention scores and weighted sum, forward, per layer per token:
	// 2·span·H·(dqk + dv), span the keys a query is charged for.
	dqk, dv := float64(d.HeadDim), float64(d.HeadDim)
	if d.KVLoRARank > 0 {
		dqk, dv = float64(d.QKNopeDim+d.QKRopeDim), float64(d.VHeadDim)
	}
	T := float64(d.Seq)
	global, local := T, T // keys per query, full convention
	if d.Window > 0 {
		local = min(T, float64(d.Window))
	}
	if att == AttentionCausal {
		// the unmasked part: on average T/2 keys; with a window W < T,
		// min(i, W) averaged over positions i = 1..T, ≈ W − W²/2T
		global = T / 2
		if W := float64(d.Window); d.Window > 0 && W < T {
			local = W - W*W/(2*T)
		} else {
			local = T / 2
		}
	}
	attnLayers := float64(d.Layers + d.MTPLayers)
	windowed := float64(d.WindowLayers)
	attnFwd := 2 * float64(d.Heads) * (dqk + dv) * ((attnLayers-windowed)*global + windowed*local)
	if d.WindowLayers == 0 && d.Heads > 0 {
		// a document of n tokens: n queries × n keys (n/2 causal)
		perSq := 3 * 2 * float64(d.Heads) * (dqk + dv) * attnLayers
		if att == AttentionCausal {
			perSq /= 2
		}
		c.AttentionFLOPsPerSeqSq = perSq
	}

	var layerMatmul float64 // matmul params inside the layers, active per token
	if !m.HasShape() {
		c.ParamsTotal, c.ParamsActive, c.MatmulParams = m.Params, m.Params, m.Params
		layerMatmul = m.Params
	} else {
		h, L := float64(d.Hidden), float64(d.Layers)
		H := float64(d.Heads)
		var attn float64
		norms := 2 * h
		if d.KVLoRARank > 0 {
			// latent attention: low-rank query (or a full one), joint
			// key/value compression with a shared rotary key, per-head
			// up-projections, output projection
			qr, kvr := float64(d.QLoRARank), float64(d.KVLoRARank)
			q := h * H * dqk
			if d.QLoRARank > 0 {
				q = h*qr + qr*H*dqk
			}
			kv := h*(kvr+float64(d.QKRopeDim)) + kvr*H*(float64(d.QKNopeDim)+dv)
			attn = q + kv + H*dv*h
			norms += qr + kvr
		} else {
			qDim, kvDim := H*float64(d.HeadDim), float64(d.KVHeads*d.HeadDim)
			attn = h*qDim + 2*h*kvDim + qDim*h
		}
		mats := 2.0
		if d.Gated {
			mats = 3
		}
		dense := mats * h * float64(d.FFN)
		layerTotal, layerActive := attn+dense, attn+dense // one dense layer
		perLayerTotal, perLayerActive := layerTotal, layerActive
		if d.Experts > 0 {
			expert := mats * h * float64(d.MoEFFN)
			router := h * float64(d.Experts)
			moeL, denseL := L-float64(d.DenseLayers), float64(d.DenseLayers)
			layerTotal = attn + float64(d.Experts+d.SharedExperts)*expert + router
			layerActive = attn + float64(d.TopK+d.SharedExperts)*expert + router
			perLayerTotal = (dense*denseL + attn*denseL + moeL*layerTotal) / L
			perLayerActive = (dense*denseL + attn*denseL + moeL*layerActive) / L
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
		if d.MTPLayers > 0 {
			// each module: its layer, the 2h×h projection of [hidden;
			// embedding], and the shared head's matmul once more
			mtp := float64(d.MTPLayers)
			c.ParamsMTP = mtp * (layerTotal + 2*h*h + norms + 2*h)
			layerMatmul += mtp * (layerActive + 2*h*h)
			c.MatmulParams += mtp * (layerActive + 2*h*h + emb)
		}
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
