package report

import (
	"fmt"
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
		switch {
		case s.Attempt != nil && c.Attempt != *s.Attempt,
			s.StepFrom != nil && c.Step < *s.StepFrom,
			s.StepTo != nil && c.Step > *s.StepTo,
			!s.Since.IsZero() && c.EndUnixNs < s.Since.UnixNano(),
			!s.Until.IsZero() && c.StartUnixNs > s.Until.UnixNano():
			continue
		}
		out = append(out, c)
	}
	tps.SortSteps(out)
	if s.Last > 0 && len(out) > s.Last {
		out = out[len(out)-s.Last:]
	}
	return out
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
