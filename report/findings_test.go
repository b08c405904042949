package report

import (
	"math"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// findingsOf is rep's findings from its summary, breakdown and waiting.
func findingsOf(sh tps.Shares, world int64, wait ...WaitShare) []Finding {
	rep := &Report{Summary: tps.Summary{SteadySteps: 30, WorldSize: world, AggregateTPS: 1000, StepTimeS: tps.Dist{Mean: 0.0536}}, Breakdown: Breakdown{Shares: sh},
		WaitCharged: wait, Goodput: Goodput{BadputS: map[string]float64{}}}
	rep.findings()
	return rep.Findings
}

// gain is the throughput gained without a share of step time, in %.
func gain(share float64) float64 { return 100 * (1/(1-share) - 1) }

// The top finding of each case examples/pytorch/causes.py injects where
// the breakdown alone decides it (TestInjectedCauses runs the jobs).
func TestFindingsNameTheCause(t *testing.T) {
	slowData := WaitShare{Cause: "waiting for data", Node: "n", Ranks: []int64{1}, Steps: 30, Share: 1, ByRank: true}
	// its excess over the mean rank measured: 15 ms a step, 30 ms over the
	// other rank of two, out of 53.6 ms steps
	excess := slowData
	excess.DataExcessMs = 15
	for _, c := range []struct {
		name         string
		sh           tps.Shares
		wait         []WaitShare
		bucket, says string
		headroom     float64
	}{
		// every rank stalls alike: the little waiting noise leaves is
		// charged to a rank "waiting for data" and is not the story
		{"data everywhere", tps.Shares{Compute: 0.43, DataStall: 0.519, WaitingForPeers: 0.026, Other: 0.025}, []WaitShare{slowData},
			"data_stall", "", gain(0.519)},
		// rank 1 of 2 stalls: its stall and rank 0's waiting are one
		// finding, rank 0's waiting (50% of its step) the headroom
		{"one rank's data", tps.Shares{Compute: 0.5, DataStall: 0.25, WaitingForPeers: 0.25}, []WaitShare{slowData},
			"data_stall", "the input pipeline of rank 1", gain(0.5)},
		// the same with the slow rank's excess known: the step without it
		// (rank 0's waiting, 49.9% of its step, understated it: its own
		// work hid part of the wait)
		{"one rank's data, its excess known", tps.Shares{Compute: 0.47, DataStall: 0.279, WaitingForPeers: 0.25}, []WaitShare{excess},
			"data_stall", "the input pipeline of rank 1", 100 * (0.0536/(0.0536-0.030) - 1)},
		// the thread's own work before the forward is nearly all of host/other
		{"host work", tps.Shares{Compute: 0.55, Other: 0.384, DataStall: 0.066, Splits: map[string]float64{"host_ns": 0.377}}, nil,
			"host_other", "host work on the training thread", gain(0.384)},
		// a fifth of it: no cause named
		{"host and other", tps.Shares{Compute: 0.55, Other: 0.384, DataStall: 0.066, Splits: map[string]float64{"host_ns": 0.2}}, nil,
			"host_other", "", gain(0.384)},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := findingsOf(c.sh, 2, c.wait...)
			if len(fs) == 0 {
				t.Fatal("no finding")
			}
			f := fs[0]
			if f.Bucket != c.bucket || math.Abs(f.HeadroomPct-c.headroom) > 1e-9 {
				t.Errorf("top finding %s +%.2f%%, want %s +%.2f%% (%+v)", f.Bucket, f.HeadroomPct, c.bucket, c.headroom, fs)
			}
			if (c.says == "") != (f.Cause == "") || !strings.Contains(f.Cause, c.says) {
				t.Errorf("cause %q, want %q", f.Cause, c.says)
			}
		})
	}
}

// A pipeline's bubble gains what its least-waiting stage waits: the
// others' waits beyond it are on no critical path (two stages waiting
// 24% and 38% of a 10 ms step: the mean, 31%, gives +45%; the step
// without the bubble is 24% shorter: +31.6%).
func TestBubbleHeadroomIsTheLeastWait(t *testing.T) {
	rep := &Report{Summary: tps.Summary{SteadySteps: 30, WorldSize: 2, AggregateTPS: 1000, StepTimeS: tps.Dist{Mean: 0.010}},
		Breakdown: Breakdown{Shares: tps.Shares{Compute: 0.69, Bubble: 0.31}, BubbleTheoretical: 0.333},
		Goodput:   Goodput{BadputS: map[string]float64{}}, leastPP: 2.4e6, leastPPSteps: 30}
	rep.findings()
	if len(rep.Findings) == 0 || rep.Findings[0].Bucket != "bubble" || math.Abs(rep.Findings[0].HeadroomPct-gain(0.24)) > 1e-9 ||
		!strings.Contains(rep.Findings[0].Cause, "too few microbatches") {
		t.Fatalf("findings %+v: want the bubble, +%.1f%%, the schedule named", rep.Findings, gain(0.24))
	}
	// read from rank_windows (no least wait): the mean over ranks
	rep.leastPPSteps, rep.Findings = 0, nil
	rep.findings()
	if math.Abs(rep.Findings[0].HeadroomPct-gain(0.31)) > 1e-9 {
		t.Errorf("headroom %.2f%%, want the mean's %.2f%%", rep.Findings[0].HeadroomPct, gain(0.31))
	}
}

// The waiting for a node names its GPUs' evidence where its straggler
// episodes show them slowed, and not where they show normal clocks.
func TestWaitingNamesAThrottledGPU(t *testing.T) {
	for _, slow := range []bool{true, false} {
		rep := &Report{Summary: tps.Summary{SteadySteps: 30, WorldSize: 2, AggregateTPS: 1000},
			Breakdown:   Breakdown{Shares: tps.Shares{Compute: 0.7, WaitingForPeers: 0.3}},
			WaitCharged: []WaitShare{{Cause: "compute: 15.0 ms a step more than the mean rank", Node: "node-b", Ranks: []int64{1}, Steps: 30, Share: 1}},
			Episodes:    []StragglerEpisode{{Node: "node-b", Steps: 30, Cause: "GPU clocks throttled: 1305 MHz against 1980 MHz", gpuSlow: slow}},
			Goodput:     Goodput{BadputS: map[string]float64{}}}
		rep.findings()
		if got := strings.Contains(rep.Findings[0].Cause, "its GPU clocks throttled"); got != slow {
			t.Errorf("GPUs slowed %v: the waiting's cause %q", slow, rep.Findings[0].Cause)
		}
	}
}

// "not overlapped" only where the overlap is measured: on torch 1.13
// DDP's hidden part is not, and a 0% overlap named the cause in clean
// runs too.
func TestNotOverlappedOnlyWhereMeasured(t *testing.T) {
	rep := &Report{Meta: &tps.RunMeta{Unmeasured: map[string]string{"communication": "DDP's all-reduces on CPU on torch 1.13"}}}
	if cause, ev := rep.causeOf("exposed_comm"); cause != "" || !strings.Contains(ev, "not measured") {
		t.Errorf("unmeasured overlap: cause %q, evidence %q", cause, ev)
	}
	rep.Meta = &tps.RunMeta{}
	if cause, _ := rep.causeOf("exposed_comm"); !strings.Contains(cause, "not overlapped") {
		t.Errorf("measured 0%% overlap: cause %q", cause)
	}
}
