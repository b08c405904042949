package collector

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// LiveWindowSteps is how many of a job's last closed steps its live
// figures cover: the live line, the live page's figures and breakdown,
// and the throughput and share gauges of /metrics.
const LiveWindowSteps = 10

// windowFigures are a job's figures over its last closed steps, the one
// live model every live view formats: throughput as tokens over step
// time (never a mean of per-step rates), MFU weighted by step time, and
// the breakdown as tps.ShareSum gives it (its parts add up to 1).
type windowFigures struct {
	steps       int
	tps, perGPU float64
	tpsUnknown  string // why there is no throughput ("": there is)
	mfu, hfu    *float64
	// counted: mfu and hfu are from the FLOPs PyTorch counted (the job
	// declares no model), not the analytic model's
	counted bool
	shares  tps.Shares
	world   int64
	// waitK ranks (one rank, or one node's) explain the window's waiting
	// for slower peers (tps.ExplainsShare of it), named waitWho: the
	// waiting finding's headroom is the waiters' share (tps.WaitersShare),
	// as the report's (0: none does)
	waitK   int
	waitWho string
}

// liveFigures computes the figures over the last k closed steps.
func (s *jobState) liveFigures(k int) windowFigures {
	var sum tps.ShareSum
	var mfu, hfu, mfuSec float64
	n := len(s.recent)
	k = min(k, n)
	var world int64
	var waits waitersOf
	for i := n - k; i < n; i++ {
		r := &s.recent[(s.recentNext+i)%n] // the ring from its oldest row (recentNext is 0 until it fills)
		sum.Add(r)
		waits.add(r)
		world = max(world, r.WorldSize)
		if r.MFUUnknown == "" && r.MFU > 0 && r.StepTimeNs > 0 {
			w := float64(r.StepTimeNs) / 1e9
			mfu, hfu, mfuSec = mfu+w*r.MFU, hfu+w*r.HFU, mfuSec+w
		}
	}
	f := windowFigures{steps: sum.Steps(), shares: sum.Shares(), world: world}
	f.waitK, f.waitWho = waits.explained(s.rankNode, len(s.nodes) > 1)
	if t, ok := sum.TPS(); ok {
		f.tps = t
		if world > 0 {
			f.perGPU = t / float64(world)
		}
	} else {
		f.tpsUnknown = tps.NoTokens
	}
	if mfuSec > 0 {
		m, h := mfu/mfuSec, hfu/mfuSec
		f.mfu, f.hfu = &m, &h
	} else if f.tpsUnknown == "" {
		if m, h, ok := s.countedUtilisation(f.tps, world); ok {
			f.mfu, f.hfu, f.counted = m, h, true
		}
	}
	return f
}

// ledger is where the window's MFU went (tps.MFULedger over its MFU and
// breakdown); nil with the reason where there is none.
func (f *windowFigures) ledger() (*tps.Ledger, string) {
	if f.mfu == nil {
		return nil, "MFU unknown"
	}
	l, err := tps.MFULedger(*f.mfu, f.shares)
	if err != nil {
		return nil, err.Error()
	}
	return &l, ""
}

// waitersOf charges a window's waiting for slower peers to each step's
// critical rank, as the report charges its steady steps' (by node, or by
// rank where the job runs on one node).
type waitersOf struct {
	by  map[int64]float64 // critical rank → waiting (ns, mean over ranks × step time)
	all float64
}

func (w *waitersOf) add(r *tps.ClusterStep) {
	v := r.WaitFractionMean * float64(r.StepTimeNs)
	if v <= 0 || r.SlowestRank < 0 {
		return
	}
	if w.by == nil {
		w.by = map[int64]float64{}
	}
	w.by[r.SlowestRank] += v
	w.all += v
}

// explained is the critical ranks (how many) and who they are, of the
// rank or node that explains tps.ExplainsShare of the waiting (0 and ""
// where none does).
func (w *waitersOf) explained(rankNode []string, multiNode bool) (int, string) {
	if w.all <= 0 {
		return 0, ""
	}
	if !multiNode {
		for r, v := range w.by {
			if v >= tps.ExplainsShare*w.all {
				return 1, fmt.Sprintf("rank %d", r)
			}
		}
		return 0, ""
	}
	byNode := map[string]float64{}
	ranks := map[string]int{}
	for r, v := range w.by {
		node := ""
		if r < int64(len(rankNode)) {
			node = rankNode[r]
		}
		if node == "" {
			node = fmt.Sprintf("rank %d", r) // (a rank that named no node: alone)
		}
		byNode[node] += v
		ranks[node]++
	}
	for node, v := range byNode {
		if v >= tps.ExplainsShare*w.all {
			if strings.HasPrefix(node, "rank ") {
				return 1, node
			}
			return ranks[node], "node " + node
		}
	}
	return 0, ""
}

// findings are the window's time losses (tps.TimeLosses), largest
// headroom first; the waiting for slower peers, where one rank or node
// explains it, gains what its waiters would (tps.WaitersShare), as the
// report's finding does.
func (f *windowFigures) findings() []LiveFinding {
	var out []LiveFinding
	for _, l := range tps.TimeLosses(f.shares) {
		lf := LiveFinding{Key: l.Key, Label: l.Label, Share: l.Share, HeadroomPct: l.HeadroomPct}
		if l.Key == "waiting_for_peers" && f.waitK > 0 {
			if w, ok := tps.WaitersShare(l.Share, int(f.world), f.waitK); ok {
				lf.HeadroomPct, lf.Who = 100*(1/(1-w)-1), f.waitWho
			}
		}
		out = append(out, lf)
	}
	slices.SortStableFunc(out, func(a, b LiveFinding) int { return cmp.Compare(b.HeadroomPct, a.HeadroomPct) })
	return out
}
