package collector

import "github.com/tpsprof/tpsprof/tps"

// rolloutWindows is how many closed steps' rollout events the live
// latency figures cover: every rank's, merged into one sketch pair per
// step window as they arrive (a rollout event comes per rank and step:
// merging is O(buckets), and the figures are published by the loop, not
// per event).
const rolloutWindows = 8

// rolloutWindow is a job's generation latencies (RL post-training) over
// its last rolloutWindows closed steps, for the live figures. It does no
// I/O and takes no lock: its job's lock guards it.
type rolloutWindow struct {
	rollWin   [rolloutWindows]tps.RolloutDetail // merged per step
	rollIdx   int                               // the window rollout events merge into
	rollDirty bool                              // merged since the live figures were published
}

// addRollout merges a rank's generation latencies into the current window.
func (w *rolloutWindow) addRollout(d tps.RolloutDetail) {
	cur := &w.rollWin[w.rollIdx]
	cur.TTFT.Merge(&d.TTFT)
	cur.ITL.Merge(&d.ITL)
	w.rollDirty = true
}

// nextRolloutStep starts the next step's window: the oldest makes room.
func (w *rolloutWindow) nextRolloutStep() {
	w.rollIdx = (w.rollIdx + 1) % rolloutWindows
	w.rollWin[w.rollIdx] = tps.RolloutDetail{}
}

// rolloutSketches merges the windows: time to first token and inter-token
// latency over the last rolloutWindows steps.
func (w *rolloutWindow) rolloutSketches() (ttft, itl tps.Sketch) {
	for i := range w.rollWin {
		ttft.Merge(&w.rollWin[i].TTFT)
		itl.Merge(&w.rollWin[i].ITL)
	}
	return ttft, itl
}
