package report

import (
	"cmp"
	"math"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
)

// maxSampleGap is the longest time between two readings of one GPU that
// still speaks for the steps between them (samplers read every second or
// so; across a longer gap, a sampler that stopped, the energy counter's
// increase says how much was used but not in which step).
const maxSampleGap = int64(10e9)

// energyJoin measures the energy of the steady steps again from the whole
// gpu_samples table, as the report reads it: each GPU's energy counter
// (millijoules), interpolated linearly between consecutive readings,
// integrated over each step's period (the step's end less its step time,
// to its end: consecutive periods tile the time, where the cluster rows'
// spans overlap as ranks start at different moments). The live join the
// collector writes into each cluster row takes the samples that reached
// it before the row was written, which varies with arrival order and
// load; this one does not. A step counts when every GPU's readings cover
// its whole period; the run's tokens per joule are over those steps.
// Where the counter is absent or went down (a reset), the mean of the two
// readings' power stands in for the interval.
type energyJoin struct {
	offsets map[string]int64 // node clock offsets: samples onto the rows' clock
	built   bool             // steps sorted (at the first reading)
	steps   []energyStep     // steady steps by period start
	maxEnd  []int64          // running maximum of the ends, in that order
	gpus    map[gpuKey]*gpuReading
	stale   int64 // readings not after the GPU's previous one (skipped)
}

type energyStep struct {
	start, end int64
	tokens     int64
	joules     float64
	covered    int64 // GPU-nanoseconds of the period with readings around them
}

type gpuKey struct {
	node, uuid string
	index      int32
}

type gpuReading struct {
	t      int64
	energy int64   // mJ; -1 when absent
	power  float64 // W; NaN when absent
}

// newEnergyJoinOf is a join with no steps yet (addStep adds them).
func newEnergyJoinOf(offsets map[string]int64) *energyJoin {
	return &energyJoin{offsets: offsets, gpus: map[gpuKey]*gpuReading{}}
}

// addStep takes a step that counts (before the first reading): its
// period, the step time to its end (40 B a step).
func (e *energyJoin) addStep(c *tps.ClusterStep) {
	e.steps = append(e.steps, energyStep{start: c.EndUnixNs - c.StepTimeNs, end: c.EndUnixNs, tokens: c.Tokens})
}

func (e *energyJoin) build() {
	e.built = true
	slices.SortStableFunc(e.steps, func(a, b energyStep) int { return cmp.Compare(a.start, b.start) })
	e.maxEnd = make([]int64, len(e.steps))
	for i, s := range e.steps {
		e.maxEnd[i] = s.end
		if i > 0 {
			e.maxEnd[i] = max(s.end, e.maxEnd[i-1])
		}
	}
}

func (e *energyJoin) add(s *tps.GPUSample) {
	if !e.built {
		e.build()
	}
	if len(e.steps) == 0 {
		return
	}
	cur := gpuReading{t: s.UnixNs - e.offsets[s.Node], energy: -1, power: math.NaN()}
	if s.EnergyMJ != nil && *s.EnergyMJ >= 0 {
		cur.energy = *s.EnergyMJ
	}
	if s.PowerW != nil && *s.PowerW >= 0 && !math.IsInf(*s.PowerW, 0) {
		cur.power = *s.PowerW
	}
	k := gpuKey{s.Node, s.UUID, s.Index}
	last := e.gpus[k]
	if last == nil {
		if len(e.gpus) >= 1<<20 {
			return
		}
		e.gpus[k] = &cur
		return
	}
	if cur.t <= last.t {
		e.stale++
		return
	}
	e.spread(*last, cur)
	*last = cur
}

// spread gives the energy between two readings of one GPU to the steps
// whose periods overlap them.
func (e *energyJoin) spread(a, b gpuReading) {
	span := b.t - a.t
	if span > maxSampleGap {
		return
	}
	var perNs float64 // joules a nanosecond
	switch {
	case a.energy >= 0 && b.energy >= a.energy:
		perNs = float64(b.energy-a.energy) / 1e3 / float64(span)
	case !math.IsNaN(a.power) && !math.IsNaN(b.power):
		perNs = (a.power + b.power) / 2 / 1e9
	case !math.IsNaN(a.power):
		perNs = a.power / 1e9
	case !math.IsNaN(b.power):
		perNs = b.power / 1e9
	default:
		return
	}
	// the first step that may end after a.t, then on while they start before b.t
	i, _ := slices.BinarySearch(e.maxEnd, a.t+1)
	for ; i < len(e.steps) && e.steps[i].start < b.t; i++ {
		st := &e.steps[i]
		ov := min(b.t, st.end) - max(a.t, st.start)
		if ov > 0 {
			st.joules += perNs * float64(ov)
			st.covered += ov
		}
	}
}

// result: the run's energy over the steps every GPU's readings cover, and
// how many steps that is; ok false when none is covered.
func (e *energyJoin) result() (tokensPerJoule float64, steps int, ok bool) {
	n := int64(len(e.gpus))
	if n == 0 {
		return 0, 0, false
	}
	var tokens, joules float64
	for _, s := range e.steps {
		if s.covered < n*(s.end-s.start) {
			continue
		}
		tokens += float64(s.tokens)
		joules += s.joules
		steps++
	}
	if steps == 0 || joules <= 0 || tokens <= 0 {
		return 0, 0, false
	}
	return tokens / joules, steps, true
}
