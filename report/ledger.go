package report

import (
	"fmt"
	"math"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// MFULedger is where the steady steps' MFU went (tps.Ledger: from the
// peak, 100 points, to the achieved MFU, each lost point in one bucket),
// with the GPUs' own account of the same steps beside it where they give
// one: how busy their tensor pipes and SMs were (NVML's GPM metrics, the
// agent's gpm_* columns of gpu_samples), averaged over the samples taken
// during the steady steps (or within GPMSlackNs after one ended: a GPM
// figure describes the interval before its sample). MFU beside tensor activity tells "few FLOPs
// because the GPU idles" from "busy, but on non-tensor work".
type MFULedger struct {
	// Ledger is nil when there is none; Unknown says why.
	Ledger  *tps.Ledger `json:"ledger"`
	Unknown string      `json:"unknown,omitempty"`
	// TensorActivity and SMActivity are fractions (GPM's tensor pipe and
	// SM activity, mean over the samples in the steady steps); nil with
	// GPMUnavailable saying why (never 0 for unmeasured).
	TensorActivity *float64 `json:"tensor_activity"`
	SMActivity     *float64 `json:"sm_activity"`
	DRAMBandwidth  *float64 `json:"dram_bandwidth"`
	GPMSamples     int64    `json:"gpm_samples"`
	GPMUnavailable string   `json:"gpm_unavailable,omitempty"`
}

// gpmAcc sums the GPM figures of the samples taken during steady steps.
type gpmAcc struct {
	tensor, sm, dram    float64
	nTensor, nSM, nDRAM int64
	samples             int64 // samples in steady steps, GPM or not
}

func (g *gpmAcc) add(s *tps.GPUSample) {
	g.samples++
	for _, x := range []struct {
		v   *float64
		sum *float64
		n   *int64
	}{{s.GPMTensorPct, &g.tensor, &g.nTensor}, {s.GPMSMUtilPct, &g.sm, &g.nSM}, {s.GPMDRAMBWPct, &g.dram, &g.nDRAM}} {
		if x.v != nil && *x.v >= 0 && *x.v <= 100 {
			*x.sum += *x.v / 100
			*x.n++
		}
	}
}

// ledger sets rep.MFULedger from the summary's MFU and breakdown and the
// GPM samples of the steady steps (nil: no gpu_samples).
func (rep *Report) ledger(g *gpmAcc) {
	l := &rep.MFULedger
	switch s := rep.Summary; {
	case s.SteadySteps == 0:
		l.Unknown = "no steady steps"
	case s.MFU == nil:
		l.Unknown = "MFU unknown: " + s.MFUUnknown
	default:
		led, err := tps.MFULedger(*s.MFU, rep.Breakdown.Shares)
		if err != nil {
			l.Unknown = err.Error()
		} else {
			l.Ledger = &led
		}
	}
	switch {
	case g == nil || rep.GPUSamples == 0:
		l.GPMUnavailable = "no GPU samples (no agent sampled the GPUs, or a CPU job)"
	case g.samples == 0:
		l.GPMUnavailable = "no GPU sample fell in the steady steps"
	case g.nTensor == 0 && g.nSM == 0:
		l.GPMUnavailable = "the GPUs report no GPM metrics (before Hopper, or GPM off in the agent)"
	default:
		l.GPMSamples = max(g.nTensor, g.nSM)
		mean := func(sum float64, n int64) *float64 {
			if n == 0 {
				return nil
			}
			v := sum / float64(n)
			return &v
		}
		l.TensorActivity, l.SMActivity, l.DRAMBandwidth = mean(g.tensor, g.nTensor), mean(g.sm, g.nSM), mean(g.dram, g.nDRAM)
	}
}

// LedgerText is the ledger on a line: "38.7 of 100 points: compute
// efficiency −44.6, exposed comm −7.9, ..." (buckets under 0.05 points
// left out of the words, not of the sum), the GPUs' activity after it.
func LedgerText(l MFULedger) string {
	var b strings.Builder
	if l.Ledger == nil {
		b.WriteString("n/a: " + l.Unknown)
	} else {
		fmt.Fprintf(&b, "MFU %.1f of 100 points; lost:", l.Ledger.MFU)
		sep := " "
		for _, x := range l.Ledger.Lost {
			if x.Points < 0.05 {
				continue
			}
			fmt.Fprintf(&b, "%s%s %.1f", sep, x.Label, x.Points)
			sep = ", "
		}
	}
	b.WriteString(" | " + gpmText(l))
	return b.String()
}

func gpmText(l MFULedger) string {
	if l.GPMUnavailable != "" {
		return "tensor activity unavailable: " + l.GPMUnavailable
	}
	var w []string
	if l.TensorActivity != nil {
		w = append(w, "tensor pipes "+pct(*l.TensorActivity)+" active")
	}
	if l.SMActivity != nil {
		w = append(w, "SMs "+pct(*l.SMActivity))
	}
	if l.DRAMBandwidth != nil {
		w = append(w, "DRAM bandwidth "+pct(*l.DRAMBandwidth))
	}
	return strings.Join(w, ", ") + fmt.Sprintf(" (GPM, %d samples in the steady steps)", l.GPMSamples)
}

// ledgerAddsUp: a ledger's MFU and lost points add up to 100 within 0.5.
func ledgerAddsUp(l MFULedger) error {
	if l.Ledger == nil {
		return nil
	}
	if s := l.Ledger.Sum(); math.IsNaN(s) || math.Abs(s-100) > 0.5 {
		return fmt.Errorf("MFU ledger adds up to %.2f points, not 100", s)
	}
	for _, x := range l.Ledger.Lost {
		if x.Points < -1e-9 || x.Points > 100 {
			return fmt.Errorf("MFU ledger: %s %.2f points", x.Key, x.Points)
		}
	}
	return nil
}
