package collector

import "github.com/tpsprof/tpsprof/tps"

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
}

// liveFigures computes the figures over the last k closed steps.
func (s *jobState) liveFigures(k int) windowFigures {
	var sum tps.ShareSum
	var mfu, hfu, mfuSec float64
	n := len(s.recent)
	k = min(k, n)
	var world int64
	for i := n - k; i < n; i++ {
		r := &s.recent[(s.recentNext+i)%n] // the ring from its oldest row (recentNext is 0 until it fills)
		sum.Add(r)
		world = max(world, r.WorldSize)
		if r.MFUUnknown == "" && r.MFU > 0 && r.StepTimeNs > 0 {
			w := float64(r.StepTimeNs) / 1e9
			mfu, hfu, mfuSec = mfu+w*r.MFU, hfu+w*r.HFU, mfuSec+w
		}
	}
	f := windowFigures{steps: sum.Steps(), shares: sum.Shares()}
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
