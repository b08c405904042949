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
	seq, step int64 // ordinal and step number of its first closed step
	n, mfuN   int
	// sums: tokens, step time (s), and the MFU and exposed communication
	// share each weighted by its step's time, so a bucket's figures are
	// tokens over time and time-weighted shares, as the report's are
	tokens, st, mfu, comm float64
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
					tokens: a.tokens + c.tokens, mfu: a.mfu + c.mfu, comm: a.comm + c.comm, st: a.st + c.st}
			}
			h.b = h.b[:len(h.b)/2]
			h.width *= 2
		}
		h.b = append(h.b, bucket{seq: h.seq, step: s.Step})
	}
	x := &h.b[len(h.b)-1]
	x.n++
	w := max(float64(s.StepTimeNs)/1e9, 0)
	x.tokens += float64(s.Tokens)
	x.comm += w * s.Shares().ExposedComm
	x.st += w
	if m := knownMFU(s); m != nil {
		x.mfu += w * *m
		x.mfuN++
	}
	h.seq++
}

// series is the whole run as LiveSteps (each bucket's tokens over its
// step time, its shares weighted by step time, its mean step time).
func (h *runHistory) series() []LiveStep {
	out := make([]LiveStep, 0, len(h.b))
	for _, x := range h.b {
		n := float64(x.n)
		s := LiveStep{Seq: x.seq, Step: x.step, Steps: x.n, StepTimeS: x.st / n}
		if x.st > 0 {
			s.TPS, s.Comm = x.tokens/x.st, x.comm/x.st
		}
		if x.mfuN == x.n && x.st > 0 {
			m := x.mfu / x.st
			s.MFU = &m
		}
		out = append(out, s)
	}
	return out
}
