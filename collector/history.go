package collector

import "github.com/tpsprof/tpsprof/tps"

// historyBuckets bounds the whole-run series of the live page.
const historyBuckets = 512

// runHistory keeps a job's whole run for the live page in at most
// historyBuckets buckets of consecutive closed steps, halving its
// resolution (merging neighbours) when full: memory is fixed however long
// the run, and a drop late in a long run stays visible.
type runHistory struct {
	b     []bucket
	width int // closed steps per bucket
	seq   int64
}

type bucket struct {
	seq, step          int64 // ordinal and step number of its first closed step
	n, mfuN            int
	tps, mfu, comm, st float64 // sums
}

func (h *runHistory) add(s tps.ClusterStep) {
	if h.width == 0 {
		h.width = 1
	}
	if len(h.b) == 0 || h.b[len(h.b)-1].n >= h.width {
		if len(h.b) == historyBuckets {
			for i := 0; i < len(h.b)/2; i++ {
				a, c := h.b[2*i], h.b[2*i+1]
				h.b[i] = bucket{seq: a.seq, step: a.step, n: a.n + c.n, mfuN: a.mfuN + c.mfuN,
					tps: a.tps + c.tps, mfu: a.mfu + c.mfu, comm: a.comm + c.comm, st: a.st + c.st}
			}
			h.b = h.b[:len(h.b)/2]
			h.width *= 2
		}
		h.b = append(h.b, bucket{seq: h.seq, step: s.Step})
	}
	x := &h.b[len(h.b)-1]
	x.n++
	x.tps += s.TPS
	x.comm += s.CommFractionMean
	x.st += float64(s.StepTimeNs) / 1e9
	if m := knownMFU(s); m != nil {
		x.mfu += *m
		x.mfuN++
	}
	h.seq++
}

// series is the whole run as LiveSteps (means over each bucket).
func (h *runHistory) series() []LiveStep {
	out := make([]LiveStep, 0, len(h.b))
	for _, x := range h.b {
		n := float64(x.n)
		s := LiveStep{Seq: x.seq, Step: x.step, Steps: x.n, TPS: x.tps / n, Comm: x.comm / n, StepTimeS: x.st / n}
		if x.mfuN == x.n {
			m := x.mfu / n
			s.MFU = &m
		}
		out = append(out, s)
	}
	return out
}
