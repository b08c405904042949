package mfu

import (
	"math"
	"testing"
)

// config.json of deepseek-ai/DeepSeek-V3 on Hugging Face (the keys this
// package reads, values as published).
const deepseekV3 = `{"model_type": "deepseek_v3", "hidden_size": 7168, "num_hidden_layers": 61,
 "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
 "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
 "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
 "num_nextn_predict_layers": 1, "vocab_size": 129280, "tie_word_embeddings": false, "hidden_act": "silu",
 "max_position_embeddings": 163840}`

// config.json of moonshotai/Kimi-K2-Instruct (DeepSeek-V3 architecture).
const kimiK2 = `{"model_type": "kimi_k2", "hidden_size": 7168, "num_hidden_layers": 61,
 "num_attention_heads": 64, "num_key_value_heads": 64, "intermediate_size": 18432, "moe_intermediate_size": 2048,
 "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1, "moe_layer_freq": 1,
 "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
 "num_nextn_predict_layers": 0, "vocab_size": 163840, "tie_word_embeddings": false, "hidden_act": "silu"}`

// config.json of google/gemma-2-9b.
const gemma2_9b = `{"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
 "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000, "sliding_window": 4096,
 "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true}`

// config.json of mistralai/Mistral-7B-v0.1.
const mistral7b = `{"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "sliding_window": 4096,
 "hidden_act": "silu", "tie_word_embeddings": false}`

func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol*want {
		t.Errorf("%s = %.4g, want %.4g ± %.1f%%", what, got, want, 100*tol)
	}
}

func count(t *testing.T, cfg string, seq int, att Attention) (Model, Counts) {
	t.Helper()
	m, err := FromHFConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	m.Seq = seq
	c, err := m.Count(att, RecomputeNone)
	if err != nil {
		t.Fatal(err)
	}
	return m, c
}

// DeepSeek-V3 Technical Report (arXiv:2412.19437), abstract: 671B total
// parameters, 37B activated per token. The Hugging Face model card: 685B
// with the multi-token-prediction module's 14B (its own weights, plus the
// copies of the shared embedding and head the checkpoint carries).
func TestDeepSeekV3(t *testing.T) {
	m, c := count(t, deepseekV3, 4096, AttentionCausal)
	within(t, "total parameters", c.ParamsTotal, 671e9, 0.01)
	within(t, "activated parameters", c.ParamsActive, 37e9, 0.03)
	emb := float64(m.Vocab * m.Hidden)
	within(t, "MTP module with its embedding and head copies", c.ParamsMTP+2*emb, 14e9, 0.05)
	// FLOPs: 6 × (activated matmul parameters, with the MTP layer and the
	// head's second pass) + attention over 61 + 1 layers, 128 heads of
	// 192 + 128 dims, causal 4096: 3 × 2 × 2048 × 128 × 320 × 62
	wantAttn := 3 * 2 * 2048.0 * 128 * 320 * 62
	within(t, "attention FLOPs/token", c.AttentionFLOPsPerToken, wantAttn, 1e-9)
	if c.MatmulParams < c.ParamsActive || c.MatmulParams > c.ParamsActive+c.ParamsMTP+emb {
		t.Errorf("matmul params %.4g outside [active %.4g, active + MTP + head]", c.MatmulParams, c.ParamsActive)
	}
}

// Kimi K2 technical report (arXiv:2507.20534): 1.04T total parameters,
// 32B activated.
func TestKimiK2(t *testing.T) {
	_, c := count(t, kimiK2, 4096, AttentionCausal)
	within(t, "total parameters", c.ParamsTotal, 1.04e12, 0.02)
	within(t, "activated parameters", c.ParamsActive, 32e9, 0.04)
}

