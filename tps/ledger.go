package tps

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Ledger is where a run's MFU went: from the GPUs' peak (100 points) to
// the achieved MFU, every lost point in exactly one bucket. The time
// outside compute costs what that time would have earned at the run's
// efficiency over its compute time (each part's share × ComputeMFU); the
// rest of the gap is compute efficiency (1 − ComputeMFU: kernels below the
// peak, non-tensor work, launch gaps inside compute). So
//
//	MFU + Σ parts' points + compute efficiency = 100
//
// exactly (MFU = compute share × ComputeMFU). Points are percentage
// points of the peak.
type Ledger struct {
	// MFU is the achieved MFU, in points; ComputeMFU the MFU over compute
	// time alone (a fraction).
	MFU        float64 `json:"mfu_points"`
	ComputeMFU float64 `json:"compute_mfu"`
	// Lost are the buckets, the breakdown's parts but compute in their
	// order, then compute efficiency (key "compute_efficiency").
	Lost []LedgerBucket `json:"lost"`
}

// LedgerBucket is one bucket of lost MFU points.
type LedgerBucket struct {
	Key    string  `json:"key"`
	Label  string  `json:"label"`
	Points float64 `json:"points"`
}

// ComputeEfficiency is the key of the ledger's last bucket.
const ComputeEfficiency = "compute_efficiency"

// MFULedger is the ledger of an MFU over steps whose time went as shares
// says; an error says why there is none (a compute share of 0, or an MFU
// over compute time that cannot be: above 100%).
func MFULedger(mfu float64, shares Shares) (Ledger, error) {
	switch {
	case math.IsNaN(mfu) || mfu < 0 || mfu > 1:
		return Ledger{}, fmt.Errorf("MFU %v is not a fraction", mfu)
	case shares.Compute <= 0:
		return Ledger{}, fmt.Errorf("no compute time in the breakdown")
	}
	c := mfu / shares.Compute
	if c > 1 {
		return Ledger{}, fmt.Errorf("MFU over compute time would be %.0f%% (MFU %.1f%% in %.1f%% of the time computing): the model's FLOPs or the peak are off", 100*c, 100*mfu, 100*shares.Compute)
	}
	l := Ledger{MFU: 100 * mfu, ComputeMFU: c}
	for _, p := range shareParts {
		if p.Key == "compute" {
			continue
		}
		l.Lost = append(l.Lost, LedgerBucket{p.Key, p.Label, 100 * *p.Of(&shares) * c})
	}
	l.Lost = append(l.Lost, LedgerBucket{ComputeEfficiency, "compute efficiency", 100 * (1 - c)})
	return l, nil
}

// Sum is the achieved MFU and every lost point added up (100 for a whole
// ledger).
func (l Ledger) Sum() float64 {
	t := l.MFU
	for _, b := range l.Lost {
		t += b.Points
	}
	return t
}

// TimeLoss is a part of step time that could go (a breakdown part other
// than compute, or a split of compute such as Python GC), with what the
// throughput would gain without it.
type TimeLoss struct {
	Key, Label string
	// Share is its share of step time; HeadroomPct the throughput's gain,
	// in percent, were the time removed: 1/(1 − share) − 1.
	Share       float64
	HeadroomPct float64
}

// MinLossShare is the smallest share of step time a TimeLoss is named at.
const MinLossShare = 0.01

// TimeLosses are the parts of step time that could go, largest headroom
// first: the breakdown's parts but compute, and the splits of compute
// (their time is not any other part's: no two claim the same time), each
// at least MinLossShare.
func TimeLosses(s Shares) []TimeLoss {
	var out []TimeLoss
	add := func(key, label string, share float64) {
		if share >= MinLossShare && share < 1 {
			out = append(out, TimeLoss{key, label, share, 100 * (1/(1-share) - 1)})
		}
	}
	for _, p := range shareParts {
		if p.Key != "compute" {
			add(p.Key, p.Label, *p.Of(&s))
		}
	}
	for _, sp := range ShareSplits() {
		if sp.Part == "compute" {
			add(sp.Name, sp.Label, s.Splits[sp.Name])
		}
	}
	slices.SortStableFunc(out, func(a, b TimeLoss) int { return cmp.Compare(b.HeadroomPct, a.HeadroomPct) })
	return out
}

// ExplainsShare is how much of its bucket a cause must explain to be
// named (TraceML's rule, which tpsprof's capture uses too): below it a
// finding says where the time went, not why.
const ExplainsShare = 0.8

// WaitersShare is the share of their step time the ranks that waited
// spent waiting, from the mean over all world ranks (mean), where k
// critical ranks (one rank, or one node's) explain the waiting: the mean
// counts the critical ranks, which do not wait, so it understates what
// the others would gain were the critical ones as fast (two ranks, one
// 30 ms slower in a 60 ms step: the mean waiting is 25%, the other's
// 50%, and the step would take half as long: +100%, not +33%;
// examples/pytorch/causes.py). ok is false where it cannot say (no
// waiting, every rank critical). At most 0.99.
func WaitersShare(mean float64, world, k int) (share float64, ok bool) {
	k = max(k, 1)
	if world <= k || mean <= 0 {
		return 0, false
	}
	return min(mean*float64(world)/float64(world-k), 0.99), true
}
