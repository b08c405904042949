package collector

import (
	"math/rand/v2"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// A node's clock that jumps mid-run (2 s ahead from step 40 on) is
// followed within three steps, not the 16 the window's median needed;
// a jump back is followed likewise. A node whose step ends scatter by
// hundreds of milliseconds (asynchronous ranks) gets no offset and starts
// no jump once it has ten samples. Every node's steps end within ±0.5 ms of jitter here.
func TestClockJumpFollowedWithinThreeSteps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var c clockEstimator
	jitter := func() int64 { return rng.Int64N(1_000_000) - 500_000 }
	skew := func(step int) int64 {
		switch {
		case step >= 40 && step < 80:
			return 2_000_000_000
		default:
			return 0
		}
	}
	var firstAhead, firstBack int = -1, -1
	for step := range 120 {
		end := int64(step) * 1_000_000_000
		c.observe([]tps.NodeSpan{
			{Node: "n0", LowestRank: 0, MaxEndNs: end + jitter()},
			{Node: "n1", LowestRank: 8, MaxEndNs: end + skew(step) + jitter()},
			{Node: "async", LowestRank: 16, MaxEndNs: end + rng.Int64N(800_000_000) - 400_000_000},
		})
		off := c.offset("n1")
		if step < 40 && off != 0 {
			t.Fatalf("step %d: offset %d before any skew", step, off)
		}
		if firstAhead < 0 && off > 1_990_000_000 && off < 2_010_000_000 {
			firstAhead = step
		}
		if firstAhead >= 0 && firstBack < 0 && step >= 80 && off == 0 {
			firstBack = step
		}
		if a := c.offset("async"); step >= 10 && a != 0 { // the first few samples may agree by chance
			t.Fatalf("step %d: an asynchronous node got offset %d", step, a)
		}
	}
	if firstAhead != 42 || firstBack != 82 {
		t.Errorf("the 2 s jump at step 40 followed at step %d, the jump back at 80 at step %d; want 42 and 82", firstAhead, firstBack)
	}
}