// Gemma 2 (Gemma Team 2024, arXiv:2408.00118, table 2): the 9B model has
// 8,324,201,984 non-embedding and 917,962,752 embedding parameters;
// sliding-window attention (4,096) in every other layer.
func TestGemma2SlidingWindow(t *testing.T) {
	m, c := count(t, gemma2_9b, 8192, AttentionFull)
	within(t, "parameters", c.ParamsTotal, 8_324_201_984+917_962_752, 0.001)
	if m.Window != 4096 || m.WindowLayers != 21 {
		t.Fatalf("window %d on %d layers, want 4096 on 21", m.Window, m.WindowLayers)
	}
	// full convention: 21 global layers charge 8,192 keys, 21 local ones
	// 4,096; 16 heads × (256 + 256)
	want := 3 * 2 * 16 * 512.0 * (21*8192 + 21*4096)
	within(t, "attention FLOPs/token", c.AttentionFLOPsPerToken, want, 1e-9)
	// causal: global T/2, local W − W²/2T = 4096 − 4096²/16384 = 3072
	_, cc := count(t, gemma2_9b, 8192, AttentionCausal)
	within(t, "causal attention FLOPs/token", cc.AttentionFLOPsPerToken, 3*2*16*512.0*(21*4096+21*3072), 1e-9)
}

// Mistral 7B (Jiang et al. 2023, arXiv:2310.06825): 7.24B parameters
// (the model card's figure), a 4,096 window in every layer: at 4,096 or
// fewer tokens the window changes nothing, at 32k it caps the span.
func TestMistralWindow(t *testing.T) {
	_, c := count(t, mistral7b, 32768, AttentionFull)
	within(t, "parameters", c.ParamsTotal, 7.24e9, 0.005)
	within(t, "attention FLOPs/token at 32k", c.AttentionFLOPsPerToken, 3*2*32*256.0*32*4096, 1e-9)
	_, short := count(t, mistral7b, 4096, AttentionFull)
	within(t, "attention FLOPs/token at 4k", short.AttentionFLOPsPerToken, 3*2*32*256.0*32*4096, 1e-9)
}

// Latent attention needs its head dims; its keys are refused without
// kv_lora_rank.
func TestLatentAttentionValidation(t *testing.T) {
	bad := []Model{
		{Layers: 2, Hidden: 64, Heads: 4, FFN: 128, Vocab: 100, KVLoRARank: 16},
		{Layers: 2, Hidden: 64, Heads: 4, FFN: 128, Vocab: 100, QKRopeDim: 8},
		{Layers: 2, Hidden: 64, Heads: 4, FFN: 128, Vocab: 100, WindowLayers: 1},
		{Layers: 2, Hidden: 64, Heads: 4, FFN: 128, Vocab: 100, Window: 16, WindowLayers: 3},
	}
	for i, m := range bad {
		if err := m.Validate(); err == nil {
			t.Errorf("model %d accepted: %+v", i, m)
		}
	}
}

// The GPUs added for the FLOPs issue resolve from the names NVML reports.
func TestNewGPUNames(t *testing.T) {
	for name, key := range map[string]string{
		"NVIDIA H800": "h800", "NVIDIA H800 PCIe": "h800-pcie", "NVIDIA A800-SXM4-80GB": "a800", "NVIDIA L20": "l20",
		"NVIDIA H20": "h20", "NVIDIA GB300": "gb300", "AMD Instinct MI300A": "mi300a", "AMD Instinct MI250": "mi250",
		"AMD Instinct MI250X": "mi250x", "NVIDIA L40S": "l40s", "NVIDIA L4": "l4",
	} {
		g, err := LookupGPU(name)
		if err != nil || g.Key != key {
			t.Errorf("%q: got %q (%v), want %s", name, g.Key, err, key)
		}
	}
	// an H800 trains at the H100 SXM's dense BF16 peak
	g, _ := LookupGPU("h800")
	if p, _ := g.Peak(BF16); p != 989.4e12 {
		t.Errorf("h800 bf16 peak %g", p)
	}
}
