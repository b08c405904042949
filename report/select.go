package report

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Selection is the part of a run a report covers: an attempt, a range of
// steps, the last N steps, a time window; all that are set apply (the
// last N of what the others keep). The zero Selection is the whole run.
type Selection struct {
	Attempt *int64
	// StepFrom and StepTo bound step numbers, both inclusive (nil: open).
	StepFrom, StepTo *int64
	Last             int
	// Since and Until keep the steps that end at or after Since and start
	// at or before Until (zero: open).
	Since, Until time.Time
}

// Active reports whether the selection leaves anything out.
func (s Selection) Active() bool {
	return s.Attempt != nil || s.StepFrom != nil || s.StepTo != nil || s.Last > 0 || !s.Since.IsZero() || !s.Until.IsZero()
}

func (s Selection) String() string {
	var parts []string
	if s.Attempt != nil {
		parts = append(parts, fmt.Sprintf("attempt %d", *s.Attempt))
	}
	if s.StepFrom != nil || s.StepTo != nil {
		lo, hi := "", ""
		if s.StepFrom != nil {
			lo = strconv.FormatInt(*s.StepFrom, 10)
		}
		if s.StepTo != nil {
			hi = strconv.FormatInt(*s.StepTo, 10)
		}
		parts = append(parts, fmt.Sprintf("steps %s:%s", lo, hi))
	}
	if !s.Since.IsZero() {
		parts = append(parts, "since "+s.Since.UTC().Format(time.RFC3339))
	}
	if !s.Until.IsZero() {
		parts = append(parts, "until "+s.Until.UTC().Format(time.RFC3339))
	}
	if s.Last > 0 {
		parts = append(parts, fmt.Sprintf("the last %d steps", s.Last))
	}
	return strings.Join(parts, ", ")
}

// ParseSteps parses "A:B", "A:" or ":B" (inclusive step numbers).
func ParseSteps(v string) (from, to *int64, err error) {
	lo, hi, ok := strings.Cut(v, ":")
	if !ok {
		return nil, nil, fmt.Errorf("steps %q: want A:B, A: or :B", v)
	}
	num := func(x string) (*int64, error) {
		if x == "" {
			return nil, nil
		}
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("steps %q: %q is not a step number", v, x)
		}
		return &n, nil
	}
	if from, err = num(lo); err != nil {
		return nil, nil, err
	}
	if to, err = num(hi); err != nil {
		return nil, nil, err
	}
	if from == nil && to == nil {
		return nil, nil, fmt.Errorf("steps %q: give at least one end", v)
	}
	if from != nil && to != nil && *to < *from {
		return nil, nil, fmt.Errorf("steps %q: the range is empty", v)
	}
	return from, to, nil
}

// ParseTime parses an RFC 3339 time or a duration meaning that long
// before now ("2h": two hours ago).
func ParseTime(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("time %q: want RFC 3339 (2026-11-24T06:00:00Z) or a duration before now (2h)", v)
}

// apply keeps the selected steps, sorted by (attempt, step).
func (s Selection) apply(steps []tps.ClusterStep) []tps.ClusterStep {
	out := steps[:0]
	for _, c := range steps {
		if s.keeps(c.Attempt, c.Step, c.StartUnixNs, c.EndUnixNs) {
			out = append(out, c)
		}
	}
	tps.SortSteps(out)
	if s.Last > 0 && len(out) > s.Last {
		out = out[len(out)-s.Last:]
	}
	return out
}

// keeps reports whether a step passes the selection's bounds (--last
// aside).
func (s Selection) keeps(attempt, step, start, end int64) bool {
	return (s.Attempt == nil || attempt == *s.Attempt) &&
		(s.StepFrom == nil || step >= *s.StepFrom) &&
		(s.StepTo == nil || step <= *s.StepTo) &&
		(s.Since.IsZero() || end >= s.Since.UnixNano()) &&
		(s.Until.IsZero() || start <= s.Until.UnixNano())
}

// ranges bound the rank rows the selected steps can be in, for skipping
// row groups by their statistics.
func selectedRanges(steps []tps.ClusterStep) []trace.Range {
	a := trace.Range{Column: "attempt", Min: steps[0].Attempt, Max: steps[len(steps)-1].Attempt}
	st := trace.Range{Column: "step", Min: steps[0].Step, Max: steps[0].Step}
	for _, c := range steps {
		st.Min, st.Max = min(st.Min, c.Step), max(st.Max, c.Step)
	}
	return []trace.Range{a, st}
}

// selectEvents keeps the events within the selected steps' time.
func selectEvents(events []tps.Event, steps []tps.ClusterStep) []tps.Event {
	lo, hi := steps[0].StartUnixNs, steps[0].EndUnixNs
	for _, c := range steps {
		lo, hi = min(lo, c.StartUnixNs), max(hi, c.EndUnixNs)
	}
	out := events[:0]
	for _, e := range events {
		if e.EndUnixNs >= lo && e.StartUnixNs <= hi {
			out = append(out, e)
		}
	}
	return out
}

// selectedSteps is what readSelected found.
type selectedSteps struct {
	steps []tps.ClusterStep // the selection's, whole, sorted
	of    int               // the job's cluster steps
	warm  map[[2]int64]bool // the run's warm-up steps
	jumps int               // clock steps back (unstepClocks)
	back  float64
}

// timing is what the selection needs of each of a run's steps.
type timing struct{ attempt, step, start, end, stepTime int64 }

