package report

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// A node that slows down late in the run: rank 5 (node-0) computes 1.5 s
// instead of 1 s from step 600 of 1,035. Its whole-run median is still
// 1 s, so the median score misses it; the windowed scores find the
// episode, when it started (within a window), that it lasts to the end,
// and what it cost: 16,000 tokens per step in 1.6 s instead of 1.1 s,
// 10.0k tokens/s instead of 14.5k (31%).
func TestStragglerEpisodeMidRun(t *testing.T) {
	const world, steps, from = 16, 1035, 600
	root := t.TempDir()
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, "late", trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "late", trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	now := int64(1.7e18)
	recs := make([]tps.StepRecord, world)
	for s := 0; s < steps; s++ {
		slow := 1e9
		if s >= from {
			slow = 1.5e9
		}
		d := slow + 1e8
		for r := range recs {
			comp := 1e9
			if r == 5 {
				comp = slow
			}
			recs[r] = tps.StepRecord{Job: "late", Step: int64(s), Rank: int64(r), WorldSize: world, Node: "node-" + string(rune('0'+r/8)),
				StartUnixNs: now, EndUnixNs: now + int64(d), DurationNs: int64(d), Tokens: 1000, ExposedCommNs: int64(d - comp), CommNs: int64(d - comp)}
		}
		c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ranks.Write(recs)
		cluster.Write([]tps.ClusterStep{c})
		now += int64(d)
	}
	ranks.Close()
	cluster.Close()
	rep, err := Analyze(filepath.Join(root, "late"), Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range rep.Nodes {
		if n.Straggler {
			t.Fatalf("the whole-run median flags %s: the test no longer shows what windows add", n.Node)
		}
	}
	if len(rep.Episodes) != 1 {
		t.Fatalf("episodes: %+v", rep.Episodes)
	}
	e, w := rep.Episodes[0], int64(rep.EpisodeWindow)
	if e.Node != "node-0" || len(e.Ranks) != 1 || e.Ranks[0] != 5 {
		t.Errorf("episode on %s ranks %v, want node-0 rank 5", e.Node, e.Ranks)
	}
	if e.StartStep < from || e.StartStep > from+w || e.EndStep != steps-1 || !e.Ongoing {
		t.Errorf("episode steps %d-%d (ongoing %v), want from %d (±%d) to %d", e.StartStep, e.EndStep, e.Ongoing, from, w, steps-1)
	}
	if math.Abs(e.WorstScore-1/1.5) > 0.01 {
		t.Errorf("worst score %.3f, want 0.667", e.WorstScore)
	}
	if math.Abs(e.TPSDuring-10000) > 1 || math.Abs(e.TPSWithout-16000/1.1) > 50 || math.Abs(e.CostFraction-(1-1.1/1.6)) > 0.01 {
		t.Errorf("cost: %.0f during, %.0f without, %.3f", e.TPSDuring, e.TPSWithout, e.CostFraction)
	}
	var text strings.Builder
	WriteText(&text, rep)
	if !strings.Contains(text.String(), "straggler episode  node-0 steps ") || !strings.Contains(text.String(), "(to the end)") {
		t.Errorf("text:\n%s", text.String())
	}
}

// Real against padded tokens, where ranks report both: 800 real of 1,000
// padded on rank 0; rank 1 reports no padded count and is left out.
func TestPadding(t *testing.T) {
	root := t.TempDir()
	ranks, _ := trace.NewPartWriter[tps.StepRecord](root, "pad", trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "pad", trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	now := int64(1.7e18)
	for s := 0; s < 20; s++ {
		recs := []tps.StepRecord{
			{Job: "pad", Step: int64(s), Rank: 0, WorldSize: 2, StartUnixNs: now, EndUnixNs: now + 1e9, DurationNs: 1e9, Tokens: 800, PaddedTokens: 1000},
			{Job: "pad", Step: int64(s), Rank: 1, WorldSize: 2, StartUnixNs: now, EndUnixNs: now + 1e9, DurationNs: 1e9, Tokens: 1000},
		}
		c, _ := tps.Aggregate(recs, tps.AccumulatorConfig{})
		ranks.Write(recs)
		cluster.Write([]tps.ClusterStep{c})
		now += 1e9
	}
	ranks.Close()
	cluster.Close()
	rep, err := Analyze(filepath.Join(root, "pad"), Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Padding == nil || rep.Padding.RealFraction != 0.8 || rep.Padding.PaddedTokens != 20000 {
		t.Fatalf("padding %+v", rep.Padding)
	}
	var text strings.Builder
	WriteText(&text, rep)
	if !strings.Contains(text.String(), "real tokens are 80.0% of the padded batch") {
		t.Errorf("text:\n%s", text.String())
	}
}
