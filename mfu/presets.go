package mfu

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// presets are published model shapes. Seq is the pre-training sequence
// length the model's paper reports; override it for other runs.
var presets = map[string]Model{
	// Llama 3 herd (Dubey et al. 2024, table 3), seq 8192.
	"llama3-8b":   {Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, FFN: 14336, Gated: true, Vocab: 128256, Seq: 8192},
	"llama3-70b":  {Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8, HeadDim: 128, FFN: 28672, Gated: true, Vocab: 128256, Seq: 8192},
	"llama3-405b": {Layers: 126, Hidden: 16384, Heads: 128, KVHeads: 8, HeadDim: 128, FFN: 53248, Gated: true, Vocab: 128256, Seq: 8192},
	// GPT-3 (Brown et al. 2020, table 2.1), tied embeddings, seq 2048.
	"gpt3-175b": {Layers: 96, Hidden: 12288, Heads: 96, HeadDim: 128, FFN: 49152, Vocab: 50257, Tied: true, Seq: 2048},
	// Mixtral 8x7B (Jiang et al. 2024): 8 experts, top-2. Seq 4096 is a
	// common training length; the model's context is 32768.
	"mixtral-8x7b": {Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, FFN: 14336, Gated: true, Vocab: 32000, Experts: 8, TopK: 2, Seq: 4096},
	// PaLM 540B (Chowdhery et al. 2022, table 1): multi-query, SwiGLU, tied, seq 2048.
	"palm-540b": {Layers: 118, Hidden: 18432, Heads: 48, KVHeads: 1, HeadDim: 256, FFN: 73728, Gated: true, Vocab: 256000, Tied: true, Seq: 2048},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Preset returns a published model shape by name (case-insensitive).
func Preset(name string) (Model, error) {
	m, ok := presets[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Model{}, fmt.Errorf("%w: no preset %q; presets: %s", ErrBadModel, name, strings.Join(PresetNames(), ", "))
	}
	m.Name = strings.ToLower(name)
	return m, nil
}

// hfConfig holds the keys of Hugging Face config.json files this package reads:
// Llama, Mistral, Mixtral, Qwen2/Qwen3 (dense and MoE) and GPT-2 style names.
type hfConfig struct {
	ModelType       string `json:"model_type"`
	HiddenSize      int    `json:"hidden_size"`
	Layers          int    `json:"num_hidden_layers"`
	Heads           int    `json:"num_attention_heads"`
	KVHeads         int    `json:"num_key_value_heads"`
	HeadDim         int    `json:"head_dim"`
	Intermediate    int    `json:"intermediate_size"`
	Vocab           int    `json:"vocab_size"`
	Tied            *bool  `json:"tie_word_embeddings"`
	HiddenAct       string `json:"hidden_act"`
	LocalExperts    int    `json:"num_local_experts"` // Mixtral
	NumExperts      int    `json:"num_experts"`       // Qwen MoE
	ExpertsPerTok   int    `json:"num_experts_per_tok"`
	MoEIntermediate int    `json:"moe_intermediate_size"`
	SharedIntermed  int    `json:"shared_expert_intermediate_size"`
	MaxPositions    int    `json:"max_position_embeddings"`
	NEmbd           int    `json:"n_embd"` // GPT-2 style
	NLayer          int    `json:"n_layer"`
	NHead           int    `json:"n_head"`
	NInner          *int   `json:"n_inner"`
	// DeepSeek-V2/V3 and Kimi K2: latent attention, routed and shared
	// experts, leading dense layers, multi-token prediction
	QLoRARank       int      `json:"q_lora_rank"`
	KVLoRARank      int      `json:"kv_lora_rank"`
	QKNopeDim       int      `json:"qk_nope_head_dim"`
	QKRopeDim       int      `json:"qk_rope_head_dim"`
	VHeadDim        int      `json:"v_head_dim"`
	RoutedExperts   int      `json:"n_routed_experts"`
	SharedExperts   int      `json:"n_shared_experts"`
	FirstKDense     int      `json:"first_k_dense_replace"`
	MoELayerFreq    int      `json:"moe_layer_freq"`
	NextNLayers     int      `json:"num_nextn_predict_layers"`
	SlidingWindow   *int     `json:"sliding_window"`
	UseSliding      *bool    `json:"use_sliding_window"`
	MaxWindowLayers int      `json:"max_window_layers"`      // Qwen2: layers from this index on use the window
	WindowPattern   int      `json:"sliding_window_pattern"` // Gemma 3: every Nth layer is global
	LayerTypes      []string `json:"layer_types"`
}

// FromHFConfig reads a Hugging Face config.json. The training sequence
// length is not in such a file (max_position_embeddings is the model's limit,
// not the length it is trained at), so Seq is left zero for the caller to set.
func FromHFConfig(data []byte) (Model, error) {
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return Model{}, fmt.Errorf("%w: config.json: %v", ErrBadModel, err)
	}
	if c.MoELayerFreq > 1 {
		return Model{}, fmt.Errorf("%w: config.json has moe_layer_freq %d (a sparse layer every %d): not modelled; give the shape by flags", ErrBadModel, c.MoELayerFreq, c.MoELayerFreq)
	}
	m := Model{Name: c.ModelType}
	if c.NEmbd > 0 && c.HiddenSize == 0 { // GPT-2 style
		m.Hidden, m.Layers, m.Heads, m.Vocab, m.Tied = c.NEmbd, c.NLayer, c.NHead, c.Vocab, true
		m.FFN = 4 * c.NEmbd
		if c.NInner != nil && *c.NInner > 0 {
			m.FFN = *c.NInner
		}
	} else {
		c.shape(&m)
	}
	if m.Hidden == 0 || m.Layers == 0 || m.Heads == 0 || m.Vocab == 0 {
		return Model{}, fmt.Errorf("%w: config.json lacks hidden_size, num_hidden_layers, num_attention_heads or vocab_size", ErrBadModel)
	}
	if err := m.Validate(); err != nil {
		return Model{}, err
	}
	return m, nil
}

