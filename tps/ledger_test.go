package tps

import (
	"math"
	"strings"
	"testing"
)

// The ledger adds up to the peak exactly, each bucket its part's share at
// the run's efficiency over compute time. Figures: an H200 Llama run of
// the GPU check (MFU 38.7%) with a made-up breakdown of 70% compute.
func TestMFULedger(t *testing.T) {
	s := Shares{Compute: 0.70, ExposedComm: 0.12, WaitingForPeers: 0.05, Bubble: 0, DataStall: 0.08, Checkpoint: 0.02, Other: 0.03}
	l, err := MFULedger(0.387, s)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(l.Sum()-100) > 1e-9 {
		t.Errorf("adds up to %v", l.Sum())
	}
	c := 0.387 / 0.70
	want := map[string]float64{"exposed_comm": 12 * c, "data_stall": 8 * c, ComputeEfficiency: 100 * (1 - c)}
	for _, b := range l.Lost {
		if w, ok := want[b.Key]; ok && math.Abs(b.Points-w) > 1e-9 {
			t.Errorf("%s: %v points, want %v", b.Key, b.Points, w)
		}
	}
	if l.Lost[len(l.Lost)-1].Key != ComputeEfficiency || len(l.Lost) != len(shareParts) {
		t.Errorf("buckets %+v", l.Lost)
	}
	for _, bad := range []struct {
		mfu  float64
		s    Shares
		want string
	}{{0.5, Shares{Compute: 0.4, Other: 0.6}, "cannot"}, {0.3, Shares{Other: 1}, "no compute"}, {math.NaN(), s, "not a fraction"}} {
		if _, err := MFULedger(bad.mfu, bad.s); err == nil || (bad.want != "cannot" && !strings.Contains(err.Error(), bad.want)) {
			t.Errorf("MFU %v over %+v: %v", bad.mfu, bad.s, err)
		}
	}
}
