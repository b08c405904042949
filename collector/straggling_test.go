package collector

import (
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// A job's straggler tracking fed by hand: four ranks, rank 3's own time
// twice the others' from step 10 on. Its average is the slowest, its run
// of slow steps starts where the slowness began, and it keeps slow
// enough for an episode only after episodeMinSlow slow steps of the last
// episodeRecent.
func TestStragglerTrack(t *testing.T) {
	var s stragglerTrack
	rec := func(rank, step int64, ms int64) *tps.StepRecord {
		return &tps.StepRecord{Rank: rank, Step: step, DurationNs: ms * 1e6, DataWaitNs: 0}
	}
	for step := int64(0); step < 20; step++ {
		for r := int64(0); r < 4; r++ {
			ms := int64(100)
			if r == 3 && step >= 10 {
				ms = 200
			}
			s.observeRank(rec(r, step, ms), 4)
		}
		_, s.bestSeen = s.bestOwn() // as episode tracking sets it after each step
		if step == 11 && s.keepsSlow(3) {
			t.Errorf("rank 3 kept slow after two slow steps")
		}
	}
	if at, best := s.bestOwn(); at == 3 || best <= 0 || best > 101e6 {
		t.Errorf("fastest rank %d at %.0f ns", at, best)
	}
	if !s.keepsSlow(3) || s.keepsSlow(0) {
		t.Errorf("keeps slow: rank 3 %v, rank 0 %v", s.keepsSlow(3), s.keepsSlow(0))
	}
	if s.slowSince[3] != 10 || s.slowLast[3] != 19 || s.slowSince[0] != -1 {
		t.Errorf("rank 3 slow since %d to %d, rank 0 since %d: want 10, 19, -1", s.slowSince[3], s.slowLast[3], s.slowSince[0])
	}
	if s.ownEWMA[3] < 1.5*s.ownEWMA[0] {
		t.Errorf("averages: rank 3 %.0f, rank 0 %.0f", s.ownEWMA[3], s.ownEWMA[0])
	}
	// a rank out of the world is ignored
	s.observeRank(rec(9, 20, 100), 4)
}

// A rank's warm-up steps seed nothing (rank 0's first step 220 ms against
// 69 opened a live episode that the report, which leaves out the warm-up,
// never had): its average starts after them.
func TestWarmUpSeedsNoStraggler(t *testing.T) {
	var s stragglerTrack
	for step := int64(0); step < 12; step++ {
		for r := int64(0); r < 2; r++ {
			ms := int64(69)
			if r == 0 && step < 2 {
				ms = 220
			}
			s.observeRank(&tps.StepRecord{Rank: r, Step: step, DurationNs: ms * 1e6}, 2)
		}
		_, s.bestSeen = s.bestOwn()
	}
	if s.keepsSlow(0) || s.ownEWMA[0] > 1.01*s.ownEWMA[1] {
		t.Errorf("rank 0 after its warm-up: average %.0f against %.0f, keeps slow %v", s.ownEWMA[0], s.ownEWMA[1], s.keepsSlow(0))
	}
}
