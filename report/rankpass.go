package report

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// rankSource is the table the per-rank figures come from: what opt asks,
// or automatically rank_windows when rank_steps holds more than
// WindowsAbove rows (or has none) and rank_windows has parts.
func rankSource(dir, want string, rankRows int64) (string, error) {
	hasWindows := len(partsOf(filepath.Join(dir, trace.RankWindows))) > 0
	switch want {
	case RankSourceSteps:
		return trace.RankSteps, nil
	case RankSourceWindows:
		if !hasWindows {
			return "", fmt.Errorf("report: no rank_windows parts under %s (collectors before this version did not write them): read rank_steps instead", dir)
		}
		return trace.RankWindows, nil
	case RankSourceAuto:
		if hasWindows && (rankRows > WindowsAbove || rankRows == 0) {
			return trace.RankWindows, nil
		}
		return trace.RankSteps, nil
	}
	return "", fmt.Errorf("report: unknown rank source %q (%s or %s)", want, RankSourceSteps, RankSourceWindows)
}

func partsOf(dir string) []string {
	if _, err := os.Stat(dir); err != nil {
		return nil
	}
	files, _ := trace.PartFiles(dir)
	return files
}

// rankSink is what both rank passes feed: the nodes, the heatmap, the
// episode windows, the critical rank's own figures, padding, and each
// rank's median compute (the capture's cost and memory go to rep.own).
type rankSink struct {
	world           int64 // the summary's world size
	nodes           map[int64]string
	heat            *heatGrid
	wins            *windows
	crit            *critExcess // nil: not computed (rank_windows)
	med             map[int64]float64
	realTok, padTok int64
}

// rankCols are the columns of rank_steps the report reads (with node).
var (
	rankCols     trace.Cols
	rcAttempt    = rankCols.Col("attempt")
	rcStep       = rankCols.Col("step")
	rcRank       = rankCols.Col("rank")
	rcDuration   = rankCols.Col("duration_ns")
	rcExposed    = rankCols.Col("exposed_comm_ns")
	rcData       = rankCols.Col("data_wait_ns")
	rcHost       = rankCols.Col("?host_ns")
	rcPP         = rankCols.Col("pp_wait_ns")
	rcCkpt       = rankCols.Col("ckpt_ns")
	rcTokens     = rankCols.Col("tokens")
	rcPadded     = rankCols.Col("padded_tokens")
	rcFwd        = rankCols.Col("fwd_ns")
	rcBwd        = rankCols.Col("bwd_ns")
	rcOptim      = rankCols.Col("optim_ns")
	rcCapture    = rankCols.Col("?capture_ns")
	rcCaptureCPU = rankCols.Col("?capture_cpu_ns")
	rcCommCost   = rankCols.Col("?capture_comm_ns")
	rcCommCPU    = rankCols.Col("?capture_comm_cpu_ns")
	rcMemAlloc   = rankCols.Col("?mem_peak_allocated_bytes")
	rcMemResv    = rankCols.Col("?mem_peak_reserved_bytes")
	rcMemCap     = rankCols.Col("?mem_capacity_bytes")
	rcEnd        = rankCols.Col("end_unix_ns")
	// every blocking measure (tps.BlockingMeasures), for compute
	rcBlocking = func() []trace.Col {
		names, core := tps.BlockingMeasures()
		if len(names) > 8 {
			panic("report: more blocking measures than stepRows.row holds")
		}
		out := make([]trace.Col, len(names))
		for i, n := range names {
			if !core[i] {
				n = "?" + n // (written by newer producers only)
			}
			out[i] = rankCols.Col(n)
		}
		return out
	}()
	// which of them are the rank's own time (tps.OwnMeasures: with
	// compute, StepRecord.OwnNs)
	rcOwn = func() (own [8]bool) {
		names, _ := tps.BlockingMeasures()
		owned, _ := tps.OwnMeasures()
		for i, n := range names {
			own[i] = slices.Contains(owned, n)
		}
		return own
	}()
)

