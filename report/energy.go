package report

import (
	"cmp"
	"errors"
	"maps"
	"math"
	"path/filepath"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// maxSampleGap is the longest time between two readings of one GPU that
// still speaks for the steps between them (tps.MaxReadingGap).
const maxSampleGap = tps.MaxReadingGap

// energyJoin measures the energy of the steady steps again from the whole
// gpu_samples table, as the report reads it: each GPU's energy counter
// (millijoules), interpolated linearly between consecutive readings,
// integrated over each step's period (the step's end less its step time,
// to its end: consecutive periods tile the time, where the cluster rows'
// spans overlap as ranks start at different moments). The live join the
// collector writes into each cluster row takes the samples that reached
// it before the row was written, which varies with arrival order and
// load; this one does not. A step counts when every GPU's readings cover
// its whole period; the run's tokens per joule are over those steps.
// Between two readings the energy is tps.EnergyRate's, the rule the live
// join integrates too: the counter's increase, or where it is absent or
// went down (a reset) the mean of the two readings' power.
type energyJoin struct {
	offsets map[string]int64 // node clock offsets: samples onto the rows' clock
	built   bool             // steps sorted (at the first reading)
	steps   []energyStep     // steady steps by period start
	maxEnd  []int64          // running maximum of the ends, in that order
	gpus    map[gpuKey]*tps.GPUPoint
	stale   int64 // readings not after the GPU's previous one (skipped)
}

type energyStep struct {
	start, end int64
	tokens     int64
	joules     float64
	covered    int64 // GPU-nanoseconds of the period with readings around them
	i          int   // the order it came in
}

type gpuKey struct {
	node, uuid string
	index      int32
}

// newEnergyJoinOf is a join with no steps yet (addStep adds them).
func newEnergyJoinOf(offsets map[string]int64) *energyJoin {
	return &energyJoin{offsets: offsets, gpus: map[gpuKey]*tps.GPUPoint{}}
}

// addStep takes a step that counts (before the first reading): its
// period, the step time to its end (48 B a step, a chunk's at a time).
func (e *energyJoin) addStep(c *tps.ClusterStep) {
	e.steps = append(e.steps, energyStep{start: c.EndUnixNs - c.StepTimeNs, end: c.EndUnixNs, tokens: c.Tokens, i: len(e.steps)})
}

func (e *energyJoin) build() {
	e.built = true
	slices.SortStableFunc(e.steps, func(a, b energyStep) int { return cmp.Compare(a.start, b.start) })
	e.maxEnd = make([]int64, len(e.steps))
	for i, s := range e.steps {
		e.maxEnd[i] = s.end
		if i > 0 {
			e.maxEnd[i] = max(s.end, e.maxEnd[i-1])
		}
	}
}

func (e *energyJoin) add(s *tps.GPUSample) {
	if !e.built {
		e.build()
	}
	if len(e.steps) == 0 {
		return
	}
	cur := tps.GPUPoint{UnixNs: s.UnixNs - e.offsets[s.Node], EnergyMJ: -1, PowerW: math.NaN()}
	if s.EnergyMJ != nil && *s.EnergyMJ >= 0 {
		cur.EnergyMJ = *s.EnergyMJ
	}
	if s.PowerW != nil && *s.PowerW >= 0 && !math.IsInf(*s.PowerW, 0) {
		cur.PowerW = *s.PowerW
	}
	k := gpuKey{s.Node, s.UUID, s.Index}
	last := e.gpus[k]
	if last == nil {
		if len(e.gpus) >= 1<<20 {
			return
		}
		e.gpus[k] = &cur
		return
	}
	if cur.UnixNs <= last.UnixNs {
		e.stale++
		return
	}
	e.spread(*last, cur)
	*last = cur
}

// GPMSlackNs is how long after a steady step's end a GPU sample still
// speaks for it: a GPM figure describes the interval before its sample,
// and an agent's sample may land in the few milliseconds between two
// steps (the demo's always does).
const GPMSlackNs = int64(50e6)

// inStep says whether t (on the rows' clock) lies in a step's period, or
// at most GPMSlackNs after its end.
func (e *energyJoin) inStep(t int64) bool {
	if !e.built {
		e.build()
	}
	i, _ := slices.BinarySearch(e.maxEnd, t-GPMSlackNs+1) // the first step that may end after t − slack
	for ; i < len(e.steps) && e.steps[i].start <= t; i++ {
		if t <= e.steps[i].end+GPMSlackNs {
			return true
		}
	}
	return false
}

// spread gives the energy between two readings of one GPU to the steps
// whose periods overlap them.
func (e *energyJoin) spread(a, b tps.GPUPoint) {
	perNs, _, ok := tps.EnergyRate(a, b) // joules a nanosecond
	if !ok {
		return
	}
	// the first step that may end after a, then on while they start before b
	i, _ := slices.BinarySearch(e.maxEnd, a.UnixNs+1)
	for ; i < len(e.steps) && e.steps[i].start < b.UnixNs; i++ {
		st := &e.steps[i]
		ov := min(b.UnixNs, st.end) - max(a.UnixNs, st.start)
		if ov > 0 {
			st.joules += perNs * float64(ov)
			st.covered += ov
		}
	}
}

// result: the run's energy over the steps every GPU's readings cover, and
// how many steps that is; ok false when none is covered.
func (e *energyJoin) result() (tokensPerJoule float64, steps int, ok bool) {
	a := newEnergyAcc()
	a.fold(e)
	return a.result()
}

// energyAcc is the run's energy from joins of its steps a chunk at a time
// (energyPass): the GPUs read, and the steps' tokens and joules summed by
// how many GPUs' readings cover their whole period (a step counts when
// every GPU's do, and how many GPUs the run has is known at the end).
type energyAcc struct {
	gpus map[gpuKey]bool
	by   map[int64]*energySum
}

type energySum struct {
	tokens, joules float64
	steps          int
}

func newEnergyAcc() *energyAcc {
	return &energyAcc{gpus: map[gpuKey]bool{}, by: map[int64]*energySum{}}
}

// fold takes a join's GPUs and steps (in the order they came in: the
// sums are the same however the steps are cut into chunks).
func (a *energyAcc) fold(e *energyJoin) {
	for k := range e.gpus {
		if len(a.gpus) < 1<<20 {
			a.gpus[k] = true
		}
	}
	slices.SortFunc(e.steps, func(x, y energyStep) int { return cmp.Compare(x.i, y.i) })
	for _, s := range e.steps {
		k := int64(math.MaxInt64) // a period of no time is covered
		if p := s.end - s.start; p > 0 {
			k = s.covered / p
		}
		b := a.by[k]
		if b == nil {
			b = &energySum{}
			a.by[k] = b
		}
		b.tokens += float64(s.tokens)
		b.joules += s.joules
		b.steps++
	}
}

func (a *energyAcc) result() (tokensPerJoule float64, steps int, ok bool) {
	n := int64(len(a.gpus))
	if n == 0 {
		return 0, 0, false
	}
	var tokens, joules float64
	for _, k := range slices.Sorted(maps.Keys(a.by)) {
		if k < n {
			continue
		}
		b := a.by[k]
		tokens += b.tokens
		joules += b.joules
		steps += b.steps
	}
	if steps == 0 || joules <= 0 || tokens <= 0 {
		return 0, 0, false
	}
	return tokens / joules, steps, true
}

// energyPass joins the steady steps with gpu_samples a chunk of steps at
// a time, and feeds every sample once to the GPU series. The chunks' time
// ranges cut the time axis into tiles; a chunk's join reads the samples of
// its tile and of its steps' periods, widened by the longest gap two
// readings may span (maxSampleGap) and the nodes' clock offsets: a pair of
// readings it does not see cannot speak for its steps. The table is so
// read about once when its row groups hold consecutive times (a
// collector's); each sample goes to the series in the tile holding it.
// A held run is one chunk and one tile: the whole table.
type energyPass struct {
	dir    string
	opts   []trace.ReadOption
	limit  [2]int64 // the samples' unix_ns read at most (a selection's)
	margin int64    // ns: maxSampleGap and the largest clock offset
	// minSteps: a chunk ends when it holds that many steady steps (or at
	// the end of the cluster rows' chunk past them)
	minSteps int
	joinOf   func() *energyJoin
	acc      *energyAcc
	gpu      *gpuSeries
	gpm      gpmAcc                 // the samples in steady steps (the MFU ledger's GPU activity)
	n        int64                  // samples read
	unread   *trace.UnreadableParts // of every read, each part once
	// parts are gpu_samples' parts and the times each holds, other those
	// without (unreadable: each read names them); read at the first join
	parts []trace.PartRange
	other []string
	// cur is the chunk being added, its steps' periods within [curLo,
	// curHi]; pend the one before, joined when the next one's start bounds
	// its tile, which starts at tileLo
	cur, pend                    *energyJoin
	curLo, curHi, pendLo, pendHi int64
	tileLo                       int64
}

func newEnergyPass(dir string, opts []trace.ReadOption, limit [2]int64, offsets map[string]int64, gpu *gpuSeries, minSteps int) *energyPass {
	p := &energyPass{dir: dir, opts: opts, limit: limit, margin: maxSampleGap + int64(1e9) + largestOffset(offsets), acc: newEnergyAcc(), gpu: gpu,
		minSteps: minSteps, joinOf: func() *energyJoin { return newEnergyJoinOf(offsets) }, tileLo: math.MinInt64}
	p.cur, p.curLo, p.curHi = p.joinOf(), math.MaxInt64, math.MinInt64
	return p
}

func (p *energyPass) addStep(c *tps.ClusterStep) {
	p.cur.addStep(c)
	p.curLo, p.curHi = min(p.curLo, c.EndUnixNs-c.StepTimeNs), max(p.curHi, c.EndUnixNs)
}

// chunkDone ends a chunk of the cluster rows, and so a chunk of the join
// once it holds minSteps steps: the one before it is joined, its tile
// ending where this one's steps begin.
func (p *energyPass) chunkDone() error {
	if len(p.cur.steps) < max(p.minSteps, 1) {
		return nil
	}
	return p.rotate()
}

// rotate joins the chunk before, and makes the current one pending.
func (p *energyPass) rotate() error {
	if p.pend != nil {
		next := max(p.tileLo, p.curLo)
		if err := p.join(p.pend, p.tileLo, next, p.pendLo, p.pendHi); err != nil {
			return err
		}
		p.tileLo = next
	}
	p.pend, p.pendLo, p.pendHi = p.cur, p.curLo, p.curHi
	p.cur, p.curLo, p.curHi = p.joinOf(), math.MaxInt64, math.MinInt64
	return nil
}

// finish joins the last chunk, its tile to the end of time (or reads the
// samples for the series alone when no step counts). Its error may be
// the parts no read could read (trace.UnreadableParts), said once.
func (p *energyPass) finish() error {
	if len(p.cur.steps) > 0 {
		if err := p.rotate(); err != nil {
			return err
		}
	}
	var err error
	if p.pend == nil {
		err = p.join(p.joinOf(), math.MinInt64, math.MaxInt64, math.MaxInt64, math.MinInt64)
	} else {
		err = p.join(p.pend, p.tileLo, math.MaxInt64, p.pendLo, p.pendHi)
	}
	if err == nil && p.unread != nil {
		return p.unread
	}
	return err
}

// join reads the samples for the steps of e, whose periods span [lo, hi],
// feeding those in the tile [tileLo, tileHi) to the series.
func (p *energyPass) join(e *energyJoin, tileLo, tileHi, lo, hi int64) error {
	var from, to int64 = math.MinInt64, math.MaxInt64
	if w := min(tileLo, lo); w > math.MinInt64+p.margin {
		from = w - p.margin
	}
	if w := max(tileHi, hi); w < math.MaxInt64-p.margin {
		to = w + p.margin
	}
	from, to = max(from, p.limit[0]), min(to, p.limit[1])
	dir := filepath.Join(p.dir, trace.GPUSamples)
	if p.parts == nil {
		// a window opens only the parts that can hold its times: every
		// part's footer read for every chunk was a tenth of the bytes of
		// a long run's report
		p.parts = trace.PartRanges(dir, []string{"unix_ns"}, p.opts...)
		ranged := make(map[string]bool, len(p.parts))
		for _, r := range p.parts {
			ranged[r.Path] = true
		}
		files, _ := trace.PartFiles(dir)
		for _, f := range files {
			if !ranged[f] {
				p.other = append(p.other, f)
			}
		}
	}
	paths := slices.Clone(p.other)
	for _, r := range p.parts {
		if !r.Known || (r.Max[0] >= from && r.Min[0] <= to) {
			paths = append(paths, r.Path)
		}
	}
	opts := append(slices.Clip(p.opts), trace.Parts(paths...))
	if from != math.MinInt64 || to != math.MaxInt64 {
		opts = append(opts, trace.Within(trace.Range{Column: "unix_ns", Min: from, Max: to}))
	}
	err := trace.Each(dir, func(rows []tps.GPUSample) error {
		for i := range rows {
			s := &rows[i]
			if s.UnixNs >= tileLo && (s.UnixNs < tileHi || tileHi == math.MaxInt64) {
				p.n++
				p.gpu.add(s)
				if e.inStep(s.UnixNs - e.offsets[s.Node]) {
					p.gpm.add(s)
				}
			}
			e.add(s)
		}
		return nil
	}, opts...)
	p.acc.fold(e)
	var u *trace.UnreadableParts
	if errors.As(err, &u) {
		if p.unread == nil {
			p.unread = &trace.UnreadableParts{}
		}
		for k, path := range u.Paths {
			if !slices.Contains(p.unread.Paths, path) {
				p.unread.Paths, p.unread.Errors = append(p.unread.Paths, path), append(p.unread.Errors, u.Errors[k])
			}
		}
		return nil
	}
	return err
}
