package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// ExplainsShare is how much of its bucket a cause must explain to be
// named (TraceML's rule, which tpsprof's capture uses too): below it a
// finding says where the time went, not why.
const ExplainsShare = 0.8

// Finding is one place the run's throughput goes, with what removing it
// would gain: a part of step time (the breakdown's parts but compute, and
// compute's splits such as Python GC) or a gap between steps (evaluation,
// restarts, the profiler's stop), each time claimed by one finding only.
type Finding struct {
	// Bucket is the breakdown part's key, the split's measure name, or
	// the badput cause of a gap.
	Bucket string `json:"bucket"`
	// What is the finding in words; Cause the cause named where one
	// explains at least ExplainsShare of the bucket ("" where none does);
	// Evidence the figures behind it.
	What     string `json:"what"`
	Cause    string `json:"cause,omitempty"`
	Evidence string `json:"evidence,omitempty"`
	// Share is the bucket's share of step time (of the elapsed time for a
	// gap); HeadroomPct the throughput's gain were it removed (of step
	// TPS; of wall TPS for a gap) and HeadroomTPS that gain in tokens/s.
	Share       float64  `json:"share"`
	HeadroomPct float64  `json:"headroom_pct"`
	HeadroomTPS *float64 `json:"headroom_tps"`
	Gap         bool     `json:"gap,omitempty"`
}

// gapCauses are the badput causes between steps a finding names (their
// time is no step's: the step-time findings never claim it).
var gapCauses = []struct{ key, what string }{
	{BadEval, "evaluation between steps"},
	{BadRestart, "restarts (from an attempt's last step to the next attempt's start)"},
	{BadRedone, "steps redone after restarts"},
	{BadProfiling, "the profiler's stop after traced steps"},
}

// findings sets rep.Findings, largest headroom first.
func (rep *Report) findings() {
	s := rep.Summary
	if s.SteadySteps == 0 {
		return
	}
	for _, l := range tps.TimeLosses(rep.Breakdown.Shares) {
		f := Finding{Bucket: l.Key, Share: l.Share, HeadroomPct: l.HeadroomPct,
			What: fmt.Sprintf("%s %s of step time", l.Label, pct(l.Share))}
		if s.TPSUnknown == "" {
			v := s.AggregateTPS * l.HeadroomPct / 100
			f.HeadroomTPS = &v
		}
		f.Cause, f.Evidence = rep.causeOf(l.Key)
		rep.Findings = append(rep.Findings, f)
	}
	g := rep.Goodput
	for _, c := range gapCauses {
		b := g.BadputS[c.key]
		if g.ElapsedS <= 0 || b/g.ElapsedS < tps.MinLossShare || b >= g.ElapsedS {
			continue
		}
		share := b / g.ElapsedS
		f := Finding{Bucket: c.key, Share: share, HeadroomPct: 100 * (1/(1-share) - 1), Gap: true,
			What: fmt.Sprintf("%s %s of the elapsed time", c.what, pct(share)), Evidence: fmt.Sprintf("%s of %s elapsed", dur(b), dur(g.ElapsedS))}
		if s.WallTPS > 0 && s.TPSUnknown == "" {
			v := s.WallTPS * f.HeadroomPct / 100
			f.HeadroomTPS = &v
		}
		rep.Findings = append(rep.Findings, f)
	}
	// largest headroom first (step and gap findings together)
	slices.SortStableFunc(rep.Findings, func(a, b Finding) int { return cmp.Compare(b.HeadroomPct, a.HeadroomPct) })
}

// causeOf names what explains a bucket, where one thing explains at
// least ExplainsShare of it, with the figures behind it.
func (rep *Report) causeOf(key string) (cause, evidence string) {
	b := rep.Breakdown
	switch key {
	case "waiting_for_peers":
		if len(rep.WaitCharged) == 0 {
			return "", ""
		}
		w := rep.WaitCharged[0]
		who := waitedFor(w)
		evidence = fmt.Sprintf("%s of the waiting charged to %s, critical in %d steps", pct(w.Share), who, w.Steps)
		if w.Share >= ExplainsShare {
			cause = "the others wait for " + who
			if w.Cause != "" {
				cause += ": " + w.Cause
			}
		}
	case "exposed_comm":
		evidence = fmt.Sprintf("%s of communication hidden behind compute", pct(b.CommOverlap))
		if b.CommOverlap <= 1-ExplainsShare {
			cause = "communication is not overlapped with compute (bucketed gradients, prefetch, or async collectives would hide it)"
		}
	case "bubble":
		if t := b.BubbleTheoretical; t > 0 {
			evidence = fmt.Sprintf("the schedule's own bubble is %s", pct(t))
			if t >= ExplainsShare*b.Bubble {
				cause = "the pipeline schedule itself: too few microbatches for its stages (more microbatches, or an interleaved schedule)"
			}
		}
	case "data_stall":
		if m := rep.Meta; m != nil {
			if src, ok := tps.DataSourceText(m.DataSource); ok {
				evidence = "data wait: " + src
			}
		}
		if len(rep.WaitCharged) > 0 && strings.Contains(rep.WaitCharged[0].Cause, "data") && rep.WaitCharged[0].Share >= ExplainsShare {
			// the rank the others wait for waits for its data: its loader
			// (the others' waiting for it is the waiting finding's time)
			cause = "the input pipeline of " + waitedFor(rep.WaitCharged[0]) + ", which waits for data longer than the others (and makes them wait)"
		}
	case "checkpoint":
		cause = "saving checkpoints inside steps (asynchronous checkpointing takes it off the step)"
	case "gc_ns":
		cause = "Python's garbage collector on the training thread (gc.freeze() after setup, or automatic collection off with a collection every N steps)"
	}
	return cause, evidence
}

// waitedFor names whom a waiting share is charged to: a rank (one node)
// or a node with its ranks.
func waitedFor(w WaitShare) string {
	if w.ByRank {
		return fmt.Sprintf("rank %s on %s", rankList(w.Ranks), orDash(w.Node))
	}
	return fmt.Sprintf("node %s (ranks %s)", w.Node, rankList(w.Ranks))
}

// FindingText is a finding on a line.
func FindingText(f Finding) string {
	var b strings.Builder
	b.WriteString(f.What)
	if f.HeadroomTPS != nil {
		fmt.Fprintf(&b, ": +%.1f%% (%s tokens/s) without it", f.HeadroomPct, tps.SI(*f.HeadroomTPS))
	} else {
		fmt.Fprintf(&b, ": +%.1f%% without it", f.HeadroomPct)
	}
	if f.Cause != "" {
		b.WriteString("; cause: " + f.Cause)
	}
	if f.Evidence != "" {
		b.WriteString(" (" + f.Evidence + ")")
	}
	return b.String()
}