// rankOut is what a rank pass's rows leave the report besides k: kept
// apart while the pass runs beside the cluster pass, which writes the
// report (analysis.passes), and taken into it after.
type rankOut struct {
	rows, skipped, windows, windowsLeft int64
	leastPP                             float64
	leastPPSteps                        int
	own                                 ownAcc
	notes                               []string // unreadable parts skipped
	// steady steps whose ranks' rows were seen together (a row group's),
	// and of them those whose ranks' ends lay further apart than the
	// longest of their steps, with the widest spread (ns): ranks of a
	// synchronous job end each step within a step of each other
	together, apart, widest int64
}

// unsynced says the ranks were not one job's: in a quarter or more of
// the steps seen together their ends lay further apart than a step (the
// Trainer with use_cpu and no backend under torchrun trains a copy a
// process, world 1 each: their steps were merged, ends 9 s apart).
func (o *rankOut) unsynced() string {
	if o.together < 8 || 4*o.apart < o.together {
		return ""
	}
	return fmt.Sprintf("ranks not synchronised: in %d of %d steps the ranks' ends lie further apart than a step (up to %.1f s): "+
		"they look like separate copies of the job (no process group made, each its own world), not ranks of one; its figures add them as one job",
		o.apart, o.together, float64(o.widest)/1e9)
}

// into sets the report's rank figures from o.
func (o *rankOut) into(rep *Report) {
	rep.RankRows, rep.RankRowsSkipped = o.rows, o.skipped
	rep.RankWindows, rep.RankWindowsLeft = o.windows, o.windowsLeft
	rep.leastPP, rep.leastPPSteps = o.leastPP, o.leastPPSteps
	rep.own = o.own
	rep.Notes = append(rep.Notes, o.notes...)
	if n := o.unsynced(); n != "" {
		rep.Notes = append(rep.Notes, n)
	}
}

// tolerate is Report.tolerate into o's notes.
func (o *rankOut) tolerate(err error) error {
	if note, ok := unreadableNote(err); ok {
		o.notes = append(o.notes, note)
		return nil
	}
	return err
}

// stepPass reads rank_steps (the selected row groups, a few columns) into
// k: the per-rank compute medians, nodes, the heatmap, the episode
// windows, the critical rank's excess and padding; and into out.
func (a *analysis) stepPass(k *rankSink, out *rankOut) error {
	p := newStepRows(a, k, out)
	var done int64
	pruned, err := trace.EachColumnsIn(a.job.Table(trace.RankSteps), rankCols.Names(), "node", a.ranges, func(c *trace.Columns) error {
		p.group(c)
		done += int64(c.Rows)
		if a.opt.Progress != nil {
			a.opt.Progress(done, a.rankTotal)
		}
		return nil
	}, a.rep.read)
	out.skipped = pruned.Rows
	if err = out.tolerate(err); err != nil {
		return err
	}
	k.med = p.medians()
	if p.ppLeast != nil {
		for _, v := range p.ppLeast {
			if v >= 0 {
				out.leastPP += float64(v)
				out.leastPPSteps++
			}
		}
		if out.leastPPSteps > 0 {
			out.leastPP /= float64(out.leastPPSteps)
		}
	}
	return nil
}

// stepRows is the step pass over rank_steps' rows.
type stepRows struct {
	out *rankOut
	sp  *spine
	k   *rankSink
	// Per rank, by index: a map access per row (medians, nodes) was a
	// tenth of the pass. Ranks past the declared world go to the map.
	byRank []*tps.Median
	named  []bool
	// unnamed counts the ranks in byRank's range not yet named: at 0 a
	// row's node is looked at only for a rank past it
	unnamed int
	others  map[int64]*tps.Median
	keep    int
	kc      keyCursor
	// ppLeast is each steady step's least pipeline wait over its ranks
	// (ns, -1 none yet), made at the first wait seen
	ppLeast []int64
	// a group's rows' blocked time and, of it, their own (the Own
	// blocking measures), summed column by column before the rows are
	// taken: the row loop read the blocking columns one row at a time (a
	// quarter of its time)
	blocked, ownBlocked []int64
}

func newStepRows(a *analysis, k *rankSink, out *rankOut) *stepRows {
	n := min(max(k.world, 0), 1<<20)
	return &stepRows{out: out, sp: a.sp, k: k, byRank: make([]*tps.Median, n), named: make([]bool, n), unnamed: int(n),
		others: map[int64]*tps.Median{}, keep: medianKeepFor(k.world), kc: keyCursor{ks: &a.sp.keys}}
}

