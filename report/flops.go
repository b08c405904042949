package report

import (
	"fmt"
	"math"

	"github.com/tpsprof/tpsprof/tps"
)

// CountedFLOPs holds the FLOPs PyTorch counted on sampled steps
// (flop_count events, one a rank: FlopCounterMode around the step) beside
// the analytic model's. Per token, over the samples every rank counted:
// Σ the ranks' counts ÷ the steps' tokens (each rank counts its own share
// of its replica's work, so the sum over ranks is the cluster's).
type CountedFLOPs struct {
	Samples  int     `json:"samples"`
	PerToken float64 `json:"per_token"`
	// Recompute: activations were recomputed in the samples
	// (checkpointing): the count is hardware FLOPs, compared with the
	// analytic hardware FLOPs, and gives HFU but not MFU.
	Recompute bool `json:"recompute,omitempty"`
	// AnalyticPerToken is the model's over the same steps (hardware
	// FLOPs with Recompute); Gap the count's distance from it
	// (counted ÷ analytic − 1); Flagged when above 5% either way.
	AnalyticPerToken *float64 `json:"analytic_per_token,omitempty"`
	Gap              *float64 `json:"gap,omitempty"`
	Flagged          bool     `json:"flagged,omitempty"`
	// MFU and HFU from the count, over the run's steady steps (TPS), for
	// the GPU's peak: MFU only without recomputation. Unknown says why
	// they are absent.
	MFU     *float64 `json:"mfu,omitempty"`
	HFU     *float64 `json:"hfu,omitempty"`
	Unknown string   `json:"unknown,omitempty"`
	// Partial counts samples left out: not every rank counted them, they
	// had no tokens, or they held a generation phase.
	Partial int `json:"partial,omitempty"`
	// Slowdown is what counting cost: the samples' mean step time over
	// the steady steps' mean (0: not known).
	Slowdown float64 `json:"slowdown,omitempty"`
}

// countedGapFlag is the distance from the analytic FLOPs above which the
// report flags the count.
const countedGapFlag = 0.05

// flopSample is one sampled step: the ranks' counts from the events, the
// step's tokens and analytic FLOPs from its cluster row.
type flopSample struct {
	flops             float64
	ranks             int64
	recompute         bool
	generation        bool
	seen              bool // its cluster row was read
	tokens, world     int64
	stepNs            int64
	analytic          float64
	reportedEveryRank bool
}

// flopsAcc gathers the samples (from the events, before the cluster
// pass) and their steps' rows (during it).
type flopsAcc struct {
	samples map[[2]int64]*flopSample
	bad     int
}

// maxFlopSamples bounds what a run's events can make the report keep.
const maxFlopSamples = 1 << 16

func newFlopsAcc(events []tps.Event) *flopsAcc {
	var a *flopsAcc
	for _, e := range events {
		if e.Kind != tps.EventFlopCount {
			continue
		}
		if a == nil {
			a = &flopsAcc{samples: map[[2]int64]*flopSample{}}
		}
		f, err := tps.ParseFlopCount(e.Detail)
		if err != nil {
			a.bad++
			continue
		}
		k := [2]int64{e.Attempt, e.Step}
		s := a.samples[k]
		if s == nil {
			if len(a.samples) >= maxFlopSamples {
				continue
			}
			s = &flopSample{}
			a.samples[k] = s
		}
		s.flops += f.FLOPs
		s.ranks++
		s.recompute = s.recompute || f.Recompute
		s.generation = s.generation || f.Generation
	}
	return a
}

// sampled are the steps PyTorch counted: out of the statistics, as
// profiled steps are (they ran under the counter).
func (a *flopsAcc) sampled(into map[[2]int64]bool) {
	if a == nil {
		return
	}
	for k := range a.samples {
		if len(into) < 1<<20 {
			into[k] = true
		}
	}
}

func (a *flopsAcc) row(c *tps.ClusterStep) {
	if a == nil {
		return
	}
	if s := a.samples[[2]int64{c.Attempt, c.Step}]; s != nil {
		s.seen, s.tokens, s.world, s.analytic, s.stepNs = true, c.Tokens, c.WorldSize, c.FLOPs, c.StepTimeNs
		s.reportedEveryRank = c.RanksReported >= c.WorldSize
	}
}

// result compares the count with the model (cfg: the run's analytic
// FLOPs, when known) and gives MFU and HFU from it at the run's
// throughput tokPerS for world GPUs of the given peak.
// steadyStepNs is the steady steps' mean step time, for the slowdown.
func (a *flopsAcc) result(cfg tps.AccumulatorConfig, peak float64, peakErr error, tokPerS float64, world int64, steadyStepNs float64) *CountedFLOPs {
	if a == nil {
		return nil
	}
	out := &CountedFLOPs{}
	sum := a.sum(out)
	if out.Samples == 0 {
		out.Unknown = "no sampled step was counted by every rank"
		return out
	}
	out.PerToken = sum.flops / sum.tokens
	if steadyStepNs > 0 && sum.stepNs > 0 {
		out.Slowdown = sum.stepNs / float64(out.Samples) / steadyStepNs
	}
	// the analytic FLOPs of the same steps (their cluster rows'), as
	// hardware FLOPs where the count recomputed activations (the model's
	// recompute setting gives the ratio; without one, no comparison)
	if sum.allAnalytic && (!out.Recompute || (cfg.FLOPsPerToken > 0 && cfg.HWFLOPsPerToken > cfg.FLOPsPerToken)) {
		an := sum.analytic / sum.tokens
		if out.Recompute {
			an *= cfg.HWFLOPsPerToken / cfg.FLOPsPerToken
		}
		gap := out.PerToken/an - 1
		out.AnalyticPerToken, out.Gap = &an, &gap
		out.Flagged = math.Abs(gap) > countedGapFlag
	}
	out.utilisation(peak, peakErr, tokPerS, world)
	return out
}

// flopsSum sums the samples counted by every rank.
type flopsSum struct {
	flops, tokens, analytic, stepNs float64
	allAnalytic                     bool
}

// sum sums the samples every rank counted, and counts them (and the
// others, Partial) into out.
func (a *flopsAcc) sum(out *CountedFLOPs) flopsSum {
	x := flopsSum{allAnalytic: true}
	for _, s := range a.samples {
		if !s.seen || s.tokens <= 0 || s.ranks < s.world || !s.reportedEveryRank || s.generation {
			out.Partial++
			continue
		}
		out.Samples++
		x.flops += s.flops
		x.tokens += float64(s.tokens)
		x.analytic += s.analytic
		x.stepNs += float64(s.stepNs)
		x.allAnalytic = x.allAnalytic && s.analytic > 0
		out.Recompute = out.Recompute || s.recompute
	}
	return x
}

// utilisation sets HFU (and MFU without recomputation) from the count at
// the run's throughput tokPerS over world GPUs of the given peak, or why
// not.
func (out *CountedFLOPs) utilisation(peak float64, peakErr error, tokPerS float64, world int64) {
	switch {
	case peakErr != nil:
		out.Unknown = "no GPU peak: " + peakErr.Error()
	case peak <= 0 || world <= 0 || tokPerS <= 0:
		out.Unknown = "no throughput or GPU peak to divide by"
	default:
		h := out.PerToken * tokPerS / (float64(world) * peak)
		if h > 1 {
			out.Unknown = fmt.Sprintf("the count gives %.0f%% of the GPUs' peak: impossible, not shown", 100*h)
			return
		}
		out.HFU = &h
		if !out.Recompute {
			m := h
			out.MFU = &m
		}
	}
}
