package report

import (
	"math"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// Steps whose spans overlap (a rank starts the next step before the last
// rank ends this one) and a gap with an evaluation: each moment goes to
// one part, so the parts add up to the elapsed time exactly, the overlap
// is not counted twice, and no idle time appears where steps follow each
// other. Before, each step counted its slowest rank's duration and its
// start skew as idle: the parts added up to more than the elapsed time.
func TestGoodputPartsAddUp(t *testing.T) {
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	var steps []tps.ClusterStep
	end := t0
	for i := range int64(10) {
		start := end - s/10 // 100 ms of overlap with the previous step
		if i == 0 {
			start = t0
		}
		if i == 5 {
			start = end + 3*s // an evaluation of 3 s, then 1 s idle
		}
		steps = append(steps, tps.ClusterStep{Attempt: 0, Step: i, StartUnixNs: start, EndUnixNs: start + 2*s,
			StepTimeNs: 2 * s, DataStallFractionMean: 0.1})
		end = start + 2*s
	}
	ev := []tps.Event{{Kind: tps.EventEval, StartUnixNs: steps[4].EndUnixNs, EndUnixNs: steps[4].EndUnixNs + 2*s}}
	g := ComputeGoodput(steps, make([]bool, len(steps)), ev)
	sum := g.ProductiveS
	for _, v := range g.BadputS {
		sum += v
	}
	wantElapsed := float64(steps[9].EndUnixNs-t0) / 1e9
	if math.Abs(g.ElapsedS-wantElapsed) > 1e-9 || math.Abs(sum-g.ElapsedS) > 1e-9 {
		t.Fatalf("parts add up to %g s, elapsed %g s (want %g)", sum, g.ElapsedS, wantElapsed)
	}
	// 10 steps: the first and the one after the gap whole (2 s), the
	// others from the previous end (1.9 s); 10% of it data stall.
	steps2 := 2*2.0 + 8*1.9
	if math.Abs(g.ProductiveS-0.9*steps2) > 1e-9 || math.Abs(g.BadputS[BadDataStall]-0.1*steps2) > 1e-9 {
		t.Errorf("productive %g s, data stall %g s; want %g and %g", g.ProductiveS, g.BadputS[BadDataStall], 0.9*steps2, 0.1*steps2)
	}
	if math.Abs(g.BadputS[BadEval]-2) > 1e-9 || math.Abs(g.BadputS[BadIdle]-1) > 1e-9 {
		t.Errorf("eval %g s, idle %g s; want 2 and 1", g.BadputS[BadEval], g.BadputS[BadIdle])
	}
}
