package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// ExplainsShare is how much of its bucket a cause must explain to be
// named (tps.ExplainsShare).
const ExplainsShare = tps.ExplainsShare

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
	{BadCheckpoint, "checkpoints between steps"},
	{BadRestart, "restarts (from an attempt's last step to the next attempt's start)"},
	{BadRedone, "steps redone after restarts"},
	{BadProfiling, "the profiler's stop after traced steps"},
}

// waiters is the share of step time the ranks that waited spent waiting
// (tps.WaitersShare), where one rank or node explains the waiting (its
// cause named); k is how many of its ranks were critical.
func (rep *Report) waiters() (share float64, k int, ok bool) {
	if len(rep.WaitCharged) == 0 || rep.WaitCharged[0].Share < ExplainsShare {
		return 0, 0, false
	}
	k = max(len(rep.WaitCharged[0].Ranks), 1)
	share, ok = tps.WaitersShare(rep.Breakdown.Shares.WaitingForPeers, int(rep.Summary.WorldSize), k)
	return share, k, ok
}

// findings sets rep.Findings, largest headroom first.
func (rep *Report) findings() {
	s := rep.Summary
	if s.SteadySteps == 0 {
		return
	}
	losses := tps.TimeLosses(rep.Breakdown.Shares)
	// a slow rank's own data stall and the others' waiting for it are one
	// cause: one finding, the waiting's folded into the data stall's
	merged := rep.slowRankData() && slices.ContainsFunc(losses, func(l tps.TimeLoss) bool { return l.Key == "data_stall" })
	for _, l := range losses {
		if merged && l.Key == "waiting_for_peers" {
			continue
		}
		f := Finding{Bucket: l.Key, Share: l.Share, HeadroomPct: l.HeadroomPct,
			What: fmt.Sprintf("%s %s of step time", l.Label, pct(l.Share))}
		f.Cause, f.Evidence = rep.causeOf(l.Key)
		if w, k, ok := rep.waiters(); ok && (l.Key == "waiting_for_peers" || (merged && l.Key == "data_stall")) {
			if l.Key == "data_stall" {
				wait := rep.Breakdown.Shares.WaitingForPeers
				f.Share = l.Share + wait
				f.What = fmt.Sprintf("data stall %s of step time, and the others' waiting for it %s", pct(l.Share), pct(wait))
			}
			f.HeadroomPct = max(100*(1/(1-w)-1), f.HeadroomPct)
			if l.Key == "data_stall" {
				// the slow rank's data wait beyond the others' is what its
				// steps would lose: the critical path's part (its excess over
				// the mean rank counts itself in the mean: × n ÷ (n − k)).
				// The others' waiting understates it where their own work
				// hides part of the wait (2 ranks, rank 1 30 ms late in its
				// data: rank 0 waited 49.9% of its step, rank 1's excess
				// was 56%: +99.6% against the job's own +127%)
				if x, T := rep.WaitCharged[0].DataExcessMs/1e3*float64(s.WorldSize)/float64(int(s.WorldSize)-k), s.StepTimeS.Mean; x > 0 && T > 0 {
					f.HeadroomPct = 100 * (T/(T-min(x, 0.99*T)) - 1)
				}
			}
			f.Evidence += fmt.Sprintf("; the %d other ranks wait %s of their step time (the mean over ranks counts the %d that do not)",
				int(s.WorldSize)-k, pct(w), k)
		}
		if l.Key == "bubble" && rep.leastPPSteps > 0 && s.StepTimeS.Mean > 0 {
			// the step without its bubble loses what its least-waiting
			// stage waits (the others' waits beyond it are on no critical
			// path): the mean over ranks overstated it (a 2-stage GPipe of
			// 2 micro-batches: +45.6% against the job's own +26.3%)
			least := min(rep.leastPP/1e9/s.StepTimeS.Mean, 0.99)
			f.HeadroomPct = 100 * (1/(1-least) - 1)
			f.Evidence += fmt.Sprintf("; its least-waiting stage waits %s of the step", pct(least))
		}
		if s.TPSUnknown == "" {
			v := s.AggregateTPS * f.HeadroomPct / 100
			f.HeadroomTPS = &v
		}
		rep.Findings = append(rep.Findings, f)
	}
	g := rep.Goodput
	// a gap's share is of the steps' wall span, the time wall TPS is over
	// (the launches' start-up and shutdown are not time the job's steps
	// could have: 11.9% of 7.0 s elapsed for an evaluation that took half
	// the span of the steps)
	span := g.ElapsedS
	if w := float64(s.WallToUnixNs-s.WallFromUnixNs) / 1e9; w > 0 {
		span = w
	}
	for _, c := range gapCauses {
		b, of, what, ofWhat := g.BadputS[c.key], span, "the steps' wall time", "%s of the steps' %s"
		if c.key == BadCheckpoint || c.key == BadEval || c.key == BadProfiling {
			// the gaps before steady steps: the warm-up's lie before the span
			// (a save inside a step is the checkpoint part's)
			b = g.steadyGapS[c.key]
		}
		if c.key == BadRestart || c.key == BadRedone {
			of, what, ofWhat = g.ElapsedS, "the elapsed time", "%s of %s elapsed" // (restarts lie between the attempts' spans)
		}
		if of <= 0 || b/of < tps.MinLossShare || b >= of {
			continue
		}
		share := b / of
		f := Finding{Bucket: c.key, Share: share, HeadroomPct: 100 * (1/(1-share) - 1), Gap: true,
			What: fmt.Sprintf("%s %s of %s", c.what, pct(share), what), Evidence: fmt.Sprintf(ofWhat, dur(b), dur(of))}
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
			if g := rep.gpuCauseOf(w.Node); g != "" {
				cause += "; its " + g
			}
		}
	case "exposed_comm":
		if m := rep.Meta; m != nil && m.Unmeasured["communication"] != "" {
			// the hidden part was not measured: a 0% overlap is no
			// finding ("not overlapped" in 116 of 120 reports on torch
			// 1.13, clean runs too, beside the note that it is unmeasured)
			evidence = "the overlap is not measured: " + m.Unmeasured["communication"]
			break
		}
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
		if rep.slowRankData() {
			// the rank the others wait for waits for its data: its loader
			// (the others' waiting for it is the waiting finding's time)
			cause = "the input pipeline of " + waitedFor(rep.WaitCharged[0]) + ", which waits for data longer than the others (and makes them wait)"
		}
	case "checkpoint":
		cause = "saving checkpoints inside steps (asynchronous checkpointing takes it off the step)"
	case "host_other":
		if h := b.Shares.Splits["host_ns"]; h > 0 {
			evidence = fmt.Sprintf("the training thread's own CPU work before the forward %s of step time", pct(h))
			if h >= ExplainsShare*b.Shares.Other {
				cause = "host work on the training thread between the optimizer step and the next forward (per-step Python, a batch built on the training thread): DataLoader workers or prefetching take batch work off it"
			}
		}
	case "gc_ns":
		cause = "Python's garbage collector on the training thread (gc.freeze() after setup, or automatic collection off with a collection every N steps)"
	}
	return cause, evidence
}