// shape reads a Llama-style config's shape into m: attention (latent
// attention too), FFN, experts, multi-token prediction and windows.
func (c hfConfig) shape(m *Model) {
	m.Hidden, m.Layers, m.Heads, m.KVHeads, m.HeadDim = c.HiddenSize, c.Layers, c.Heads, c.KVHeads, c.HeadDim
	m.FFN, m.Vocab = c.Intermediate, c.Vocab
	if c.Tied != nil {
		m.Tied = *c.Tied
	}
	m.Gated = c.gated()
	if c.KVLoRARank > 0 {
		m.QLoRARank, m.KVLoRARank, m.QKNopeDim, m.QKRopeDim, m.VHeadDim = c.QLoRARank, c.KVLoRARank, c.QKNopeDim, c.QKRopeDim, c.VHeadDim
		m.KVHeads, m.HeadDim = 0, 0
		m.Gated = true
	}
	m.MTPLayers = c.NextNLayers
	m.Window, m.WindowLayers = windowOf(c)
	c.experts(m)
}

// gated is whether the FFN is gated: Llama, Mistral and Qwen FFNs are
// (SwiGLU) whatever hidden_act says.
func (c hfConfig) gated() bool {
	return strings.Contains(strings.ToLower(c.HiddenAct), "glu") ||
		slices.Contains([]string{"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3", "gemma3_text", "olmo", "olmo2", "deepseek_v2", "deepseek_v3", "kimi_k2"}, c.ModelType) ||
		c.HiddenAct == "silu"
}

// experts reads the experts of a mixture-of-experts config into m.
func (c hfConfig) experts(m *Model) {
	experts := max(c.LocalExperts, c.NumExperts, c.RoutedExperts)
	switch {
	case c.RoutedExperts > 0:
		// DeepSeek: n_shared_experts of the routed experts' width, the
		// first first_k_dense_replace layers dense (intermediate_size)
		m.Experts, m.TopK, m.MoEFFN = c.RoutedExperts, c.ExpertsPerTok, c.MoEIntermediate
		m.SharedExperts, m.DenseLayers = c.SharedExperts, c.FirstKDense
		if m.DenseLayers == 0 {
			m.FFN = 0
		}
	case experts > 0:
		m.Experts, m.TopK = experts, c.ExpertsPerTok
		m.MoEFFN = c.MoEIntermediate
		if m.MoEFFN == 0 {
			m.MoEFFN = c.Intermediate
		}
		if c.SharedIntermed > 0 && m.MoEFFN > 0 {
			// A shared expert of its own width counts as that many expert widths.
			m.SharedExperts = (c.SharedIntermed + m.MoEFFN/2) / m.MoEFFN
		}
		if c.MoEIntermediate > 0 {
			// Qwen MoE: every layer is sparse; intermediate_size is unused.
			m.FFN = 0
		}
	}
}

// windowOf reads which layers use a sliding window: layer_types when the
// file lists them; Gemma 2 alternates local and global layers; Gemma 3
// makes every sliding_window_pattern-th layer global; Qwen2/3 use the
// window only with use_sliding_window, from max_window_layers on; other
// models with a sliding_window (Mistral) use it in every layer.
func windowOf(c hfConfig) (window, layers int) {
	if c.SlidingWindow == nil || *c.SlidingWindow <= 0 {
		return 0, 0
	}
	w := *c.SlidingWindow
	if len(c.LayerTypes) > 0 {
		for _, t := range c.LayerTypes {
			if strings.Contains(t, "sliding") {
				layers++
			}
		}
		return w, layers
	}
	switch {
	case c.UseSliding != nil && !*c.UseSliding:
		return 0, 0
	case c.UseSliding != nil && *c.UseSliding:
		return w, max(c.Layers-c.MaxWindowLayers, 0)
	case c.ModelType == "gemma2":
		return w, (c.Layers + 1) / 2 // even layers
	case c.WindowPattern > 0:
		return w, c.Layers - c.Layers/c.WindowPattern
	}
	return w, c.Layers
}
