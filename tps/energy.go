package tps

// GPUPoint is one GPU reading reduced to what steps are joined with.
type GPUPoint struct {
	UnixNs   int64
	EnergyMJ int64 // total energy counter; -1 when absent
	PowerW   float64
	SMClock  float64
	Reasons  int64
	TempC    float64 // -1 when absent
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
// [start, end]. Energy comes from the counter, interpolated linearly at both
// ends; when the counter is absent, does not bracket the window, or reset
// inside it (a driver reload, a GPU reset: the counter went down), it is
// estimated as mean power × duration instead. ok is false when no point is
// inside the window or within its length plus 2 s of it.
func JoinGPU(points []GPUPoint, start, end int64) (w GPUWindow, ok bool) {
	if len(points) == 0 || end <= start {
		return w, false
	}
	// Power, clock and reasons from the points inside the window, else the
	// nearest points around it.
	var n float64
	lo, hi := -1, -1
	for i, p := range points {
		if p.UnixNs <= start {
			lo = i
		}
		if p.UnixNs >= end && hi < 0 {
			hi = i
		}
		if p.UnixNs >= start && p.UnixNs <= end {
			w.PowerW += p.PowerW
			w.SMClock += p.SMClock
			w.Reasons |= p.Reasons
			n++
		}
	}
	if n == 0 {
		// No sample inside: take the nearest on either side, if near enough
		// to speak for the window (a sampling interval or two away).
		near := (end - start) + 2*int64(1e9)
		for _, i := range []int{lo, hi} {
			if i >= 0 && (points[i].UnixNs >= start-near && points[i].UnixNs <= end+near) {
				w.PowerW += points[i].PowerW
				w.SMClock += points[i].SMClock
				w.Reasons |= points[i].Reasons
				n++
			}
		}
	}
	if n == 0 {
		return w, false
	}
	w.PowerW /= n
	w.SMClock /= n
	dur := float64(end-start) / 1e9
	if lo >= 0 && hi >= 0 && counterUsable(points[lo:hi+1]) {
		eStart := energyAt(points, lo, start)
		eEnd := energyAt(points, hi-1, end)
		w.EnergyJ = (eEnd - eStart) / 1e3
		w.HasEnergy = true
	} else {
		w.EnergyJ = w.PowerW * dur
	}
	return w, true
}

func counterUsable(ps []GPUPoint) bool {
	for i, p := range ps {
		if p.EnergyMJ < 0 || (i > 0 && p.EnergyMJ < ps[i-1].EnergyMJ) {
			return false
		}
	}
	return len(ps) >= 2
}

// energyAt interpolates the counter at t between points[i] and points[i+1].
func energyAt(points []GPUPoint, i int, t int64) float64 {
	if i+1 >= len(points) {
		return float64(points[i].EnergyMJ)
	}
	a, b := points[i], points[i+1]
	if b.UnixNs == a.UnixNs {
		return float64(a.EnergyMJ)
	}
	f := float64(t-a.UnixNs) / float64(b.UnixNs-a.UnixNs)
	return float64(a.EnergyMJ) + f*float64(b.EnergyMJ-a.EnergyMJ)
}
