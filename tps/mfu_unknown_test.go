package tps

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// dpRecords are one step of world ranks in pure data parallelism, each with
// tokens in durNs.
func dpRecords(world, tokens, durNs int64) []StepRecord {
	var recs []StepRecord
	for r := int64(0); r < world; r++ {
		recs = append(recs, StepRecord{Job: "j", Step: 1, Rank: r, WorldSize: world, Tokens: tokens,
			StartUnixNs: 1e18, EndUnixNs: 1e18 + durNs, DurationNs: durNs})
	}
	return recs
}

// Every rule by which MFU cannot be right leaves it unknown, with the
// reason, in the cluster row and the summary: never a figure above 100%,
// never a silent 0.
func TestMFUUnknownRules(t *testing.T) {
	cases := []struct {
		name  string
		meta  RunMeta
		world int64
		recs  []StepRecord
		why   string
	}{
		{
			// The README's launch line (dp 4 × tp 8 × pp 2 = 64 GPUs) with one
			// rank running: tokens are per rank, MFU was 11789%.
			name: "topology mismatch", world: 1,
			meta: RunMeta{Topology: Topology{DP: 4, TP: 8, PP: 2}, ModelPreset: "llama3-8b", GPU: "h100-sxm"},
			recs: dpRecords(1, 8192, 1e7), why: "topology dp=4 tp=8 pp=2",
		},
		{
			// Tensor-parallel ranks each report the replica's tokens and no
			// topology is given: counted 8 times, MFU far above 100%.
			// llama3-8b ≈ 4.8e10 FLOPs/token × 8 × 65,536 tokens / 0.1 s
			// over 8 × 989 TFLOP/s ≈ 3,200%.
			name: "tokens per rank", world: 8,
			meta: RunMeta{ModelPreset: "llama3-8b", GPU: "h100-sxm"},
			recs: dpRecords(8, 65536, 1e8), why: "above 100%",
		},
		{
			name: "unknown GPU", world: 8,
			meta: RunMeta{ModelPreset: "llama3-8b", GPU: "NVIDIA Foo 9000"},
			recs: dpRecords(8, 1024, 1e9), why: "unknown GPU",
		},
		{
			name: "no model", world: 8,
			meta: RunMeta{GPU: "h100-sxm"},
			recs: dpRecords(8, 1024, 1e9), why: "no model",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _ := tc.meta.AccumulatorConfig(int(tc.world), "")
			c, err := Aggregate(tc.recs, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if c.MFU != 0 || c.HFU != 0 || !strings.Contains(c.MFUUnknown, tc.why) {
				t.Fatalf("cluster row: MFU %v HFU %v, unknown %q; want 0 and a reason with %q", c.MFU, c.HFU, c.MFUUnknown, tc.why)
			}
			s := Summarize([]ClusterStep{c, c}, WindowOptions{Warmup: 0})
			if s.MFU != nil || !strings.Contains(s.MFUUnknown, tc.why) {
				t.Fatalf("summary: MFU %v, unknown %q", s.MFU, s.MFUUnknown)
			}
			b, _ := json.Marshal(s)
			if !strings.Contains(string(b), `"mfu":null`) || !strings.Contains(string(b), `"hfu":null`) {
				t.Errorf("summary JSON: %s", b)
			}
		})
	}
	// A possible MFU stays: llama3-8b, 8 × H100, 8 × 4,096 tokens in 1 s is
	// 32,768 × ~4.9e10 / (8 × 989e12) ≈ 20%.
	meta := RunMeta{ModelPreset: "llama3-8b", GPU: "h100-sxm"}
	cfg, err := meta.AccumulatorConfig(8, "")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := Aggregate(dpRecords(8, 4096, 1e9), cfg)
	if c.MFUUnknown != "" || c.MFU < 0.15 || c.MFU > 0.25 {
		t.Errorf("possible MFU: %v (%q)", c.MFU, c.MFUUnknown)
	}
	// Rows written before the check (MFU 118 in the Parquet file) are
	// caught when summarised.
	old := c
	old.MFU, old.HFU = 117.9, 117.9
	if s := Summarize([]ClusterStep{old}, WindowOptions{Warmup: 0}); s.MFU != nil || !strings.Contains(s.MFUUnknown, "11790%") {
		t.Errorf("old impossible row: %v %q", s.MFU, s.MFUUnknown)
	}
}

// Packed batches: a record giving Σ document length² gets the exact
// attention term. llama3-8b (full convention): 6 × 32 heads × 256 × 32
// layers = 1,572,864 FLOPs per squared token; 8,192 tokens as 8 documents
// of 1,024 cost 8 × 1,024² of it, an eighth of one 8,192-token document.
func TestSeqSqSumAttention(t *testing.T) {
	meta := RunMeta{ModelPreset: "llama3-8b", GPU: "h100-sxm"}
	cfg, err := meta.AccumulatorConfig(1, "")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AttnFLOPsPerSeqSq != 6*32*256*32 {
		t.Fatalf("per seq² %g", cfg.AttnFLOPsPerSeqSq)
	}
	whole := dpRecords(1, 8192, 1e9)
	packed := dpRecords(1, 8192, 1e9)
	packed[0].SeqSqSum = 8 * 1024 * 1024
	cw, _ := Aggregate(whole, cfg)
	cp, _ := Aggregate(packed, cfg)
	dense := 8192 * cfg.DenseFLOPsPerToken
	if math.Abs(cw.FLOPs-(dense+8192*8192*cfg.AttnFLOPsPerSeqSq)) > 1e3 {
		t.Errorf("one document: %g FLOPs", cw.FLOPs)
	}
	if math.Abs(cp.FLOPs-(dense+8*1024*1024*cfg.AttnFLOPsPerSeqSq)) > 1e3 || cp.MFU >= cw.MFU {
		t.Errorf("packed: %g FLOPs, MFU %g vs %g", cp.FLOPs, cp.MFU, cw.MFU)
	}
	bad := packed[0]
	bad.SeqSqSum = 8192*8192 + 1
	if err := bad.Validate(); err == nil {
		t.Error("Σ len² above tokens² accepted")
	}
}

// Replicas that report FLOPs and replicas that do not: each counts, the
// latter from tokens × FLOPs per token (it used to count for nothing).
func TestMixedReportedFLOPs(t *testing.T) {
	recs := dpRecords(2, 1000, 1e9)
	recs[0].FLOPs = 5e12
	c, err := Aggregate(recs, AccumulatorConfig{Topology: DataParallel(2), FLOPsPerToken: 1e9})
	if err != nil {
		t.Fatal(err)
	}
	if c.FLOPs != 5e12+1000*1e9 {
		t.Errorf("FLOPs %g, want 6e12", c.FLOPs)
	}
	// without a per-token figure the step's FLOPs are unknown, not half
	c, _ = Aggregate(recs, AccumulatorConfig{Topology: DataParallel(2)})
	if c.FLOPs != 0 {
		t.Errorf("FLOPs %g from one replica of two", c.FLOPs)
	}
}
