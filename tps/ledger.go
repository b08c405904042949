package tps

import (
	"fmt"
	"math"
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
