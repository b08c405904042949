package collector

import (
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// The live page's whole-run series stays within 512 points over 10,000
// steps, every step counted once, and a drop late in the run (470k → 355k
// tokens/s at step 7,000, which the last-200-steps chart rescaled away)
// shows in it.
func TestRunHistoryWholeRun(t *testing.T) {
	var h runHistory
	for s := int64(0); s < 10000; s++ {
		v := 470000.0
		if s >= 7000 {
			v = 355000
		}
		h.add(tps.ClusterStep{Step: s, Tokens: int64(v), TPS: v, StepTimeNs: 1e9})
	}
	ser := h.series()
	if len(ser) > historyBuckets || len(ser) < historyBuckets/2 {
		t.Fatalf("%d points", len(ser))
	}
	n := 0
	for _, p := range ser {
		n += p.Steps
	}
	if n != 10000 {
		t.Errorf("%d steps in the buckets, want 10,000", n)
	}
	first, last := ser[0], ser[len(ser)-1]
	if first.TPS != 470000 || last.TPS != 355000 || first.Seq != 0 || last.Seq+int64(last.Steps) != 10000 {
		t.Errorf("first %+v, last %+v", first, last)
	}
	if ser[0].MFU != nil {
		t.Errorf("MFU of steps without it: %v", *ser[0].MFU)
	}
}