// rowCols are a row group's columns the step pass reads, taken out of
// the Columns once a group (a lookup per value was a fifth of the pass).
type rowCols struct {
	rank, dur, data, host, pp, fwd, bwd, optim, tokens, padded, end   []int64
	capture, captureCPU, commCost, commCPU, memAlloc, memResv, memCap []int64
	blocking                                                          [8][]int64
	node                                                              []string
	blocked, ownBlocked                                               []int64 // stepRows.sums
	blockedC, ownBlockedC                                             int64   // and the group's constant part of each
	// the group holds no memory peaks, or no capture figures (their
	// columns constant at 0: CPU jobs, older producers): rows skip them
	noMem, noCost bool
}

func (rc *rowCols) take(c *trace.Columns) {
	*rc = rowCols{rank: c.Col(rcRank), end: c.Col(rcEnd), dur: c.Col(rcDuration), data: c.Col(rcData), host: c.Col(rcHost), pp: c.Col(rcPP), fwd: c.Col(rcFwd), bwd: c.Col(rcBwd),
		optim: c.Col(rcOptim), tokens: c.Col(rcTokens), padded: c.Col(rcPadded), capture: c.Col(rcCapture),
		captureCPU: c.Col(rcCaptureCPU), commCost: c.Col(rcCommCost), commCPU: c.Col(rcCommCPU), memAlloc: c.Col(rcMemAlloc), memResv: c.Col(rcMemResv), memCap: c.Col(rcMemCap),
		node: c.Strings}
	for j, col := range rcBlocking {
		rc.blocking[j] = c.Col(col)
	}
	zero := func(h trace.Col) bool { v, ok := c.Constant(h); return ok && v <= 0 }
	rc.noMem = zero(rcMemAlloc) && zero(rcMemResv)
	rc.noCost = zero(rcCapture) && zero(rcCaptureCPU)
}

// group takes a row group's rows. Rows come grouped by step, mostly in
// the steps' order: the step is looked up when it changes (the next one
// first), and a step's rows are taken together (run).
func (p *stepRows) group(c *trace.Columns) {
	sp := p.sp
	var rc rowCols
	rc.take(c)
	p.sums(&rc, c)
	attempt, step := c.Col(rcAttempt), c.Col(rcStep)
	attempt, step = attempt[:c.Rows], step[:len(attempt)]
	si, ok := 0, false
	p.out.rows += int64(c.Rows)
	for i := 0; i < len(attempt); {
		a, s := attempt[i], step[i]
		j := i + 1
		for j < len(attempt) && step[j] == s && attempt[j] == a {
			j++
		}
		k := [2]int64{a, s}
		if n := si + 1; ok && n < sp.len() && p.kc.at(n) == k {
			si = n
		} else {
			si, ok = sp.stepAt(k)
		}
		if ok {
			p.run(&rc, i, j, si)
		}
		i = j
	}
}

// sums sets rc's blocked and ownBlocked for c's rows, column by column;
// a column constant in the group (zero, mostly: the measures a job does
// not have) is added once (rc.blockedC, rc.ownBlockedC).
func (p *stepRows) sums(rc *rowCols, c *trace.Columns) {
	n := c.Rows
	if cap(p.blocked) < n {
		p.blocked, p.ownBlocked = make([]int64, n), make([]int64, n)
	}
	rc.blocked, rc.ownBlocked = p.blocked[:n], p.ownBlocked[:n]
	clear(rc.blocked)
	clear(rc.ownBlocked)
	for j, h := range rcBlocking {
		if v, ok := c.Constant(h); ok {
			rc.blockedC += v
			if rcOwn[j] {
				rc.ownBlockedC += v
			}
			continue
		}
		col := rc.blocking[j][:n]
		b := rc.blocked[:len(col)]
		for i, v := range col {
			b[i] += v
		}
		if rcOwn[j] {
			o := rc.ownBlocked[:len(col)]
			for i, v := range col {
				o[i] += v
			}
		}
	}
}

