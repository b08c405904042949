package report

import (
	"encoding/json"
	"path/filepath"
	"sort"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// TraceSummary sums the trace_analysis events: steps that ranks profiled
// with torch.profiler and the node agent analysed (docs/kineto.md), beside
// the event-timed figures of the same rank rows.
type TraceSummary struct {
	// Profiled counts (rank, step) pairs with a trace.
	Profiled int    `json:"profiled"`
	Device   string `json:"device"` // gpu, cpu, or mixed
	// Means per profiled rank-step, microseconds, from the traces.
	ComputeUs     float64  `json:"compute_us"`
	CommUs        float64  `json:"comm_us"`
	ExposedCommUs float64  `json:"exposed_comm_us"`
	OverlapPct    *float64 `json:"overlap_pct"`
	// EventTimedExposedUs and EventTimedCommUs are the rank rows' own
	// figures for the same (attempt, step, rank), null where none.
	EventTimedCommUs    *float64              `json:"event_timed_comm_us"`
	EventTimedExposedUs *float64              `json:"event_timed_exposed_comm_us"`
	Collectives         []tps.TraceCollective `json:"collectives"`
}

// summarizeTraces reads the trace_analysis events and the same steps' rank
// rows. It returns nil when no step was profiled.
func summarizeTraces(dir string, events []tps.Event, opts ...trace.ReadOption) (*TraceSummary, error) {
	type key struct{ attempt, step, rank int64 }
	keys := map[key]bool{}
	var s TraceSummary
	var overlapSum float64
	var overlapN int
	coll := map[string]*tps.TraceCollective{}
	for _, e := range events {
		if e.Kind != tps.EventTraceAnalysis {
			continue
		}
		var f tps.TraceFigures
		if json.Unmarshal([]byte(e.Detail), &f) != nil {
			continue
		}
		k := key{e.Attempt, e.Step, e.Rank}
		if keys[k] {
			continue
		}
		keys[k] = true
		s.Profiled++
		switch {
		case s.Device == "":
			s.Device = f.Device
		case s.Device != f.Device:
			s.Device = "mixed"
		}
		s.ComputeUs += f.ComputeUs
		s.CommUs += f.CommUs
		s.ExposedCommUs += f.ExposedCommUs
		if f.OverlapPct != nil {
			overlapSum += *f.OverlapPct
			overlapN++
		}
		for _, c := range f.Collectives {
			t := coll[c.Kind]
			if t == nil {
				t = &tps.TraceCollective{Kind: c.Kind}
				coll[c.Kind] = t
			}
			t.Count += c.Count
			t.TimeUs += c.TimeUs
			t.Bytes += c.Bytes
		}
	}
	if s.Profiled == 0 {
		return nil, nil
	}
	n := float64(s.Profiled)
	s.ComputeUs /= n
	s.CommUs /= n
	s.ExposedCommUs /= n
	if overlapN > 0 {
		o := overlapSum / float64(overlapN)
		s.OverlapPct = &o
	}
	for _, c := range coll {
		s.Collectives = append(s.Collectives, *c)
	}
	sort.Slice(s.Collectives, func(i, j int) bool { return s.Collectives[i].TimeUs > s.Collectives[j].TimeUs })
	// The rank rows of the same steps: what event timing said.
	var comm, exposed float64
	found := 0
	// only the row groups that can hold the profiled steps
	var lo, hi [2]int64
	first := true
	for k := range keys {
		if first {
			lo, hi, first = [2]int64{k.attempt, k.step}, [2]int64{k.attempt, k.step}, false
		}
		lo = [2]int64{min(lo[0], k.attempt), min(lo[1], k.step)}
		hi = [2]int64{max(hi[0], k.attempt), max(hi[1], k.step)}
	}
	ranges := []trace.Range{{Column: "attempt", Min: lo[0], Max: hi[0]}, {Column: "step", Min: lo[1], Max: hi[1]}}
	_, err := trace.EachColumnsIn(filepath.Join(dir, trace.RankSteps), []string{"attempt", "step", "rank", "comm_ns", "exposed_comm_ns"}, "", ranges,
		func(c *trace.Columns) error {
			for i := 0; i < c.Rows; i++ {
				if keys[key{c.Int64[0][i], c.Int64[1][i], c.Int64[2][i]}] {
					comm += float64(c.Int64[3][i]) / 1e3
					exposed += float64(c.Int64[4][i]) / 1e3
					found++
				}
			}
			return nil
		}, opts...)
	if err != nil && !trace.IsUnreadable(err) { // noted by the rank pass
		return nil, err
	}
	if found > 0 {
		comm /= float64(found)
		exposed /= float64(found)
		s.EventTimedCommUs, s.EventTimedExposedUs = &comm, &exposed
	}
	return &s, nil
}
