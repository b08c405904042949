package report

import (
	"cmp"
	"errors"
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

// keeps reports whether a step passes the selection's bounds (--last
// aside).
func (s Selection) keeps(attempt, step, start, end int64) bool {
	return (s.Attempt == nil || attempt == *s.Attempt) &&
		(s.StepFrom == nil || step >= *s.StepFrom) &&
		(s.StepTo == nil || step <= *s.StepTo) &&
		(s.Since.IsZero() || end >= s.Since.UnixNano()) &&
		(s.Until.IsZero() || start <= s.Until.UnixNano())
}

// selectEvents keeps the events within [lo, hi], the selected steps' time.
func selectEvents(events []tps.Event, lo, hi int64, sel Selection) []tps.Event {
	out := events[:0]
	for _, e := range events {
		// an attempt's launch and end belong to a report of that attempt,
		// outside its steps' span as they are
		lifecycle := sel.Attempt != nil && e.Attempt == *sel.Attempt && (e.Kind == tps.EventAttemptStart || e.Kind == tps.EventAttemptEnd ||
			e.Kind == tps.EventJobStart || e.Kind == tps.EventJobEnd)
		if lifecycle || e.EndUnixNs >= lo && e.StartUnixNs <= hi {
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
	// threshold is the run's automatic warm-up threshold (ns; 0 when a
	// fixed count or no kept step can be warm-up)
	threshold float64
	jumps     int // clock steps back (unstepClocks)
	back      float64
}

// runSteps are a run's steps read whole and sorted, a slice per column:
// 12 B a step for the attempt and step, 24 more when the times are read.
// Only rows out of order (parts of several writers) are read so; rows in
// order are taken as they are read (readSpine, readSelected).
type runSteps struct {
	attempt              []int32 // tps.MaxAttempt fits
	step                 []int64
	start, end, stepTime []int64 // nil unless read
	missing              []int64 // ranks missing; nil unless read
	world, slowest       []int64 // world size, critical rank; nil unless read
}

// runColumns say which columns readRunSteps reads beside the attempt and
// step (ranks: the world size and the critical rank, which the rank pass
// takes from the spine).
type runColumns struct{ times, stepTime, missing, ranks bool }

// columns are the columns to read: attempt and step first.
func (want runColumns) columns() []string {
	cols := []string{"attempt", "step"}
	if want.times {
		cols = append(cols, "start_unix_ns", "end_unix_ns")
	}
	if want.stepTime {
		cols = append(cols, "step_time_ns")
	}
	if want.missing {
		cols = append(cols, "ranks_missing")
	}
	if want.ranks {
		// (optional: a part written before the columns existed reads 0, as
		// its rows do)
		cols = append(cols, "?world_size", "?slowest_rank")
	}
	return cols
}

// split is a row group's columns read by columns(), each nil when not
// asked.
func (want runColumns) split(c *trace.Columns) (r runCols) {
	k := 2
	if want.times {
		r.start, r.end, k = c.Int64[2], c.Int64[3], 4
	}
	if want.stepTime {
		r.stepTime, k = c.Int64[k], k+1
	}
	if want.missing {
		r.missing, k = c.Int64[k], k+1
	}
	if want.ranks {
		r.world, r.slowest = c.Int64[k], c.Int64[k+1]
	}
	return r
}

// runCols are a row group's columns that runColumns asked (nil when not).
type runCols struct{ start, end, stepTime, missing, world, slowest []int64 }

// row is row i of r's columns into the key's runRow.
func (r *runCols) row(out *runRow, i int) {
	at := func(col []int64) int64 {
		if col == nil {
			return 0
		}
		return col[i]
	}
	out.start, out.end, out.stepTime, out.missing = at(r.start), at(r.end), at(r.stepTime), at(r.missing)
	out.world, out.slowest = at(r.world), at(r.slowest)
}

// runRow is a cluster row's key (its attempt clamped, as keys hold it)
// and the columns runColumns asked (0 when not).
type runRow struct{ attempt, step, start, end, stepTime, missing, world, slowest int64 }

// eachRunRow calls add with every cluster row of dir, in (attempt, step)
// order, with the columns want asks: as they are read, a row group at a
// time, when the rows are in order (a collector's); else it calls restart
// and gives the rows again from the first, read whole and sorted
// (readRunSteps). It says whether the rows were in order.
func eachRunRow(dir string, want runColumns, opts []trace.ReadOption, restart func(), add func(*runRow)) (bool, error) {
	var r runRow
	var last [2]int64
	n := 0
	_, err := trace.EachColumnsIn(dir, want.columns(), "", nil, func(c *trace.Columns) error {
		cols := want.split(c)
		for i := range c.Rows {
			r = runRow{attempt: int64(clampInt32(c.Int64[0][i])), step: c.Int64[1][i]}
			cols.row(&r, i)
			k := [2]int64{r.attempt, r.step}
			if n > 0 && cmpKeys(last, k) > 0 {
				return errUnsorted
			}
			last = k
			n++
			add(&r)
		}
		return nil
	}, opts...)
	if !errors.Is(err, errUnsorted) {
		return true, err
	}
	// rows out of order (parts of several writers)
	restart()
	run, err := readRunSteps(dir, want, opts)
	cols := runCols{start: run.start, end: run.end, stepTime: run.stepTime, missing: run.missing, world: run.world, slowest: run.slowest}
	for i := range run.len() {
		r = runRow{attempt: int64(run.attempt[i]), step: run.step[i]}
		cols.row(&r, i)
		add(&r)
	}
	return false, err
}

func (r *runSteps) len() int { return len(r.step) }

func (r *runSteps) key(i int) [2]int64 { return [2]int64{int64(r.attempt[i]), r.step[i]} }

// readSelected reads the cluster steps a selection keeps without reading
// the whole table: first the attempt and step columns of every row (and
// the times and step times, for a selection by time), enough for which
// steps the selection keeps, where each stands in its attempt and the
// run's clock jumps; the step times of every row only when a kept step is
// among its attempt's first steps, where the automatic warm-up rule can
// exclude it (the rule compares them with the whole run's); then the whole
// rows of only the row groups whose statistics can hold the kept steps.
// Over the last 1% of a long run it reads about 1% of the run's bytes
// (TestSelectionReadsItsShare, BenchmarkReportLongRun). Of the run's steps
// it keeps their keys as runs (spine's keys) and their step times in a
// values: its memory is the selection's.
func readSelected(dir string, sel Selection, warmup, inMemory int, opts ...trace.ReadOption) (*selectedSteps, error) {
	byTime := !sel.Since.IsZero() || !sel.Until.IsZero()
	s := &selector{sel: sel, byTime: byTime, times: values{limit: inMemory}}
	defer s.times.Close()
	inOrder, err := eachRunRow(dir, runColumns{times: byTime, stepTime: byTime}, opts, func() {
		s.times.Close()
		*s = selector{sel: sel, byTime: byTime, times: values{limit: inMemory}}
	}, func(r *runRow) { s.add(r.attempt, r.step, r.start, r.end, r.stepTime) })
	s.sorted = inOrder
	if err != nil && !trace.IsUnreadable(err) {
		return nil, err
	}
	n := s.ks.len()
	out := &selectedSteps{of: n, warm: map[[2]int64]bool{}, jumps: s.un.jumps, back: s.un.largest}
	keep := s.keep
	if sel.Last > 0 && len(keep) > sel.Last {
		keep = keep[len(keep)-sel.Last:]
		if byTime {
			s.times0, s.times1 = s.times0[len(s.times0)-sel.Last:], s.times1[len(s.times1)-sel.Last:]
		}
	}
	if len(keep) == 0 {
		return out, err
	}
	if warmup >= 0 || s.nearAttemptStart(keep) {
		if err := s.markWarm(dir, opts, keep, warmup, out); err != nil {
			return nil, err
		}
	} // else no kept step can be warm-up
	rerr := s.readKept(dir, opts, keep, out)
	if rerr != nil && !trace.IsUnreadable(rerr) {
		return nil, rerr
	}
	err = cmp.Or(err, rerr)
	tps.SortSteps(out.steps)
	if !byTime {
		n, back := unstepClocks(out.steps)
		out.jumps, out.back = n, back
	}
	return out, err
}

// markWarm marks the kept steps that are warm-up in out.warm (the
// automatic rule compares them with every step's time).
func (s *selector) markWarm(dir string, opts []trace.ReadOption, keep []int, warmup int, out *selectedSteps) error {
	var times tps.Series
	if warmup < 0 {
		if !s.byTime {
			if err := s.readTimes(dir, opts); err != nil {
				return err
			}
		}
		times = &s.times
		var err error
		if out.threshold, err = tps.WarmupThresholdOfValues(times, warmup); err != nil {
			return err
		}
	}
	k := 0 // the kept steps rise, as warm does
	return eachWarm(&s.ks, times, tps.WarmupRule{Warmup: warmup, Threshold: out.threshold}, func(i int) {
		for k < len(keep) && keep[k] < i {
			k++
		}
		if k < len(keep) && keep[k] == i {
			out.warm[s.ks.key(i)] = true
		}
	})
}

// readKept reads the whole rows of the kept steps, from the row groups
// whose statistics can hold them, into out.steps (placed after the run's
// clock jumps when selected by time).
func (s *selector) readKept(dir string, opts []trace.ReadOption, keep []int, out *selectedSteps) error {
	want := make(map[[2]int64]int, len(keep))
	kc := keyCursor{ks: &s.ks}
	first, lastKey := kc.at(keep[0]), kc.at(keep[len(keep)-1])
	lo, hi := first[1], first[1]
	for j, i := range keep {
		k := kc.at(i)
		want[k] = j
		lo, hi = min(lo, k[1]), max(hi, k[1])
	}
	ranges := []trace.Range{{Column: "attempt", Min: first[0], Max: lastKey[0]}, {Column: "step", Min: lo, Max: hi}}
	full, err := trace.ReadAll[tps.ClusterStep](dir, append(opts, trace.Within(ranges...))...)
	if err != nil && !trace.IsUnreadable(err) {
		return err
	}
	out.steps = make([]tps.ClusterStep, 0, len(keep))
	for _, c := range full {
		j, ok := want[[2]int64{c.Attempt, c.Step}]
		if !ok {
			continue
		}
		if s.byTime {
			c.StartUnixNs, c.EndUnixNs = s.times0[j], s.times1[j]
		}
		out.steps = append(out.steps, c)
	}
	return err
}

// selector takes a run's steps in order and keeps those a selection
// keeps.
type selector struct {
	sel            Selection
	byTime, sorted bool
	ks             keys
	un             unstepper
	times          values  // every step's time (ns), when read
	keep           []int   // the kept steps' indexes
	times0, times1 []int64 // by time: their start and end, repaired
}

func (s *selector) add(attempt, step, start, end, stepTime int64) {
	i := s.ks.len()
	s.ks.add(clampInt32(attempt), step)
	if s.byTime {
		s.un.next(attempt, &start, &end, stepTime)
		s.times.Append(float64(stepTime))
	}
	if !s.sel.keeps(attempt, step, start, end) {
		return
	}
	s.keep = append(s.keep, i)
	if s.byTime {
		s.times0, s.times1 = append(s.times0, start), append(s.times1, end)
	}
	if last := s.sel.Last; last > 0 && len(s.keep) >= 2*last+1024 {
		// --last: what is kept stays about its size
		cut := len(s.keep) - last
		s.keep = slices.Delete(s.keep, 0, cut)
		if s.byTime {
			s.times0, s.times1 = slices.Delete(s.times0, 0, cut), slices.Delete(s.times1, 0, cut)
		}
	}
}

// nearAttemptStart: some kept step is among its attempt's first steps,
// which the automatic warm-up rule can exclude.
func (s *selector) nearAttemptStart(keep []int) bool {
	first, end := s.ks.attempts()
	a := 0
	for _, i := range keep {
		for a < len(end) && end[a] <= i {
			a++
		}
		if a < len(first) && i-first[a] < tps.WarmupLimit(end[a]-first[a]) {
			return true
		}
	}
	return false
}

// readTimes reads every row's step time into s.times, in the order the
// keys were read.
func (s *selector) readTimes(dir string, opts []trace.ReadOption) error {
	if !s.sorted {
		run, err := readRunSteps(dir, runColumns{stepTime: true}, opts)
		if err != nil && !trace.IsUnreadable(err) {
			return err
		}
		for _, t := range run.stepTime {
			s.times.Append(float64(t))
		}
	} else {
		_, err := trace.EachColumnsIn(dir, []string{"step_time_ns"}, "", nil, func(c *trace.Columns) error {
			for _, t := range c.Int64[0] {
				s.times.Append(float64(t))
			}
			return nil
		}, opts...)
		if err != nil && !trace.IsUnreadable(err) {
			return err
		}
	}
	if s.times.Len() != s.ks.len() {
		return fmt.Errorf("report: %s changed while read (%d cluster rows, then %d)", dir, s.ks.len(), s.times.Len())
	}
	return nil
}

// readRunSteps reads the attempt and step of every cluster row (and the
// times, and the step time, as asked), sorted by attempt and step.
func readRunSteps(dir string, want runColumns, opts []trace.ReadOption) (*runSteps, error) {
	r := &runSteps{}
	// sized from the footers once: grown by appending, the slices were
	// twice the spine in garbage at its peak
	if n := trace.RowCount(dir, opts...); n > 0 && n < 1<<40 {
		r.attempt, r.step = make([]int32, 0, n), make([]int64, 0, n)
		if want.times {
			r.start, r.end = make([]int64, 0, n), make([]int64, 0, n)
		}
		if want.stepTime {
			r.stepTime = make([]int64, 0, n)
		}
		if want.missing {
			r.missing = make([]int64, 0, n)
		}
		if want.ranks {
			r.world, r.slowest = make([]int64, 0, n), make([]int64, 0, n)
		}
	}
	_, err := trace.EachColumnsIn(dir, want.columns(), "", nil, func(c *trace.Columns) error {
		for _, a := range c.Int64[0] {
			r.attempt = append(r.attempt, clampInt32(a))
		}
		r.step = append(r.step, c.Int64[1]...)
		cols := want.split(c)
		r.start, r.end = append(r.start, cols.start...), append(r.end, cols.end...)
		r.stepTime, r.missing = append(r.stepTime, cols.stepTime...), append(r.missing, cols.missing...)
		r.world, r.slowest = append(r.world, cols.world...), append(r.slowest, cols.slowest...)
		return nil
	}, opts...)
	sorted := true
	for i := 1; i < r.len() && sorted; i++ {
		sorted = cmpKeys(r.key(i-1), r.key(i)) <= 0
	}
	if !sorted {
		// rows out of order (parts of several writers): sort every column
		// by one permutation
		perm := indexes(r.len())
		slices.SortStableFunc(perm, func(i, j int) int { return cmpKeys(r.key(i), r.key(j)) })
		r.attempt = permute(r.attempt, perm)
		r.step = permute(r.step, perm)
		r.start, r.end, r.stepTime = permute(r.start, perm), permute(r.end, perm), permute(r.stepTime, perm)
		r.missing = permute(r.missing, perm)
		r.world, r.slowest = permute(r.world, perm), permute(r.slowest, perm)
	}
	return r, err
}

func cmpKeys(a, b [2]int64) int { return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1])) }

func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func permute[T any](s []T, perm []int) []T {
	if s == nil {
		return nil
	}
	out := make([]T, len(s))
	for i, p := range perm {
		out[i] = s[p]
	}
	return out
}