// run takes rows [lo, hi) of rc, all of spine step si: what is the
// step's (its flags, heatmap column, episode window, critical rank) is
// looked up once.
func (p *stepRows) run(rc *rowCols, lo, hi, si int) {
	sp, k := p.sp, p.k
	hc := k.heat.col(si)
	f := sp.flag[si]
	warm := f&flagWarm != 0
	// the critical rank, whose row of a steady timed step counts what it
	// had more of than the mean rank
	hasCrit, crit := sp.slowest != nil && !warm && f&flagTimed != 0, int64(0)
	if hasCrit {
		crit = int64(sp.slowest[si])
	}
	win := -1
	if !warm {
		win = k.wins.of(si)
	}
	if !warm && hi-lo >= 2 {
		p.together(rc, lo, hi)
	}
	// (a cut step's stages' waits are the save's; a warm step is skipped too)
	pp := f&flagSkip == 0
	profiled := f&(flagSkip|flagCut) == flagSkip
	for i := lo; i < hi; i++ {
		r, dur := rc.rank[i], rc.dur[i]
		// compute as tps.StepRecord.ComputeNs (the duration less every
		// blocking measure, at least 0), without building a record; its own
		// time (what the others wait for in a synchronous step:
		// StepRecord.OwnNs) compute and the own blocking measures
		comp := float64(max(dur-rc.blocked[i]-rc.blockedC, 0))
		own := comp + float64(rc.ownBlocked[i]+rc.ownBlockedC)
		k.heat.addCol(hc, r, comp)
		inRange := r >= 0 && r < int64(len(p.byRank))
		if (!inRange || p.unnamed > 0) && rc.node[i] != "" && (!inRange || !p.named[r]) && k.nodes[r] == "" {
			k.nodes[r] = rc.node[i]
			if inRange {
				p.named[r] = true
				p.unnamed--
			}
		}
		if hasCrit && r == crit {
			k.crit.addOwn(rc.node[i], r, comp, float64(rc.data[i]), float64(rc.host[i]))
		}
		if !rc.noMem {
			p.out.own.addMem(r, rc.memAlloc[i], rc.memResv[i], rc.memCap[i])
		}
		if warm {
			continue
		}
		if !rc.noCost {
			if profiled {
				// profiled (traced, FLOP-counted): its cost is the profiler's, apart
				p.out.own.addProfiled(rc.capture[i])
			} else {
				// (a step a save ran into costs us as any other)
				p.out.own.addCost(1, rc.capture[i], rc.captureCPU[i], rc.commCost[i], rc.commCPU[i], dur)
			}
		}
		if pp {
			p.leastPP(si, rc.pp[i])
		}
		// its own time, and of it the data wait and the measured forward,
		// backward and optimizer
		k.wins.addIn(win, r, own, float64(rc.data[i]), float64(rc.fwd[i]+rc.bwd[i]+rc.optim[i]))
		if pad := rc.padded[i]; pad > 0 {
			k.realTok += rc.tokens[i]
			k.padTok += pad
		}
		// the straggler verdict is on own time, as the episodes': a rank slow
		// in its data loading is as late for the others as one slow in compute
		p.median(r, inRange).Add(own)
	}
}

// together takes one steady step's rows [lo, hi) seen together: is the
// spread of their ends more than the longest of their steps? Only the
// rows of the first row's node are compared: one clock (nodes' clocks
// differ by more than a short step).
func (p *stepRows) together(rc *rowCols, lo, hi int) {
	e0, e1, d, n := rc.end[lo], rc.end[lo], int64(0), 0
	for i := lo; i < hi; i++ {
		if rc.node[i] != rc.node[lo] {
			continue
		}
		e0, e1, d, n = min(e0, rc.end[i]), max(e1, rc.end[i]), max(d, rc.dur[i]), n+1
	}
	if n < 2 {
		return
	}
	p.out.together++
	if e1-e0 > d {
		p.out.apart++
		p.out.widest = max(p.out.widest, e1-e0)
	}
}

// leastPP takes a rank's pipeline wait in steady step si: the step's least
// over its ranks is kept, from the first wait seen on (a job without a
// pipeline allocates nothing; the steps read before it are left out).
func (p *stepRows) leastPP(si int, pp int64) {
	if p.ppLeast == nil {
		if pp <= 0 {
			return
		}
		p.ppLeast = make([]int64, p.sp.len())
		for j := range p.ppLeast {
			p.ppLeast[j] = -1
		}
	}
	if v := p.ppLeast[si]; v < 0 || pp < v {
		p.ppLeast[si] = pp
	}
}

