package report

import (
	"math"
	"path/filepath"
	"slices"
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
	slow := func(s int) float64 {
		if s >= from {
			return 1.5e9
		}
		return 1e9
	}
	root := writeSynchronous(t, "late", world, steps, func(r int) string { return "node-" + string(rune('0'+r/8)) },
		func(s int) float64 { return slow(s) + 1e8 },
		func(s, r int) float64 {
			if r == 5 {
				return slow(s)
			}
			return 1e9
		})
	rep, err := analyzeChecked(filepath.Join(root, "late"), Options{Warmup: 0})
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
	rep, err := analyzeChecked(filepath.Join(root, "pad"), Options{Warmup: 0})
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

// Three slow ranks, each slow for another reason, in one synchronous job
// of 12 ranks on 6 nodes (2 a node), 300 steps: rank 2 waits 400 ms a step
// for data (its compute as everyone's), rank 6 spends 400 ms a step on the
// host outside its forward, backward and optimizer (launch gaps), rank 10
// computes 400 ms more (forward and backward). Everyone else waits for the
// slowest in its collectives. Each is an episode of its node, with the
// cause and the excess (ms a step beyond the fastest rank) of its own
// kind; the data-stalled rank's episode was not found at all when episodes
// looked at compute alone.
func TestStragglerEpisodeCauses(t *testing.T) {
	const world, steps = 12, 300
	root := t.TempDir()
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, "why", trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "why", trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	now := int64(1.7e18)
	recs := make([]tps.StepRecord, world)
	// Everyone: 10 ms data, fwd 300 + bwd 500 + optim 100 ms, 90 ms host.
	// The slow rank of the step (by turns, so that each is slow in a third
	// of the windows) adds 400 ms of its kind; the step lasts as long as it.
	for s := 0; s < steps; s++ {
		slowRank := []int{2, 6, 10}[s/100]
		d := int64(10e6 + 900e6 + 90e6 + 400e6 + 50e6) // + 50 ms of transfer
		for r := range recs {
			data, fwd, host := int64(10e6), int64(300e6), int64(90e6)
			if r == slowRank {
				switch r {
				case 2:
					data += 400e6
				case 6:
					host += 400e6
				case 10:
					fwd += 400e6
				}
			}
			own := data + fwd + 500e6 + 100e6 + host
			recs[r] = tps.StepRecord{Job: "why", Step: int64(s), Rank: int64(r), WorldSize: world, Node: "node-" + string(rune('0'+r/2)),
				StartUnixNs: now, EndUnixNs: now + d, DurationNs: d, Tokens: 1000, DataWaitNs: data,
				FwdNs: fwd, BwdNs: 500e6, OptimNs: 100e6, CommNs: 60e6 + (d - own), ExposedCommNs: d - own}
		}
		c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ranks.Write(recs)
		cluster.Write([]tps.ClusterStep{c})
		now += d
	}
	ranks.Close()
	cluster.Close()
	rep, err := analyzeChecked(filepath.Join(root, "why"), Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Episodes) != 3 {
		t.Fatalf("%d episodes, want 3: %+v", len(rep.Episodes), rep.Episodes)
	}
	want := []struct {
		node  string
		rank  int64
		cause string
		part  func(EpisodeExcess) float64
	}{
		{"node-1", 2, "waiting for data", func(x EpisodeExcess) float64 { return x.DataMs }},
		{"node-3", 6, "host time outside forward, backward and optimizer", func(x EpisodeExcess) float64 { return x.HostMs }},
		{"node-5", 10, "slow compute", func(x EpisodeExcess) float64 { return x.ComputeMs }},
	}
	for i, w := range want {
		e := rep.Episodes[i]
		if e.Node != w.node || len(e.Ranks) != 1 || e.Ranks[0] != w.rank {
			t.Errorf("episode %d on %s ranks %v, want %s rank %d", i, e.Node, e.Ranks, w.node, w.rank)
		}
		if !strings.HasPrefix(e.Cause, w.cause) {
			t.Errorf("episode %d (%s): cause %q, want %q", i, e.Node, e.Cause, w.cause)
		}
		// 400 ms of its kind, nothing of the others
		x := e.Excess
		if got := w.part(x); math.Abs(got-400) > 1 || !x.HostKnown || math.Abs(x.DataMs+x.ComputeMs+x.HostMs-400) > 1 {
			t.Errorf("episode %d (%s): excess %+v, want 400 ms of its cause's kind alone", i, e.Node, x)
		}
	}
}

// On one node, the episodes name ranks with their own start, and a
// slowdown that dips for one window is one episode: rank 0 is slow in
// steps 80-99, rank 2 from step 100 to the end but for steps 130-139.
// Read by node, that was "vm steps 80-129, ranks 0,2" and "vm steps
// 140-199, ranks 2"; it is "vm steps 80-99, ranks 0" and "vm steps
// 100-199, ranks 2". No node is called a straggler: the job has one.
func TestEpisodesOneNodeByRank(t *testing.T) {
	const world, steps = 4, 200
	slow := func(s, r int) bool {
		return r == 0 && s >= 80 && s < 100 || r == 2 && s >= 100 && (s < 130 || s >= 140)
	}
	root := writeSynchronous(t, "one", world, steps, func(int) string { return "vm" },
		func(s int) float64 {
			if slow(s, 0) || slow(s, 2) {
				return 1.7e9
			}
			return 1.1e9
		},
		func(s, r int) float64 {
			if slow(s, r) {
				return 1.6e9
			}
			return 1e9
		})
	rep, err := analyzeChecked(filepath.Join(root, "one"), Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	if rep.EpisodeWindow != 10 {
		t.Fatalf("windows of %d steps: the test assumes 10", rep.EpisodeWindow)
	}
	type got struct {
		ranks    string
		from, to int64
		ongoing  bool
		node     string
	}
	var eps []got
	for _, e := range rep.Episodes {
		eps = append(eps, got{rankList(e.Ranks), e.StartStep, e.EndStep, e.Ongoing, e.Node})
	}
	want := []got{{"0", 80, 99, false, "vm"}, {"2", 100, 199, true, "vm"}}
	if !slices.Equal(eps, want) {
		t.Errorf("episodes %+v, want %+v", eps, want)
	}
	var text strings.Builder
	WriteText(&text, rep)
	if strings.Contains(text.String(), "straggler node") || !strings.Contains(text.String(), "straggler ranks   ") {
		t.Errorf("one node called a straggler node, or no straggler ranks line:\n%s", text.String())
	}
	if rep.NodeCount != 1 || len(rep.Nodes) != 0 {
		t.Errorf("%d nodes, %d node scores", rep.NodeCount, len(rep.Nodes))
	}
}

// writeSynchronous writes a job's rank_steps and cluster_steps (under a
// new folder, which it returns): steps back to back, every rank's step
// lasting step(s) ns of which compute(s, r) is its compute and the rest
// exposed communication, 1,000 tokens a rank, on node(r).
func writeSynchronous(t *testing.T, job string, world, steps int, node func(r int) string, step func(s int) float64, compute func(s, r int) float64) string {
	t.Helper()
	root := t.TempDir()
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, job, trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, job, trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	now := int64(1.7e18)
	recs := make([]tps.StepRecord, world)
	for s := range steps {
		d := step(s)
		for r := range recs {
			comm := int64(d - compute(s, r))
			recs[r] = tps.StepRecord{Job: job, Step: int64(s), Rank: int64(r), WorldSize: int64(world), Node: node(r),
				StartUnixNs: now, EndUnixNs: now + int64(d), DurationNs: int64(d), Tokens: 1000, ExposedCommNs: comm, CommNs: comm}
		}
		c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ranks.Write(recs)
		cluster.Write([]tps.ClusterStep{c})
		now += int64(d)
	}
	if err := ranks.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Close(); err != nil {
		t.Fatal(err)
	}
	return root
}
