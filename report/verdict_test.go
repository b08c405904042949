package report

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// One straggler verdict, on own time (compute, data wait and host work): a rank slow
// in its data loading (40 ms a step more than its peer, who waits for it in
// the all-reduce) is named by the summary line, the HTML card and the
// comparison, as by the episodes. On compute alone both ranks were equal:
// "straggler ranks none" beside an episode that named it.
func TestOneStragglerVerdict(t *testing.T) {
	const world, steps = 2, 60
	root := t.TempDir()
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, "data", trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "data", trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	now := int64(1.7e18)
	recs := make([]tps.StepRecord, world)
	const d = int64(100e6)
	for s := range steps {
		for r := range recs {
			data, comm := int64(2e6), int64(40e6)
			if r == 1 {
				data, comm = 42e6, 0 // loading late; rank 0 waits for it
			}
			recs[r] = tps.StepRecord{Job: "data", Step: int64(s), Rank: int64(r), WorldSize: world, Node: "vm",
				StartUnixNs: now, EndUnixNs: now + d, DurationNs: d, Tokens: 1000, DataWaitNs: data, ExposedCommNs: comm, CommNs: comm}
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
	rep, err := analyzeChecked(filepath.Join(root, "data"), Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	kind, flagged := rep.flaggedStragglers()
	if kind != "rank" || len(flagged) != 1 || flagged[0].name != "rank 1" {
		t.Fatalf("flagged %s %+v, want rank 1 alone", kind, flagged)
	}
	var text bytes.Buffer
	WriteText(&text, rep)
	if !regexp.MustCompile(`(?m)^  straggler ranks +rank 1 \(0\.60, whole-run median\)`).MatchString(text.String()) {
		t.Errorf("the summary line does not name rank 1:\n%s", text.String())
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, rep, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "slowest rank") || !strings.Contains(page.String(), "rank 1") {
		t.Error("the HTML has no card for rank 1")
	}
	if got := worstNode(rep); !strings.HasPrefix(got, "rank 1 ") {
		t.Errorf("--compare's worst straggler %q", got)
	}
	// one node: the waiting is charged to the rank, not to the node
	if !regexp.MustCompile(`(?m)^  waiting caused by +rank 1 100\.0%`).MatchString(text.String()) {
		t.Errorf("the waiting is not charged to rank 1:\n%s", text.String())
	}
}