// gpuCauseOf is what the GPU samples say of node against the other nodes
// in its straggler episodes, where they show clocks throttled or low or
// a throttle reason (the episodes' own cause, its longest episode's):
// a throttled GPU is why its compute was slow ("" where they say nothing
// of the kind, or no episode is the node's).
func (rep *Report) gpuCauseOf(node string) string {
	best := -1
	for i, e := range rep.Episodes {
		if e.Node == node && e.gpuSlow {
			if best < 0 || e.Steps > rep.Episodes[best].Steps {
				best = i
			}
		}
	}
	if best < 0 {
		return ""
	}
	return rep.Episodes[best].Cause
}

// slowRankData says whether the waiting has a named rank or node (≥
// ExplainsShare of it) that waits for its own data longer than the others.
//
// And the waiting must be of the data stall's order (at least half its
// share): where every rank waits for its data alike (a slow input
// pipeline everywhere), the little waiting the step-to-step noise leaves
// is charged to some rank with "data" in its cause, and is not the story
// (a 2-rank job stalled 52% on both ranks read "the input pipeline of
// rank 1", headroom +5.5% from its 2.6% waiting, for +108%).
func (rep *Report) slowRankData() bool {
	sh := rep.Breakdown.Shares
	return len(rep.WaitCharged) > 0 && strings.Contains(rep.WaitCharged[0].Cause, "data") && rep.WaitCharged[0].Share >= ExplainsShare &&
		sh.WaitingForPeers >= 0.5*sh.DataStall
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
