package collector

import (
	"github.com/tpsprof/tpsprof/tps"
)

// countedFLOPs is a job's FLOPs as PyTorch counted them on sampled steps
// (flop_count events, one a rank), live: the latest sample every rank
// counted gives FLOPs a trained token (Σ the ranks' counts ÷ the step's
// tokens, as the report's CountedFLOPs), from which the live figures take
// MFU (HFU where activations were recomputed) when the job declares no
// model: the live line, page, /metrics and the trackers said "MFU n/a"
// for a job whose report had it. Its job's lock guards it.
type countedFLOPs struct {
	samples   map[[2]int64]*countedSample // (attempt, step) → the ranks' counts so far
	perToken  float64                     // the latest complete sample's; 0 before one
	recompute bool
}

type countedSample struct {
	flops      float64
	ranks      int64
	recompute  bool
	generation bool
}

// maxCountedSamples bounds the samples a job keeps waiting for their ranks
// or their cluster row (a hostile rank's events cannot grow it).
const maxCountedSamples = 64

// addCount takes a flop_count event.
func (s *jobState) addCount(e *tps.Event) {
	f, err := tps.ParseFlopCount(e.Detail)
	if err != nil {
		return
	}
	if s.counted.samples == nil {
		s.counted.samples = map[[2]int64]*countedSample{}
	}
	k := [2]int64{e.Attempt, e.Step}
	c := s.counted.samples[k]
	if c == nil {
		if len(s.counted.samples) >= maxCountedSamples {
			for old := range s.counted.samples { // drop one: the oldest are long complete or never will be
				delete(s.counted.samples, old)
				break
			}
		}
		c = &countedSample{}
		s.counted.samples[k] = c
	}
	c.flops += f.FLOPs
	c.ranks++
	c.recompute = c.recompute || f.Recompute
	c.generation = c.generation || f.Generation
	// its step may have closed already
	for i := range s.recent {
		if r := &s.recent[i]; r.Attempt == e.Attempt && r.Step == e.Step {
			s.countedRow(r)
		}
	}
}

// countedRow takes a closed cluster row: a sample of its step that every
// rank counted becomes the job's FLOPs a token.
func (s *jobState) countedRow(row *tps.ClusterStep) {
	k := [2]int64{row.Attempt, row.Step}
	c := s.counted.samples[k]
	if c == nil || c.ranks < row.WorldSize {
		return
	}
	delete(s.counted.samples, k)
	if c.generation || row.Tokens <= 0 || c.flops <= 0 {
		return
	}
	s.counted.perToken, s.counted.recompute = c.flops/float64(row.Tokens), c.recompute
}

// countedUtilisation is MFU (nil with recomputation) and HFU from the
// counted FLOPs a token at tokensPerS over world GPUs; ok is false where
// there is no count, no peak, or tokens are not the job's (its declared
// topology does not match its world size: tokens were counted per rank).
func (s *jobState) countedUtilisation(tokensPerS float64, world int64) (m, h *float64, ok bool) {
	if s.counted.perToken <= 0 || tokensPerS <= 0 || world <= 0 {
		return nil, nil, false
	}
	if tp := s.meta.Topology; tp != (tps.Topology{}) && tp.Validate(int(world)) != nil {
		return nil, nil, false
	}
	peak, err := s.meta.Peak(s.gpuSeen)
	if err != nil || peak <= 0 {
		return nil, nil, false
	}
	u := tokensPerS * s.counted.perToken / (float64(world) * peak)
	if !(u > 0 && u <= 1) {
		return nil, nil, false // a figure that cannot be right is not shown
	}
	hv := u
	h = &hv
	if !s.counted.recompute {
		mv := u
		m = &mv
	}
	return m, h, true
}
