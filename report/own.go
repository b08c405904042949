package report

import (
	"fmt"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
)

// CaptureCost is what measuring cost the training processes, by the
// ranks' own account (the Python package times its hooks and reads its
// threads' CPU clocks: capture_ns, capture_cpu_ns), over the steady rank
// rows that carry it.
type CaptureCost struct {
	Rows int64 `json:"rows"`
	// PerStepNs is the training thread's time in tpsprof's code, a mean
	// over the rows; StepFraction that time over the rows' step time
	// (absent above 1: the cost then lies mostly outside the steps'
	// measured spans, finishing them, and is no share of them).
	PerStepNs    float64  `json:"per_step_ns"`
	StepFraction *float64 `json:"step_fraction,omitempty"`
	// CPUPerStepNs is the CPU time of the package's own threads (sender,
	// poller), a mean over the rows: off the training thread, on the
	// host's cores.
	CPUPerStepNs float64 `json:"cpu_per_step_ns"`
	// ByComponent is the same figures by the package's component, where
	// the rows said (capture_comm_ns, capture_comm_cpu_ns; absent in
	// older producers' rows): the communication component (its marks
	// around each collective, its poller thread) and the rest (the step's
	// hooks on the training thread, the sender thread).
	ByComponent []ComponentCost `json:"by_component,omitempty"`
	// Profiled is the cost of the steps a profiler traced or PyTorch's
	// FLOP counter counted (tpsprof trace, trace_every, the counter's
	// samples: their start, stop and the trace's writing), apart from the
	// always-on figure above, which is over the other steady rows.
	Profiled *ProfiledCost `json:"profiled,omitempty"`
}

// ComponentCost is one component's part of the capture cost, means over
// the rows that split it.
type ComponentCost struct {
	Component    string  `json:"component"`
	PerStepNs    float64 `json:"per_step_ns"`
	CPUPerStepNs float64 `json:"cpu_per_step_ns"`
}

// ProfiledCost is what the profiled steps cost the training thread by the
// ranks' own account: a mean over their rows.
type ProfiledCost struct {
	Rows      int64   `json:"rows"`
	PerStepNs float64 `json:"per_step_ns"`
}

// RankMemory is one rank's device memory over the rows read: the peaks
// of PyTorch's caching allocator, the device's capacity and the headroom
// left (1 − peak reserved ÷ capacity; absent without a capacity).
type RankMemory struct {
	Rank               int64    `json:"rank"`
	Node               string   `json:"node,omitempty"`
	PeakAllocatedBytes int64    `json:"peak_allocated_bytes"`
	PeakReservedBytes  int64    `json:"peak_reserved_bytes"`
	CapacityBytes      int64    `json:"capacity_bytes,omitempty"`
	Headroom           *float64 `json:"headroom,omitempty"`
}

// Memory is the ranks' device memory: how many ranks reported it and the
// ones with the least headroom (the highest peak where no capacity is
// known), fullest first.
type Memory struct {
	Ranks   int          `json:"ranks"`
	Fullest []RankMemory `json:"fullest"`
}

// ownAcc sums the capture's cost and keeps each rank's memory peaks as a
// rank pass reads rows (or rank_windows' spans).
type ownAcc struct {
	rows, captureNs, cpuNs, durNs int64
	// of the rows that split the cost by component: how many, their
	// totals, the communication component's parts
	splitRows, splitNs, splitCPUNs, commNs, commCPUNs int64
	profRows, profNs                                  int64
	mem                                               map[int64]*RankMemory
}

// addCost takes n steady rows' sums (n = 1 for a rank row); rows without
// a capture figure add nothing. commNs and commCPUNs are the
// communication component's parts (0, 0: not split, an older producer).
func (a *ownAcc) addCost(n, captureNs, cpuNs, commNs, commCPUNs, durNs int64) {
	if captureNs <= 0 && cpuNs <= 0 {
		return
	}
	a.rows += n
	a.captureNs += captureNs
	a.cpuNs += cpuNs
	a.durNs += durNs
	if commNs > 0 || commCPUNs > 0 {
		a.splitRows += n
		a.splitNs += captureNs
		a.splitCPUNs += cpuNs
		a.commNs += min(commNs, captureNs)
		a.commCPUNs += min(commCPUNs, cpuNs)
	}
}

// addProfiled takes a profiled steady row's capture figure.
func (a *ownAcc) addProfiled(captureNs int64) {
	if captureNs > 0 {
		a.profRows++
		a.profNs += captureNs
	}
}

// addMem takes the largest figures of a rank's row (or window).
func (a *ownAcc) addMem(rank int64, alloc, resv, capacity int64) {
	if alloc <= 0 && resv <= 0 {
		return
	}
	if a.mem == nil {
		a.mem = map[int64]*RankMemory{}
	}
	m := a.mem[rank]
	if m == nil {
		m = &RankMemory{Rank: rank}
		a.mem[rank] = m
	}
	m.PeakAllocatedBytes = max(m.PeakAllocatedBytes, alloc)
	m.PeakReservedBytes = max(m.PeakReservedBytes, resv)
	m.CapacityBytes = max(m.CapacityBytes, capacity)
}

// result gives the report's figures: nil where no row carried them; at
// most top ranks in Fullest.
func (a *ownAcc) result(nodes map[int64]string, top int) (*CaptureCost, *Memory) {
	var cost *CaptureCost
	if a.rows > 0 && a.durNs > 0 {
		n := float64(a.rows)
		cost = &CaptureCost{Rows: a.rows, PerStepNs: float64(a.captureNs) / n, CPUPerStepNs: float64(a.cpuNs) / n}
		if f := float64(a.captureNs) / float64(a.durNs); f <= 1 {
			cost.StepFraction = &f
		}
		if a.splitRows > 0 {
			s := float64(a.splitRows)
			cost.ByComponent = []ComponentCost{
				{Component: "communication", PerStepNs: float64(a.commNs) / s, CPUPerStepNs: float64(a.commCPUNs) / s},
				{Component: "steps and sender", PerStepNs: float64(a.splitNs-a.commNs) / s, CPUPerStepNs: float64(a.splitCPUNs-a.commCPUNs) / s},
			}
		}
	}
	if a.profRows > 0 {
		if cost == nil {
			cost = &CaptureCost{}
		}
		cost.Profiled = &ProfiledCost{Rows: a.profRows, PerStepNs: float64(a.profNs) / float64(a.profRows)}
	}
	if len(a.mem) == 0 {
		return cost, nil
	}
	all := make([]RankMemory, 0, len(a.mem))
	for r, m := range a.mem {
		if h, ok := tps.MemHeadroom(m.PeakReservedBytes, m.CapacityBytes); ok {
			m.Headroom = &h
		}
		m.Node = nodes[r]
		all = append(all, *m)
	}
	slices.SortFunc(all, func(x, y RankMemory) int {
		if c := tps.MemFuller(x.PeakReservedBytes, x.CapacityBytes, y.PeakReservedBytes, y.CapacityBytes); c != 0 {
			return c
		}
		return int(x.Rank - y.Rank)
	})
	return cost, &Memory{Ranks: len(all), Fullest: all[:min(len(all), max(top, 1))]}
}

// gib writes bytes in GiB (device memory's unit).
func gib(b int64) string {
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}
