package collector

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// rank_windows summarises rank_steps exactly: per rank and window of 100
// steps, merged over the rows a key has (a late record makes a second
// row), every sum, minimum and maximum equals what the rank rows read back
// give, and the compute sketch's median is within its 1% of the exact one.
func TestRankWindowsSummariseRankSteps(t *testing.T) {
	out := t.TempDir()
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute})
	const steps, world = 250, 4
	t0 := time.Now().Add(-time.Hour).UnixNano()
	rec := func(s, r int64) tps.StepRecord {
		comp := 1e6 + 1000*s + 5000*r // varies by step and rank
		if r == 3 {
			comp = comp * 13 / 10
		}
		return tps.StepRecord{Job: "win", Step: s, Rank: r, WorldSize: world, Node: "n0", Tokens: 100 + s,
			StartUnixNs: t0 + s*1e7, EndUnixNs: t0 + s*1e7 + int64(comp) + 2e5, DurationNs: int64(comp) + 2e5,
			DataWaitNs: 1e5 + s, ExposedCommNs: 1e5, CommNs: 3e5 + r, FwdNs: int64(comp) / 3, BwdNs: int64(comp) / 2, OptimNs: 1000}
	}
	for s := int64(0); s < steps; s++ {
		var recs []tps.StepRecord
		for r := int64(0); r < world; r++ {
			if s == 7 && r == 2 {
				continue // comes late, after window 2 began
			}
			recs = append(recs, rec(s, r))
		}
		if err := nc.Publish(wire.StepsSubject("win", "n0"), wire.AppendSteps(nil, recs)); err != nil {
			t.Fatal(err)
		}
	}
	late := rec(7, 2)
	nc.Publish(wire.StepsSubject("win", "n0"), wire.AppendSteps(nil, []tps.StepRecord{late}))
	nc.Flush()
	if err := c.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(out, "win", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != steps*world {
		t.Fatalf("%d rank rows, want %d", len(rows), steps*world)
	}
	wins, err := trace.ReadAll[tps.RankWindow](filepath.Join(out, "win", trace.RankWindows))
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ rank, window int64 }
	merged := map[key]*tps.RankWindow{}
	keyRows := map[key]int{}
	for i := range wins {
		k := key{wins[i].Rank, wins[i].Window}
		keyRows[k]++
		if merged[k] == nil {
			merged[k] = &tps.RankWindow{}
		}
		if err := merged[k].Merge(&wins[i]); err != nil {
			t.Fatal(err)
		}
	}
	if keyRows[key{2, 0}] != 2 {
		t.Errorf("rank 2 window 0: %d rows, want 2 (the late record's own)", keyRows[key{2, 0}])
	}
	want := map[key]*tps.RankWindow{}
	computes := map[key][]float64{}
	for i := range rows {
		r := &rows[i]
		k := key{r.Rank, tps.WindowOf(r.Step)}
		if want[k] == nil {
			want[k] = &tps.RankWindow{}
		}
		want[k].Add(r)
		computes[k] = append(computes[k], float64(r.ComputeNs()))
	}
	if len(merged) != len(want) || len(want) != world*3 {
		t.Fatalf("%d merged windows, %d from the rank rows, want %d", len(merged), len(want), world*3)
	}
	for k, w := range want {
		g := merged[k]
		if g == nil {
			t.Errorf("rank %d window %d: no rank_windows row", k.rank, k.window)
			continue
		}
		if g.Steps != w.Steps || g.FirstStep != w.FirstStep || g.LastStep != w.LastStep || g.Tokens != w.Tokens ||
			g.Duration != w.Duration || g.Compute != w.Compute || g.DataWait != w.DataWait || g.Comm != w.Comm ||
			g.ExposedComm != w.ExposedComm || g.Fwd != w.Fwd || g.Bwd != w.Bwd || g.Optim != w.Optim || g.Node != "n0" ||
			g.StartUnixNs != w.StartUnixNs || g.EndUnixNs != w.EndUnixNs {
			t.Errorf("rank %d window %d: %+v\nwant %+v", k.rank, k.window, *g, *w)
		}
		sk, err := g.Sketch()
		if err != nil || sk == nil {
			t.Fatalf("rank %d window %d: sketch %v %v", k.rank, k.window, sk, err)
		}
		xs := computes[k]
		slices.Sort(xs)
		exact := xs[(len(xs)-1)/2]
		if got := sk.Quantile(0.5); got < exact*0.98 || got > exact*1.02 || sk.Count != w.Steps {
			t.Errorf("rank %d window %d: sketch median %.0f (count %d), exact %.0f (%d rows)", k.rank, k.window, got, sk.Count, exact, w.Steps)
		}
	}
}
