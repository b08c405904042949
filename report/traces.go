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
	t := traceSums{keys: map[traceKey]bool{}, coll: map[string]*tps.TraceCollective{}}
	for _, e := range events {
		if e.Kind == tps.EventTraceAnalysis {
			t.add(e)
		}
	}
	if t.s.Profiled == 0 {
		return nil, nil
	}
	s := t.summary()
	// The rank rows of the same steps: what event timing said.
	comm, exposed, found, err := t.eventTimed(dir, opts)
	if err != nil && !trace.IsUnreadable(err) { // noted by the rank pass
		return nil, err
	}
	if found > 0 {
		comm /= float64(found)
		exposed /= float64(found)
		s.EventTimedCommUs, s.EventTimedExposedUs = &comm, &exposed
	}
	return s, nil
}

type traceKey struct{ attempt, step, rank int64 }

// traceSums sums the trace analyses, once per rank-step.
type traceSums struct {
	keys       map[traceKey]bool
	s          TraceSummary
	overlapSum float64
	overlapN   int
	coll       map[string]*tps.TraceCollective
}

func (t *traceSums) add(e tps.Event) {
	var f tps.TraceFigures
	if json.Unmarshal([]byte(e.Detail), &f) != nil {
		return
	}
	k := traceKey{e.Attempt, e.Step, e.Rank}
	if t.keys[k] {
		return
	}
	t.keys[k] = true
	s := &t.s
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
		t.overlapSum += *f.OverlapPct
		t.overlapN++
	}
	for _, c := range f.Collectives {
		x := t.coll[c.Kind]
		if x == nil {
			x = &tps.TraceCollective{Kind: c.Kind}
			t.coll[c.Kind] = x
		}
		x.Count += c.Count
		x.TimeUs += c.TimeUs
		x.Bytes += c.Bytes
	}
}

// summary is the sums as means a profiled rank-step, the collectives the
// longest first.
func (t *traceSums) summary() *TraceSummary {
	s := t.s
	n := float64(s.Profiled)
	s.ComputeUs /= n
	s.CommUs /= n
	s.ExposedCommUs /= n
	if t.overlapN > 0 {
		o := t.overlapSum / float64(t.overlapN)
		s.OverlapPct = &o
	}
	for _, c := range t.coll {
		s.Collectives = append(s.Collectives, *c)
	}
	sort.Slice(s.Collectives, func(i, j int) bool { return s.Collectives[i].TimeUs > s.Collectives[j].TimeUs })
	return &s
}

// eventTimed sums the profiled rank-steps' own communication figures
// (µs), from only the row groups that can hold them.
func (t *traceSums) eventTimed(dir string, opts []trace.ReadOption) (comm, exposed float64, found int, err error) {
	var lo, hi [2]int64
	first := true
	for k := range t.keys {
		if first {
			lo, hi, first = [2]int64{k.attempt, k.step}, [2]int64{k.attempt, k.step}, false
		}
		lo = [2]int64{min(lo[0], k.attempt), min(lo[1], k.step)}
		hi = [2]int64{max(hi[0], k.attempt), max(hi[1], k.step)}
	}
	ranges := []trace.Range{{Column: "attempt", Min: lo[0], Max: hi[0]}, {Column: "step", Min: lo[1], Max: hi[1]}}
	var cols trace.Cols
	ca, cs, cr, cc, ce := cols.Col("attempt"), cols.Col("step"), cols.Col("rank"), cols.Col("comm_ns"), cols.Col("exposed_comm_ns")
	_, err = trace.EachColumnsIn(filepath.Join(dir, trace.RankSteps), cols.Names(), "", ranges,
		func(c *trace.Columns) error {
			attempt, step, rank, cm, ex := c.Col(ca), c.Col(cs), c.Col(cr), c.Col(cc), c.Col(ce)
			for i := 0; i < c.Rows; i++ {
				if t.keys[traceKey{attempt[i], step[i], rank[i]}] {
					comm += float64(cm[i]) / 1e3
					exposed += float64(ex[i]) / 1e3
					found++
				}
			}
			return nil
		}, opts...)
	return comm, exposed, found, err
}