// readSelected reads the cluster steps a selection keeps without reading
// the whole table: first the attempt and step columns of every row (and
// the times and step times, for a selection by time), enough for which
// steps the selection keeps, where each stands in its attempt and the
// run's clock jumps, held in 40 B a step; the step times of every row only
// when a kept step is among its attempt's first steps, where the automatic
// warm-up rule can exclude it (the rule compares them with the whole
// run's); then the whole rows of only the row groups whose statistics can
// hold the kept steps. Over the last 1% of a long run it reads about 1% of
// the run's bytes (TestSelectionReadsItsShare, BenchmarkReportLongRun).
func readSelected(dir string, sel Selection, warmup int, opts ...trace.ReadOption) (*selectedSteps, error) {
	byTime := !sel.Since.IsZero() || !sel.Until.IsZero()
	light, err := timings(dir, byTime, byTime, opts)
	if err != nil && !trace.IsUnreadable(err) {
		return nil, err
	}
	out := &selectedSteps{of: len(light), warm: map[[2]int64]bool{}}
	if byTime {
		out.jumps, out.back = unstep(len(light), func(i int) (int64, *int64, *int64, int64) {
			l := &light[i]
			return l.attempt, &l.start, &l.end, l.stepTime
		})
	}
	var keep []int // indexes into light
	for i, l := range light {
		if sel.keeps(l.attempt, l.step, l.start, l.end) {
			keep = append(keep, i)
		}
	}
	if sel.Last > 0 && len(keep) > sel.Last {
		keep = keep[len(keep)-sel.Last:]
	}
	if len(keep) == 0 {
		return out, err
	}
	if warmup >= 0 || nearAttemptStart(light, keep) {
		times := []int64(nil)
		if warmup < 0 {
			// the automatic rule compares them with every step's time
			if !byTime {
				all, terr := timings(dir, false, true, opts)
				if terr != nil && !trace.IsUnreadable(terr) {
					return nil, terr
				}
				if len(all) != len(light) {
					return nil, fmt.Errorf("report: %s changed while read (%d cluster rows, then %d)", dir, len(light), len(all))
				}
				light = all
			}
			times = make([]int64, len(light))
			for i, l := range light {
				times[i] = l.stepTime
			}
		}
		attempts := make([]int64, len(light))
		for i, l := range light {
			attempts[i] = l.attempt
		}
		for i, w := range tps.WarmupMaskOf(attempts, times, warmup) {
			if w {
				out.warm[[2]int64{light[i].attempt, light[i].step}] = true
			}
		}
	} // else no kept step can be warm-up
	want := make(map[[2]int64]*timing, len(keep))
	first, last := light[keep[0]], light[keep[len(keep)-1]]
	lo, hi := first.step, first.step
	for _, i := range keep {
		want[[2]int64{light[i].attempt, light[i].step}] = &light[i]
		lo, hi = min(lo, light[i].step), max(hi, light[i].step)
	}
	ranges := []trace.Range{{Column: "attempt", Min: first.attempt, Max: last.attempt}, {Column: "step", Min: lo, Max: hi}}
	full, rerr := trace.ReadAll[tps.ClusterStep](dir, append(opts, trace.Within(nil, ranges...))...)
	if rerr != nil && !trace.IsUnreadable(rerr) {
		return nil, rerr
	}
	err = cmp.Or(err, rerr)
	out.steps = make([]tps.ClusterStep, 0, len(keep))
	for _, c := range full {
		l, ok := want[[2]int64{c.Attempt, c.Step}]
		if !ok {
			continue
		}
		if byTime {
			// as placed after the run's clock jumps
			c.StartUnixNs, c.EndUnixNs = l.start, l.end
		}
		out.steps = append(out.steps, c)
	}
	tps.SortSteps(out.steps)
	if !byTime {
		n, back := unstepClocks(out.steps)
		out.jumps, out.back = n, back
	}
	return out, err
}

// timings reads the attempt and step of every cluster row (and the times,
// and the step time, as asked), sorted by attempt and step.
func timings(dir string, times, stepTime bool, opts []trace.ReadOption) ([]timing, error) {
	cols := []string{"attempt", "step"}
	if times {
		cols = append(cols, "start_unix_ns", "end_unix_ns")
	}
	if stepTime {
		cols = append(cols, "step_time_ns")
	}
	var out []timing
	_, err := trace.EachColumnsIn(dir, cols, "", nil, func(c *trace.Columns) error {
		for i := range c.Rows {
			l := timing{attempt: c.Int64[0][i], step: c.Int64[1][i]}
			k := 2
			if times {
				l.start, l.end = c.Int64[2][i], c.Int64[3][i]
				k = 4
			}
			if stepTime {
				l.stepTime = c.Int64[k][i]
			}
			out = append(out, l)
		}
		return nil
	}, opts...)
	slices.SortFunc(out, func(a, b timing) int { return cmp.Or(cmp.Compare(a.attempt, b.attempt), cmp.Compare(a.step, b.step)) })
	return out, err
}

// nearAttemptStart reports whether a kept step is among the first steps of
// its attempt that the automatic warm-up rule may exclude.
func nearAttemptStart(light []timing, keep []int) bool {
	kept := make(map[int]bool, len(keep))
	for _, k := range keep {
		kept[k] = true
	}
	for i := 0; i < len(light); {
		j := i
		for j < len(light) && light[j].attempt == light[i].attempt {
			j++
		}
		for p := i; p < min(j, i+tps.WarmupLimit(j-i)); p++ {
			if kept[p] {
				return true
			}
		}
		i = j
	}
	return false
}