// median is rank r's median accumulator.
func (p *stepRows) median(r int64, inRange bool) *tps.Median {
	var m *tps.Median
	if inRange {
		if m = p.byRank[r]; m == nil {
			m = &tps.Median{Keep: p.keep}
			p.byRank[r] = m
		}
	} else if m = p.others[r]; m == nil {
		m = &tps.Median{Keep: p.keep}
		p.others[r] = m
	}
	return m
}

// medians are each rank's median compute.
func (p *stepRows) medians() map[int64]float64 {
	for r, m := range p.byRank {
		if m != nil {
			p.others[int64(r)] = m
		}
	}
	med := make(map[int64]float64, len(p.others))
	for r, m := range p.others {
		med[r] = m.Value()
	}
	return med
}

// windowPass reads rank_windows instead: per rank, the merged compute
// sketches' median; per window row, its mean compute in the heatmap at
// its first steady step, and its sums in the episode window of that step.
// Rows of a window holding a warm-up step (or no selected step) are left
// out, so figures cover whole windows; rows of one key are merged by the
// sums they add to, which is what Merge does.
func (a *analysis) windowPass(k *rankSink, out *rankOut) error {
	p := &windowRows{out: out, sp: a.sp, k: k, sketches: map[int64]*tps.Sketch{}, lastKey: [3]int64{-1, -1, -1}, si: -1}
	// the columns the pass takes, decoded column by column: parquet-go's
	// rows rebuilt all 45 of a window's columns through reflection
	_, err := trace.EachColumnsStrs(a.job.Table(trace.RankWindows), windowCols.Names(), []string{"node", "compute_sketch"}, windowRanges(a.ranges), func(c *trace.Columns) error {
		for i := range c.Rows {
			if err := p.row(c, i); err != nil {
				return err
			}
		}
		return nil
	}, a.rep.read, trace.Volatile("compute_sketch"))
	if err = out.tolerate(err); err != nil {
		return err
	}
	k.med = make(map[int64]float64, len(p.sketches))
	for r, sk := range p.sketches {
		k.med[r] = sk.Quantile(0.5)
	}
	return nil
}

// windowRows is the window pass over rank_windows' rows.
type windowRows struct {
	out      *rankOut
	sp       *spine
	k        *rankSink
	sketches map[int64]*tps.Sketch
	scratch  tps.Sketch
	// the window's steps in the (sorted) selection: walked once for the
	// window's ranks, which come together (a lookup per step of every
	// window row was most of a 100 M-row report)
	lastKey     [3]int64
	si          int
	in, anyWarm bool
}

// window finds the steps of window key (attempt, first step, last step):
// its first steady step, whether any is selected, whether one is warm.
func (p *windowRows) window(key [3]int64) {
	sp := p.sp
	p.lastKey = key
	p.si, p.in, p.anyWarm = -1, false, false
	kc := keyCursor{ks: &sp.keys}
	for j := sp.firstStepFrom([2]int64{key[0], key[1]}); j < sp.len(); j++ {
		if k := kc.at(j); k[0] != key[0] || k[1] > key[2] {
			break
		}
		p.in = true
		if sp.warm(j) {
			p.anyWarm = true
			return
		}
		if p.si < 0 {
			p.si = j
		}
	}
}

// row takes row i of c.
func (p *windowRows) row(c *trace.Columns, i int) error {
	out, k := p.out, p.k
	first, steps := c.Col(wcFirst)[i], c.Col(wcSteps)[i]
	out.windows++
	if key := [3]int64{c.Col(wcAttempt)[i], first, c.Col(wcLast)[i]}; key != p.lastKey {
		p.window(key)
	}
	if !p.in {
		return nil // outside the selection
	}
	if p.anyWarm || p.si < 0 || steps <= 0 {
		out.windowsLeft++
		return nil
	}
	out.rows += steps
	r, n := c.Col(wcRank)[i], float64(steps)
	if node := c.Str[0][i]; node != "" && k.nodes[r] == "" {
		k.nodes[r] = node
	}
	compute, data := c.Col(wcCompute)[i], c.Col(wcData)[i]
	k.heat.add(p.si, r, float64(compute)/n)
	out.own.addCost(steps, c.Col(wcCapture)[i], c.Col(wcCaptureCPU)[i], c.Col(wcCommCost)[i], c.Col(wcCommCPU)[i], c.Col(wcDuration)[i])
	out.own.addMem(r, c.Col(wcMemAlloc)[i], c.Col(wcMemResv)[i], c.Col(wcMemCap)[i])
	work := c.Col(wcFwd)[i] + c.Col(wcBwd)[i] + c.Col(wcOptim)[i]
	own := compute // (its own time: StepRecord.OwnNs)
	for _, col := range wcOwn {
		own += c.Col(col)[i]
	}
	k.wins.addN(p.si, r, float64(own), float64(data), float64(work), int32(steps))
	if padded := c.Col(wcPadded)[i]; padded > 0 {
		k.realTok += c.Col(wcTokPadded)[i]
		k.padTok += padded
	}
	return p.sketch(r, first, c.Str[1][i])
}

