package tps

import "math"

// GPUPoint is one GPU reading reduced to what steps are joined with.
type GPUPoint struct {
	UnixNs   int64
	EnergyMJ int64   // total energy counter; -1 when absent
	PowerW   float64 // NaN when absent
	SMClock  float64
	Reasons  int64
	TempC    float64 // -1 when absent
}

// MaxReadingGap is the longest time between two readings of one GPU that
// still speaks for the time between them: samplers read every second or
// so; across a longer gap (a sampler that stopped) the energy counter's
// increase says how much was used, but not when.
const MaxReadingGap = int64(10e9)

// EnergyRate is the energy one GPU used a nanosecond between two of its
// readings a and b (b after a): from the energy counter's increase where
// both readings have the counter and it did not go down (a driver reload
// or a GPU reset), else from the mean of their power (one's alone where
// the other has none). fromCounter says which; ok is false where the
// readings say neither, or lie more than MaxReadingGap apart.
//
// It is the one energy rule of the project: the collector's live join
// (JoinGPU, over each step's period) and the report's join of the whole
// gpu_samples table both integrate it over the time they cover.
func EnergyRate(a, b GPUPoint) (joulesPerNs float64, fromCounter, ok bool) {
	span := b.UnixNs - a.UnixNs
	if span <= 0 || span > MaxReadingGap {
		return 0, false, false
	}
	aw, bw := !math.IsNaN(a.PowerW), !math.IsNaN(b.PowerW)
	switch {
	case a.EnergyMJ >= 0 && b.EnergyMJ >= a.EnergyMJ:
		return float64(b.EnergyMJ-a.EnergyMJ) / 1e3 / float64(span), true, true
	case aw && bw:
		return (a.PowerW + b.PowerW) / 2 / 1e9, false, true
	case aw:
		return a.PowerW / 1e9, false, true
	case bw:
		return b.PowerW / 1e9, false, true
	}
	return 0, false, false
}

// GPUWindow is what one GPU did during a step.
type GPUWindow struct {
	EnergyJ   float64
	PowerW    float64 // mean of the samples in the window
	SMClock   float64
	Reasons   int64 // OR of the clock-event reasons seen
	HasEnergy bool
}

// JoinGPU summarises the points of one GPU (sorted by time) over
// [start, end]. Energy is EnergyRate integrated over the window where
// consecutive readings cover all of it (HasEnergy where every interval's
// came from the counter: the counter interpolated linearly at both ends);
// else, for a window the readings do not bracket, mean power × duration.
// ok is false when no point is inside the window or within its length
// plus 2 s of it.
func JoinGPU(points []GPUPoint, start, end int64) (w GPUWindow, ok bool) {
	if len(points) == 0 || end <= start {
		return w, false
	}
	lo, hi, n := w.readings(points, start, end)
	if n == 0 {
		return w, false
	}
	if joules, counter, ok := joulesOver(points, lo, hi, start, end); ok {
		w.EnergyJ, w.HasEnergy = joules, counter
	} else {
		w.EnergyJ = w.PowerW * float64(end-start) / 1e9
	}
	return w, true
}

// readings sets power, clock and reasons from the points inside the
// window, else the nearest points around it if near enough to speak for
// it (a sampling interval or two away); it returns the last point at or
// before start and the first at or after end (-1: none), and how many
// points spoke.
func (w *GPUWindow) readings(points []GPUPoint, start, end int64) (lo, hi int, n float64) {
	lo, hi = -1, -1
	var pn float64
	take := func(p GPUPoint) {
		if !math.IsNaN(p.PowerW) {
			w.PowerW += p.PowerW
			pn++
		}
		w.SMClock += p.SMClock
		w.Reasons |= p.Reasons
		n++
	}
	for i, p := range points {
		if p.UnixNs <= start {
			lo = i
		}
		if p.UnixNs >= end && hi < 0 {
			hi = i
		}
		if p.UnixNs >= start && p.UnixNs <= end {
			take(p)
		}
	}
	if n == 0 {
		near := (end - start) + 2*int64(1e9)
		for _, i := range []int{lo, hi} {
			if i >= 0 && (points[i].UnixNs >= start-near && points[i].UnixNs <= end+near) {
				take(points[i])
			}
		}
	}
	if n > 0 {
		w.SMClock /= n
	}
	if pn > 0 {
		w.PowerW /= pn
	}
	return lo, hi, n
}

// joulesOver integrates EnergyRate over [start, end] between points lo
// and hi (which bracket it); ok is false where an interval has no rate.
func joulesOver(points []GPUPoint, lo, hi int, start, end int64) (joules float64, counter, ok bool) {
	if lo < 0 || hi < 0 {
		return 0, false, false
	}
	counter = true
	for i := lo; i < hi; i++ {
		a, b := points[i], points[i+1]
		ov := min(b.UnixNs, end) - max(a.UnixNs, start)
		if ov <= 0 {
			continue
		}
		rate, fromCounter, ok := EnergyRate(a, b)
		if !ok {
			return 0, false, false
		}
		joules += rate * float64(ov)
		counter = counter && fromCounter
	}
	return joules, counter, true
}
