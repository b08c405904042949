package report

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Two processes on one node each training a copy of their own (world 1
// each, numbered as ranks 0 and 1: the Trainer with use_cpu and no
// backend under torchrun) are said, not silently merged: their steps of
// one number end further and further apart. Synchronous ranks are not.
func TestUnsynchronisedRanksSaid(t *testing.T) {
	root := t.TempDir()
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, "copies", trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "copies", trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	t0 := int64(1.7e18)
	period := []int64{1e9, 1.3e9} // each copy at its own pace
	for s := range int64(30) {
		recs := make([]tps.StepRecord, 2)
		for r := range recs {
			end := t0 + (s+1)*period[r]
			recs[r] = tps.StepRecord{Job: "copies", Step: s, Rank: int64(r), WorldSize: 2, Node: "n0",
				StartUnixNs: end - period[r], EndUnixNs: end, DurationNs: period[r], Tokens: 1000}
		}
		c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ranks.Write(recs)
		cluster.Write([]tps.ClusterStep{c})
	}
	if err := ranks.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Analyze(filepath.Join(root, "copies"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "ranks not synchronised") {
		t.Errorf("notes %q: want the ranks said not synchronised", rep.Notes)
	}
	sync := writeSynchronous(t, "sync", 2, 30, func(int) string { return "n0" }, func(int) float64 { return 1e9 },
		func(s, r int) float64 { return 5e8 + float64(r)*1e8 })
	rep, err = Analyze(filepath.Join(sync, "sync"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.Join(rep.Notes, "\n"), "not synchronised") {
		t.Errorf("a synchronous job said not synchronised: %q", rep.Notes)
	}
}