// sketch merges the row's compute sketch into rank r's: its JSON read in
// place (SketchFromJSON does not keep it; the string is valid during this
// call: trace.Volatile).
func (p *windowRows) sketch(r, first int64, js string) error {
	ok, err := tps.SketchFromJSON(unsafe.Slice(unsafe.StringData(js), len(js)), &p.scratch)
	if err != nil {
		return fmt.Errorf("report: rank window %d of rank %d: %w", tps.WindowOf(first), r, err)
	}
	if !ok {
		return nil
	}
	if m := p.sketches[r]; m == nil {
		sk := p.scratch
		sk.Bins = slices.Clone(p.scratch.Bins) // scratch is decoded into again
		p.sketches[r] = &sk
	} else {
		m.Merge(&p.scratch)
	}
	return nil
}

// windowCols are the int64 columns of rank_windows the report reads
// (with node and compute_sketch).
var (
	windowCols   trace.Cols
	wcAttempt    = windowCols.Col("attempt")
	wcRank       = windowCols.Col("rank")
	wcFirst      = windowCols.Col("first_step")
	wcLast       = windowCols.Col("last_step")
	wcSteps      = windowCols.Col("steps")
	wcCompute    = windowCols.Col("compute_ns.sum")
	wcData       = windowCols.Col("data_wait_ns.sum")
	wcFwd        = windowCols.Col("fwd_ns.sum")
	wcBwd        = windowCols.Col("bwd_ns.sum")
	wcOptim      = windowCols.Col("optim_ns.sum")
	wcPadded     = windowCols.Col("padded_tokens")
	wcTokPadded  = windowCols.Col("tokens_padded")
	wcCapture    = windowCols.Col("?capture_ns.sum")
	wcCaptureCPU = windowCols.Col("?capture_cpu_ns.sum")
	wcCommCost   = windowCols.Col("?capture_comm_ns.sum")
	wcCommCPU    = windowCols.Col("?capture_comm_cpu_ns.sum")
	wcDuration   = windowCols.Col("duration_ns.sum")
	wcMemAlloc   = windowCols.Col("?mem_peak_allocated_bytes.max")
	wcMemResv    = windowCols.Col("?mem_peak_reserved_bytes.max")
	wcMemCap     = windowCols.Col("?mem_capacity_bytes.max")
	// the measures a rank's own time adds to its compute (tps.OwnMeasures;
	// each windowed: TestBlockingMeasuresSummed)
	wcOwn = func() []trace.Col {
		names, core := tps.OwnMeasures()
		out := make([]trace.Col, len(names))
		for i, n := range names {
			if !core[i] {
				n = "?" + n // (windows written before it: zeros)
			}
			out[i] = windowCols.Col(n + ".sum")
		}
		return out
	}()
)

// windowRanges bound the rank_windows row groups that can hold windows of
// the selected steps (ranges: attempt and step, as spine.ranges gives;
// none: all): a window [first_step, last_step] holds a step of [lo, hi]
// when first_step <= hi and last_step >= lo.
func windowRanges(ranges []trace.Range) []trace.Range {
	var within []trace.Range
	for _, r := range ranges {
		switch r.Column {
		case "step":
			within = append(within, trace.Range{Column: "first_step", Min: math.MinInt64, Max: r.Max},
				trace.Range{Column: "last_step", Min: r.Min, Max: math.MaxInt64})
		default:
			within = append(within, r)
		}
	}
	return within
}
