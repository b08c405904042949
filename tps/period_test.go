package tps

import (
	"math/rand/v2"
	"testing"
)

// Two ranks of a synchronous job whose step boundaries jitter: each starts
// a step when it finished the last, and the step ends when the later of
// them ends. The slowest rank's own duration overstates the period (its
// start was the other's earlier end); the step times ResultIn gives add up
// to the wall time the steps cover, and each equals the true period.
func TestStepTimeIsThePeriod(t *testing.T) {
	const steps = 200
	rng := rand.New(rand.NewPCG(1, 2))
	t0 := int64(1_760_000_000_000_000_000)
	prevRank := [2]int64{t0, t0} // each rank's end of the previous step
	var clusterEnd [steps]int64
	var sumPeriod, sumMaxDur, sumTrue int64
	prevEnd := int64(0)
	for s := range steps {
		end := max(prevRank[0], prevRank[1]) + 1_000_000_000 // the collective releases both here...
		var recs []StepRecord
		for r := range int64(2) {
			e := end + rng.Int64N(60_000_000) // ...and each finishes its optimizer step 0-60 ms later
			recs = append(recs, StepRecord{Job: "p", Step: int64(s), Rank: r, WorldSize: 2, StartUnixNs: prevRank[r], EndUnixNs: e,
				DurationNs: e - prevRank[r], Tokens: 1000})
		}
		for r := range 2 {
			prevRank[r] = recs[r].EndUnixNs
		}
		clusterEnd[s] = max(recs[0].EndUnixNs, recs[1].EndUnixNs)
		a, err := NewStepAccumulator("p", 0, int64(s), 2, AccumulatorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range recs {
			a.Add(&recs[i])
		}
		c := a.ResultIn(StepContext{PrevEndUnixNs: prevEnd})
		if s > 0 {
			want := clusterEnd[s] - clusterEnd[s-1]
			if c.StepTimeNs != want {
				t.Fatalf("step %d: step time %d, want the period %d", s, c.StepTimeNs, want)
			}
			sumTrue += want
			sumPeriod += c.StepTimeNs
			sumMaxDur += c.RankTimeMaxNs
		}
		if c.RankTimeMaxNs != max(recs[0].DurationNs, recs[1].DurationNs) {
			t.Fatalf("step %d: rank time max %d", s, c.RankTimeMaxNs)
		}
		prevEnd = c.EndUnixNs
	}
	if wall := clusterEnd[steps-1] - clusterEnd[0]; sumPeriod != wall || sumTrue != wall {
		t.Errorf("step times add up to %d ns, the wall time is %d", sumPeriod, wall)
	}
	over := float64(sumMaxDur)/float64(sumPeriod) - 1
	t.Logf("the slowest rank's duration overstates the period by %.1f%%", 100*over)
	if over < 0.01 {
		t.Errorf("the jitter should make the slowest duration overstate the period (%.2f%%)", 100*over)
	}
}

// A node whose clock runs 2 s ahead: with its offset given, the step's
// start and end are on the reference clock and the step time is the
// period; without, the span and the period take the skew.
func TestStepClockOffsets(t *testing.T) {
	t0 := int64(1_760_000_000_000_000_000)
	recs := []StepRecord{
		{Job: "c", Step: 5, Rank: 0, WorldSize: 2, Node: "a", StartUnixNs: t0, EndUnixNs: t0 + 1e9, DurationNs: 1e9, Tokens: 10},
		{Job: "c", Step: 5, Rank: 1, WorldSize: 2, Node: "b", StartUnixNs: t0 + 2e9 + 1e6, EndUnixNs: t0 + 3e9, DurationNs: 1e9 - 1e6, Tokens: 10},
	}
	a, _ := NewStepAccumulator("c", 0, 5, 2, AccumulatorConfig{})
	for i := range recs {
		a.Add(&recs[i])
	}
	if n := a.NodeSpans(); len(n) != 2 || n[1].Node != "b" || n[1].MaxEndNs != t0+3e9 || n[1].Ranks != 1 {
		t.Fatalf("node spans %+v", n)
	}
	off := func(n string) int64 {
		if n == "b" {
			return 2e9
		}
		return 0
	}
	prev := t0 - 5e6 // the previous step ended just before rank 0 started this one
	c := a.ResultIn(StepContext{ClockOffsetNs: off, PrevEndUnixNs: prev})
	if c.StartUnixNs != t0 || c.EndUnixNs != t0+1e9 || c.StepTimeNs != 1e9 {
		t.Errorf("with the offset: start %d end %d step %d; want %d, %d, 1 s", c.StartUnixNs-t0, c.EndUnixNs-t0, c.StepTimeNs, 0, int64(1e9))
	}
	raw := a.ResultIn(StepContext{PrevEndUnixNs: prev})
	if raw.EndUnixNs != t0+3e9 || raw.StepTimeNs != 3e9 {
		t.Errorf("without: end %d step %d; want the skew in both", raw.EndUnixNs-t0, raw.StepTimeNs)
	}
	if plain := a.Result(); plain.StepTimeNs != 1e9 {
		t.Errorf("without context: step %d, want the slowest rank's duration", plain.StepTimeNs)
	}
	// A partial from each node carries its span: merged, the same result.
	b, _ := NewStepAccumulator("c", 0, 5, 2, AccumulatorConfig{})
	for i := range recs {
		p, err := NewPartial(recs[i:i+1], Topology{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.AddPartial(&p); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.ResultIn(StepContext{ClockOffsetNs: off, PrevEndUnixNs: prev}); got != c {
		t.Errorf("from partials:\n%+v\nwant\n%+v", got, c)
	}
}
