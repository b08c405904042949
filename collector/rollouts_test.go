package collector

import (
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// The live generation latencies cover the last rolloutWindows steps: a
// step's rollouts merge into its window, and the window of the step
// rolloutWindows steps back makes room for the next one.
func TestRolloutWindow(t *testing.T) {
	var w rolloutWindow
	one := func(ms float64) tps.RolloutDetail {
		var d tps.RolloutDetail
		d.TTFT.Add(ms / 1e3)
		d.ITL.Add(ms / 1e4)
		return d
	}
	w.addRollout(one(100))
	w.addRollout(one(100))
	if !w.rollDirty {
		t.Error("merged, not dirty")
	}
	for range rolloutWindows - 1 {
		w.nextRolloutStep()
		w.addRollout(one(10))
	}
	ttft, _ := w.rolloutSketches()
	if n := ttft.Count; n != 2+rolloutWindows-1 {
		t.Fatalf("%d latencies over the windows, want %d", n, 2+rolloutWindows-1)
	}
	w.nextRolloutStep() // the first step's window makes room
	ttft, _ = w.rolloutSketches()
	if n := ttft.Count; n != rolloutWindows-1 {
		t.Errorf("%d latencies after the first window went, want %d", n, rolloutWindows-1)
	}
}
