package collector

import "github.com/tpsprof/tpsprof/tps"

// ownLive is what the live page shows of the ranks' own figures: what
// measuring costs them (moving averages over the records that carry it)
// and the fullest rank's device memory over the last two windows of
// tps.RankWindowSteps steps (a rank that stops reporting its peak drops
// out within two windows). O(1) per job whatever the world size.
type ownLive struct {
	captureNs, cpuNs, durNs float64 // ewmaAlpha moving averages; 0: none yet
	commNs, commCPUNs       float64 // the same of the communication component's parts
	split                   bool    // a record split its cost by component
	profNs                  float64 // the same of profiled steps' capture_ns (apart: 0 none yet)
	window                  int64
	cur, prev               memSeen
}

// memSeen is one record's memory figures.
type memSeen struct {
	rank                  int64
	alloc, resv, capacity int64
	set                   bool
}

// fuller says whether a is fuller than b (tps.MemFuller; any record
// beats none).
func fuller(a, b memSeen) bool {
	if !b.set {
		return a.set
	}
	return a.set && tps.MemFuller(a.resv, a.capacity, b.resv, b.capacity) < 0
}

func (o *ownLive) observe(r *tps.StepRecord, profiled bool) {
	switch {
	case profiled && r.CaptureNs > 0:
		// a profiled step's cost is the profiler's: apart from the always-on
		if o.profNs == 0 {
			o.profNs = float64(r.CaptureNs)
		} else {
			o.profNs += ewmaAlpha * (float64(r.CaptureNs) - o.profNs)
		}
	case profiled:
	case r.CaptureNs > 0 || r.CaptureCPUNs > 0:
		comm, commCPU := float64(min(r.CaptureCommNs, r.CaptureNs)), float64(min(r.CaptureCommCPUNs, r.CaptureCPUNs))
		if o.durNs == 0 {
			o.captureNs, o.cpuNs, o.durNs = float64(r.CaptureNs), float64(r.CaptureCPUNs), float64(r.DurationNs)
			o.commNs, o.commCPUNs = comm, commCPU
		} else {
			o.captureNs += ewmaAlpha * (float64(r.CaptureNs) - o.captureNs)
			o.cpuNs += ewmaAlpha * (float64(r.CaptureCPUNs) - o.cpuNs)
			o.durNs += ewmaAlpha * (float64(r.DurationNs) - o.durNs)
			o.commNs += ewmaAlpha * (comm - o.commNs)
			o.commCPUNs += ewmaAlpha * (commCPU - o.commCPUNs)
		}
		o.split = o.split || comm > 0 || commCPU > 0
	}
	if r.MemPeakReservedBytes <= 0 && r.MemPeakAllocatedBytes <= 0 {
		return
	}
	if w := tps.WindowOf(r.Step); w != o.window {
		if w == o.window+1 {
			o.prev = o.cur
		} else if w > o.window {
			o.prev = memSeen{}
		}
		if w > o.window {
			o.cur, o.window = memSeen{}, w
		}
	}
	m := memSeen{rank: r.Rank, alloc: r.MemPeakAllocatedBytes, resv: r.MemPeakReservedBytes, capacity: r.MemCapacityBytes, set: true}
	if fuller(m, o.cur) {
		o.cur = m
	}
}

// LiveCost is what measuring costs the ranks, as their records say
// (moving averages: the training thread's time in tpsprof's hooks, its
// share of the step, the package's threads' CPU).
type LiveCost struct {
	PerStepUs float64 `json:"per_step_us"`
	// StepFraction is absent above 1 (the cost then lies mostly outside
	// the steps' measured spans: no share of them).
	StepFraction *float64 `json:"step_fraction,omitempty"`
	CPUPerStepUs float64  `json:"cpu_per_step_us"`
	// ProfiledPerStepUs is the same of the steps a profiler traced or the
	// FLOP counter counted, apart (absent: none seen).
	ProfiledPerStepUs *float64 `json:"profiled_per_step_us,omitempty"`
	// CommPerStepUs and CommCPUPerStepUs are the communication component's
	// parts of the two (its marks around each collective, its poller
	// thread), where the records split them.
	CommPerStepUs    *float64 `json:"comm_per_step_us,omitempty"`
	CommCPUPerStepUs *float64 `json:"comm_cpu_per_step_us,omitempty"`
}

// LiveMemory is the fullest rank's device memory over the last steps.
type LiveMemory struct {
	Rank               int64    `json:"rank"`
	PeakAllocatedBytes int64    `json:"peak_allocated_bytes"`
	PeakReservedBytes  int64    `json:"peak_reserved_bytes"`
	CapacityBytes      int64    `json:"capacity_bytes,omitempty"`
	Headroom           *float64 `json:"headroom,omitempty"`
}

func (o *ownLive) live() (*LiveCost, *LiveMemory) {
	var c *LiveCost
	if o.durNs > 0 {
		c = &LiveCost{PerStepUs: o.captureNs / 1e3, CPUPerStepUs: o.cpuNs / 1e3}
		if f := o.captureNs / o.durNs; f <= 1 {
			c.StepFraction = &f
		}
		if o.split {
			comm, cpu := o.commNs/1e3, o.commCPUNs/1e3
			c.CommPerStepUs, c.CommCPUPerStepUs = &comm, &cpu
		}
	}
	if o.profNs > 0 {
		if c == nil {
			c = &LiveCost{}
		}
		p := o.profNs / 1e3
		c.ProfiledPerStepUs = &p
	}
	m := o.cur
	if fuller(o.prev, m) {
		m = o.prev
	}
	if !m.set {
		return c, nil
	}
	lm := &LiveMemory{Rank: m.rank, PeakAllocatedBytes: m.alloc, PeakReservedBytes: m.resv, CapacityBytes: m.capacity}
	if h, ok := tps.MemHeadroom(m.resv, m.capacity); ok {
		lm.Headroom = &h
	}
	return c, lm
}
