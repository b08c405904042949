package report

import (
	"cmp"
	"errors"
	"math"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// spine is what the report keeps of the steps it covers, sorted by
// (attempt, step): their keys as runs (a run is steps of one attempt
// whose numbers rise by one stride: a whole attempt, usually), one byte
// of flags a step, the clock repair's shifts (unstepClocks) as runs, and
// the span. It does not hold the steps' times: a streamed row is moved by
// its step's shift. About 5 B a step (1 B of flags, 4 B of the critical
// rank, dropped when rank_windows is read) plus 32 B a run, where it held
// 37 B a step before (BenchmarkReportLongRun).
type spine struct {
	keys
	flag []uint8 // flagComplete, flagTimed, flagWarm, flagSkip
	// shifts: what the clock repair adds to the times of a streamed row
	// from a step on; nil when the rows hold their repaired times
	shifts []clockShift
	lo, hi int64 // the earliest start and the latest end, repaired
	// stepTime are the steps' times (ns, in files past its limit) until
	// markWarm drops them; starts their starts (ns, repaired) until
	// markCut does
	stepTime, starts values
	// each step's critical rank (its cluster row's slowest_rank), for the
	// rank_steps pass (critExcess), and the steps' largest world size (the
	// summary's), read with the spine so that the rank pass need not wait
	// for the cluster pass (analysis.passes); slowest is dropped (nil) when
	// rank_windows is read
	slowest []int32
	world   int64
}

// keys are the keys of n steps sorted by (attempt, step), as runs.
type keys struct {
	n    int
	runs []keyRun
}

// attempts are the attempts the spine's steps hold, in order.
func (s *spine) attempts() []int64 {
	var out []int64
	for r, k := range s.runs {
		if r == 0 || k.attempt != s.runs[r-1].attempt {
			out = append(out, int64(k.attempt))
		}
	}
	return out
}

// keyRun: the steps from index at on are (attempt, step+stride·k) until
// the next run's.
type keyRun struct {
	at      int
	attempt int32 // tps.MaxAttempt fits
	step    int64
	stride  int64
}

type clockShift struct {
	at int
	d  int64
}

const (
	flagComplete uint8 = 1 << iota // no rank missing
	flagWarm                       // warm-up
	flagSkip                       // out of the statistics: warm-up or profiled
	flagTimed                      // a step time above zero
	flagCut                        // a save or evaluation between steps ran into it (flagSkip too)
)

func (ks *keys) len() int { return ks.n }

// add takes the next step's key.
func (ks *keys) add(attempt int32, step int64) {
	i := ks.n
	ks.n++
	if r := len(ks.runs) - 1; r < 0 || ks.runs[r].attempt != attempt {
		ks.runs = append(ks.runs, keyRun{at: i, attempt: attempt, step: step, stride: 1})
	} else if k := &ks.runs[r]; i-k.at == 1 {
		k.stride = step - k.step
	} else if step != k.step+k.stride*int64(i-k.at) {
		ks.runs = append(ks.runs, keyRun{at: i, attempt: attempt, step: step, stride: 1})
	}
}

// attempts are the attempts' first steps and the steps past their last
// (a run breaks at each attempt).
func (ks *keys) attempts() (first, end []int) {
	for r, k := range ks.runs {
		if r == 0 || k.attempt != ks.runs[r-1].attempt {
			if r > 0 {
				end = append(end, k.at)
			}
			first = append(first, k.at)
		}
	}
	if len(first) > 0 {
		end = append(end, ks.n)
	}
	return first, end
}

func (sp *spine) warm(i int) bool { return sp.flag[i]&flagWarm != 0 }
func (sp *spine) skip(i int) bool { return sp.flag[i]&flagSkip != 0 }

// steady: not warm-up, with a step time (the episode windows' steps).
func (sp *spine) steady(i int) bool { return sp.flag[i]&(flagWarm|flagTimed) == flagTimed }

// runAt is the index of the run that holds step i.
func (ks *keys) runAt(i int) int {
	r, found := slices.BinarySearchFunc(ks.runs, i, func(k keyRun, i int) int { return k.at - i })
	if !found {
		r--
	}
	return r
}

// runEnd is the index past run r's last step.
func (ks *keys) runEnd(r int) int {
	if r+1 < len(ks.runs) {
		return ks.runs[r+1].at
	}
	return ks.n
}

// key is step i's (attempt, step).
func (ks *keys) key(i int) [2]int64 { return ks.runs[ks.runAt(i)].key(i) }

// key is the key of step i of the run.
func (k *keyRun) key(i int) [2]int64 {
	return [2]int64{int64(k.attempt), k.step + k.stride*int64(i-k.at)}
}

// keyCursor is key for indexes that mostly rise by one: it keeps the
// run of the last.
type keyCursor struct {
	ks *keys
	r  int
}

func (c *keyCursor) at(i int) [2]int64 {
	runs := c.ks.runs
	if c.r >= len(runs) || runs[c.r].at > i || (c.r+1 < len(runs) && runs[c.r+1].at <= i) {
		if c.r+1 < len(runs) && runs[c.r+1].at <= i && (c.r+2 >= len(runs) || runs[c.r+2].at > i) {
			c.r++
		} else {
			c.r = c.ks.runAt(i)
		}
	}
	return runs[c.r].key(i)
}

// shiftAt is what the clock repair adds to step i's times.
func (sp *spine) shiftAt(i int) int64 {
	k, found := slices.BinarySearchFunc(sp.shifts, i, func(s clockShift, i int) int { return s.at - i })
	if !found {
		if k == 0 {
			return 0
		}
		k--
	}
	return sp.shifts[k].d
}

// spineBuilder builds a spine from steps given in (attempt, step) order.
type spineBuilder struct {
	sp     *spine
	repair bool // repair the clock (unstep); else the times are repaired
	un     unstepper
	shift  int64
}

// newSpineBuilder builds a spine of about capacity steps, holding at
// most inMemory step times in memory (0: valuesInMemory).
func newSpineBuilder(capacity int, repair bool, inMemory int) *spineBuilder {
	return &spineBuilder{sp: &spine{flag: make([]uint8, 0, capacity), slowest: make([]int32, 0, capacity), lo: math.MaxInt64, hi: math.MinInt64, stepTime: values{limit: inMemory}, starts: values{limit: inMemory}}, repair: repair}
}

// add takes the next step.
func (b *spineBuilder) add(attempt, step, start, end, stepTime int64, complete bool) {
	sp := b.sp
	a := clampInt32(attempt)
	i := sp.n
	sp.keys.add(a, step)
	if b.repair {
		b.un.next(int64(a), &start, &end, stepTime)
		if d := b.un.shift; d != b.shift {
			sp.shifts = append(sp.shifts, clockShift{at: i, d: d})
			b.shift = d
		}
	}
	sp.lo, sp.hi = min(sp.lo, start), max(sp.hi, end)
	f := uint8(0)
	if complete {
		f |= flagComplete
	}
	if stepTime > 0 {
		f |= flagTimed
	}
	sp.flag = append(sp.flag, f)
	sp.stepTime.Append(float64(stepTime))
	sp.starts.Append(float64(start))
}

// ranks takes the step just added's world size and critical rank.
func (b *spineBuilder) ranks(world, slowest int64) {
	b.sp.world = max(b.sp.world, world)
	b.sp.slowest = append(b.sp.slowest, clampInt32(slowest))
}

func (b *spineBuilder) done() *spine {
	sp := b.sp
	if sp.n == 0 {
		sp.lo, sp.hi = 0, 0
	}
	return sp
}

// spineOf is the spine of steps held in memory (sorted, clocks repaired).
func spineOf(steps []tps.ClusterStep) *spine {
	b := newSpineBuilder(len(steps), false, 0)
	for i := range steps {
		c := &steps[i]
		b.add(c.Attempt, c.Step, c.StartUnixNs, c.EndUnixNs, c.StepTimeNs, c.Complete())
		b.ranks(c.WorldSize, c.SlowestRank)
	}
	return b.done()
}

// clampInt32 is v within int32 (an attempt, a rank as the spine keeps them).
func clampInt32(v int64) int32 { return int32(min(max(v, math.MinInt32), math.MaxInt32)) }

// errUnsorted stops a read in order (eachRunRow) that met rows out of
// order.
var errUnsorted = errors.New("cluster rows out of order")

// readSpine reads the spine of every cluster row of dir and repairs its
// clock, saying how many jumps back it repaired and the largest. Rows in
// order (a collector's) are taken as they are read, a row group at a
// time; rows out of order (parts of several writers) are read whole,
// sorted and then taken.
func readSpine(dir string, opts []trace.ReadOption, inMemory int) (*spine, int, float64, error) {
	rows := trace.RowCount(dir, opts...)
	b := newSpineBuilder(int(min(max(rows, 0), 1<<24)), true, inMemory) // a footer may lie: grown past 16 Mi steps
	_, err := eachRunRow(dir, runColumns{times: true, stepTime: true, missing: true, ranks: true}, opts, func() {
		b.sp.stepTime.Close()
		b.sp.starts.Close()
		b = newSpineBuilder(int(min(max(rows, 0), 1<<24)), true, inMemory)
	}, func(r *runRow) {
		b.add(r.attempt, r.step, r.start, r.end, r.stepTime, r.missing == 0)
		b.ranks(r.world, r.slowest)
	})
	if err != nil && !trace.IsUnreadable(err) {
		return nil, 0, 0, err
	}
	return b.done(), b.un.jumps, b.un.largest, err
}

// markWarm sets the warm-up and skip flags: warm from a selection's
// whole-run warm-up when given, else by the rule (threshold: the
// automatic rule's, ns; 0 to compute it from the spine's step times).
// It returns the threshold the rule used (0 for a fixed count), and drops
// the step times.
func (sp *spine) markWarm(warmup int, threshold float64, warm map[[2]int64]bool, profiled map[[2]int64]bool) (float64, error) {
	defer sp.stepTime.Close()
	n := sp.len()
	var err error
	if warm != nil {
		kc := keyCursor{ks: &sp.keys}
		for i := range n {
			if warm[kc.at(i)] {
				sp.flag[i] |= flagWarm
			}
		}
	} else {
		if warmup < 0 && threshold <= 0 {
			threshold, err = tps.WarmupThresholdOfValues(&sp.stepTime, warmup)
		}
		err = cmp.Or(err, eachWarm(&sp.keys, &sp.stepTime, tps.WarmupRule{Warmup: warmup, Threshold: threshold}, func(i int) {
			sp.flag[i] |= flagWarm
		}))
	}
	if warmup < 0 && threshold <= 0 && n > 0 {
		// the rule's words: the steps' own
		var terr error
		threshold, terr = tps.WarmupThresholdOfValues(&sp.stepTime, warmup)
		err = cmp.Or(err, terr)
	}
	sp.stepTime = values{}
	kc := keyCursor{ks: &sp.keys}
	for i := range n {
		if sp.flag[i]&flagWarm != 0 || (len(profiled) > 0 && profiled[kc.at(i)]) {
			sp.flag[i] |= flagSkip
		}
	}
	if warmup >= 0 {
		return 0, err
	}
	return threshold, err
}

// markCut marks the steps a save or an evaluation between steps ran into
// (cuts.into: it began after the previous step's start and ended after
// this one's) as out of the statistics, and returns them (at most 1 Mi),
// dropping the start times. Such a step's start is the first rank's: the
// rank still saving or evaluating joins later, and the others wait for it
// in their first collective, which its figures would call exposed
// communication or host time (a checkpoint every 2 steps on 2 ranks: 28%
// and 27% of the run's step time) where the goodput counts it the save's.
func (sp *spine) markCut(cuts cuts) (map[[2]int64]bool, error) {
	defer sp.starts.Close()
	out := map[[2]int64]bool{}
	if len(cuts) == 0 {
		return out, nil
	}
	first, _ := sp.keys.attempts()
	kc := keyCursor{ks: &sp.keys}
	i, a, prev := 0, 0, int64(0)
	err := sp.starts.Each(func(block []float64) {
		for _, f := range block {
			start := int64(f)
			if a < len(first) && first[a] == i {
				a++ // an attempt's first step: no step before it
			} else if cuts.into(prev, start) > start && len(out) < 1<<20 {
				k := kc.at(i)
				out[k] = true
				sp.flag[i] |= flagSkip | flagCut
			}
			prev = start
			i++
		}
	})
	sp.starts = values{}
	return out, err
}

// cuts are the spans of the saves and evaluations (checkpoint and eval
// events), sorted by start: what may run from between two steps into the
// next.
type cuts [][2]int64

func cutsOf(events []tps.Event) cuts {
	var c cuts
	for _, e := range events {
		switch e.Kind {
		case tps.EventCheckpointSave, tps.EventCheckpointRestore, tps.EventEval:
			if e.EndUnixNs > e.StartUnixNs {
				c = append(c, [2]int64{e.StartUnixNs, e.EndUnixNs})
			}
		}
	}
	slices.SortFunc(c, func(x, y [2]int64) int { return cmp.Compare(x[0], y[0]) })
	return c
}

// into is where the saves and evaluations that began after the previous
// step's start (prev) and before this step's start end, where that is
// more than cutMinNs past the start (0 when none runs into the step).
func (c cuts) into(prev, start int64) int64 {
	i, _ := slices.BinarySearchFunc(c, prev+1, func(x [2]int64, t int64) int { return cmp.Compare(x[0], t) })
	var end int64
	for ; i < len(c) && c[i][0] < start; i++ {
		if c[i][1] > start+cutMinNs {
			end = max(end, c[i][1])
		}
	}
	return end
}

// cutMinNs is how far past a step's start a save or evaluation must run
// to be said to run into it: less made no rank wait measurably (and the
// spine's start times, float64, are within 128 ns of the rows').
const cutMinNs = 10_000

// eachWarm calls warm with the index of each step of ks the rule calls
// warm-up, their step times (ns) from times, in order (nil for a fixed
// count).
func eachWarm(ks *keys, times tps.Series, rule tps.WarmupRule, warm func(i int)) error {
	first, end := ks.attempts()
	a, i := 0, 0
	next := func(t int64) {
		if a < len(first) && first[a] == i {
			rule.Attempt(end[a] - first[a])
			a++
		}
		if rule.Next(t) {
			warm(i)
		}
		i++
	}
	if times == nil {
		for range ks.n {
			next(0)
		}
		return nil
	}
	return times.Each(func(ts []float64) {
		for _, t := range ts {
			next(int64(t))
		}
	})
}

// anyComplete: some step is complete and not warm-up.
func (sp *spine) anyComplete() bool {
	for _, f := range sp.flag {
		if f&flagComplete != 0 && f&flagWarm == 0 {
			return true
		}
	}
	return false
}

// span is the earliest start and the latest end.
func (sp *spine) span() (lo, hi int64) { return sp.lo, sp.hi }

// lastOfAttempt: step i is its attempt's last.
func (sp *spine) lastOfAttempt(i int) bool {
	if i+1 == sp.len() {
		return true
	}
	r := sp.runAt(i + 1)
	return sp.runs[r].at == i+1 && (r == 0 || sp.runs[r-1].attempt != sp.runs[r].attempt)
}

// firstStepFrom is the index of the first step at or after (attempt,
// step) k, by binary search.
func (sp *spine) firstStepFrom(k [2]int64) int {
	lo, hi := 0, sp.len()
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if cmpKeys(sp.key(m), k) >= 0 {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// stepAt finds the step (attempt, step) k (the first, if it is there
// twice).
func (sp *spine) stepAt(k [2]int64) (int, bool) {
	i := sp.firstStepFrom(k)
	if i < sp.len() && sp.key(i) == k {
		return i, true
	}
	return 0, false
}
