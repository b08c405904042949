package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/capture"
	"github.com/tpsprof/tpsprof/kineto"
)

// The text view of a capture: per-rank rows per step, the rank waited for
// with the others' wait, the ranks missing with why, the kept traces.
func TestPrintCapture(t *testing.T) {
	var rs []capture.Report
	for step := int64(7); step < 9; step++ {
		for rank := int64(0); rank < 3; rank++ {
			late := int64(0)
			if rank == 2 {
				late = 30e6
			}
			rs = append(rs, capture.Report{Rank: rank, Step: step, Node: "n0", State: capture.StateTraced, Device: "cpu",
				Figures: kineto.StepStats{DurationUs: 100e3, ComputeUs: 60e3, CommUs: 35e3, ExposedCommUs: 35e3, IdleUs: 5e3},
				Calls:   []kineto.Call{{Step: step, Kind: "all_reduce", StartNs: step*1e9 + 10e6 + late, EndNs: step*1e9 + 45e6}}})
		}
	}
	v := capture.Merge("cap1", "job1", rs)
	v.Missing = []capture.Missing{{Rank: 3, Why: "step 7 was already past"}}
	v.Kept = []string{"/k/cap1/rank0.step7.pt.trace.json.gz"}
	var b bytes.Buffer
	printCapture(&b, v)
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"capture cap1 of job job1, steps 7-8: 3 ranks traced",
		"waited for: rank 2 (node n0), last to arrive at 2 of 2 collectives; the others waited 60.0 ms each",
		"rank 3: not traced: step 7 was already past",
		"traces kept: 1 files in /k/cap1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	// per step: rank 0 spent 35 ms in collectives, 30 of them waiting for
	// rank 2; rank 2 waited for no one and held each call back 30 ms
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 12 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	if rows["0"] != "0 n0 2 100.0 60.0 35.0 30.0 5.0 35.0 5.0 0 0.0" || rows["2"] != "2 n0 2 100.0 60.0 35.0 0.0 35.0 35.0 5.0 2 30.0" {
		t.Errorf("rank rows %q", rows)
	}
}
