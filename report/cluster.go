package report

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// The report's cluster pass. A whole-run report does not hold the run's
// cluster rows (416 B a step in memory, and the heap peaks at about twice
// that): it reads a spine of every step (its key, times, completeness and
// warm-up, 37 B a step) and then the rows themselves in chunks of
// clusterChunk steps, in (attempt, step) order, each fed to the
// accumulators below and dropped (the plots keep a plotStep of each). A
// report of a selection, or of a run of one chunk, holds its rows and
// feeds them as one chunk: the figures are computed by the same code
// either way (TestStreamedReportEqualsInMemory; every Analyze and
// AnalyzeWithPlots of this package's tests checks it, see TestMain).

// clusterChunk is how many steps of cluster rows a streamed report holds
// at once (64 Ki rows: 27 MB); a run of no more steps is read at once.
var clusterChunk = 1 << 16

// spine is what the report keeps of each step it covers, sorted by
// (attempt, step), times on the repaired clock (unstepClocks).
type spine struct {
	runSteps
	flag []uint8 // flagComplete, flagWarm, flagSkip
	// the critical rank and what the mean rank had (compute, data wait,
	// ns), for the rank_steps pass; nil unless it runs
	slowest            []int32
	critComp, critData []float64
}

const (
	flagComplete uint8 = 1 << iota // no rank missing
	flagWarm                       // warm-up
	flagSkip                       // out of the statistics: warm-up or profiled
)

func (sp *spine) warm(i int) bool { return sp.flag[i]&flagWarm != 0 }
func (sp *spine) skip(i int) bool { return sp.flag[i]&flagSkip != 0 }

// steady: not warm-up, with a step time (the episode windows' steps).
func (sp *spine) steady(i int) bool { return sp.flag[i]&flagWarm == 0 && sp.stepTime[i] > 0 }

// spineOf is the spine of steps held in memory (sorted, clocks repaired).
func spineOf(steps []tps.ClusterStep) *spine {
	n := len(steps)
	sp := &spine{runSteps: runSteps{attempt: make([]int32, n), step: make([]int64, n), start: make([]int64, n), end: make([]int64, n), stepTime: make([]int64, n)},
		flag: make([]uint8, n)}
	for i := range steps {
		c := &steps[i]
		sp.attempt[i] = clampAttempt(c.Attempt)
		sp.step[i], sp.start[i], sp.end[i], sp.stepTime[i] = c.Step, c.StartUnixNs, c.EndUnixNs, c.StepTimeNs
		if c.Complete() {
			sp.flag[i] = flagComplete
		}
	}
	return sp
}

func clampAttempt(a int64) int32 { return int32(min(max(a, math.MinInt32), math.MaxInt32)) }

// readSpine reads the spine of every cluster row of dir and repairs its
// clock, saying how many jumps back it repaired and the largest.
func readSpine(dir string, opts []trace.ReadOption) (*spine, int, float64, error) {
	run, err := readRunSteps(dir, runColumns{times: true, stepTime: true, missing: true}, opts)
	if err != nil && !trace.IsUnreadable(err) {
		return nil, 0, 0, err
	}
	sp := &spine{runSteps: *run, flag: make([]uint8, run.len())}
	for i, m := range run.missing {
		if m == 0 {
			sp.flag[i] = flagComplete
		}
	}
	sp.missing = nil
	jumps, back := unstep(sp.len(), func(i int) (int64, *int64, *int64, int64) {
		return int64(sp.attempt[i]), &sp.start[i], &sp.end[i], sp.stepTime[i]
	})
	return sp, jumps, back, err
}

// markWarm sets the warm-up and skip flags: warm from a selection's
// whole-run warm-up when given, else by the rule (threshold: the
// automatic rule's, ns; 0 to compute it from the spine's step times).
// It returns the threshold the rule used (0 for a fixed count).
func (sp *spine) markWarm(warmup int, threshold float64, warm map[[2]int64]bool, profiled map[[2]int64]bool) float64 {
	n := sp.len()
	if warm != nil {
		for i := range n {
			if warm[sp.key(i)] {
				sp.flag[i] |= flagWarm
			}
		}
	} else {
		if warmup < 0 && threshold <= 0 {
			threshold = tps.WarmupThresholdOf(sp.stepTime, warmup)
		}
		for i, w := range tps.WarmupMaskAt(n, func(i int) int64 { return int64(sp.attempt[i]) }, func(i int) int64 { return sp.stepTime[i] }, warmup, threshold) {
			if w {
				sp.flag[i] |= flagWarm
			}
		}
	}
	if warmup < 0 && threshold <= 0 && n > 0 {
		threshold = tps.WarmupThresholdOf(sp.stepTime, warmup) // the rule's words: the steps' own
	}
	for i := range n {
		if sp.flag[i]&flagWarm != 0 || profiled[sp.key(i)] {
			sp.flag[i] |= flagSkip
		}
	}
	if warmup >= 0 {
		return 0
	}
	return threshold
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
func (sp *spine) span() (lo, hi int64) {
	lo, hi = sp.start[0], sp.end[0]
	for i := range sp.start {
		lo, hi = min(lo, sp.start[i]), max(hi, sp.end[i])
	}
	return lo, hi
}

// lastOfAttempt: step i is its attempt's last.
func (sp *spine) lastOfAttempt(i int) bool {
	return i+1 == sp.len() || sp.attempt[i+1] != sp.attempt[i]
}

// firstStepFrom is the index of the first step at or after (attempt,
// step) k, by binary search.
func (sp *spine) firstStepFrom(k [2]int64) int {
	lo, hi := 0, sp.len()
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if a := int64(sp.attempt[m]); a > k[0] || (a == k[0] && sp.step[m] >= k[1]) {
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
	if i < sp.len() && int64(sp.attempt[i]) == k[0] && sp.step[i] == k[1] {
		return i, true
	}
	return 0, false
}

// ranges bound the rank rows of the spine's steps [lo, hi), for skipping
// row groups by their statistics.
func (sp *spine) ranges(lo, hi int) []trace.Range {
	a := trace.Range{Column: "attempt", Min: int64(sp.attempt[lo]), Max: int64(sp.attempt[hi-1])}
	st := trace.Range{Column: "step", Min: sp.step[lo], Max: sp.step[lo]}
	for _, s := range sp.step[lo:hi] {
		st.Min, st.Max = min(st.Min, s), max(st.Max, s)
	}
	return []trace.Range{a, st}
}

// clusterSource feeds the cluster rows of the spine's steps [lo, hi), in
// order, a chunk at a time: fn gets the index of the chunk's first step
// and its rows (valid during the call).
type clusterSource interface {
	each(lo, hi int, fn func(off int, rows []tps.ClusterStep) error) error
}

// heldRows are rows the report holds (a selection, or for the plots).
type heldRows []tps.ClusterStep

func (h heldRows) each(lo, hi int, fn func(int, []tps.ClusterStep) error) error {
	if lo >= hi {
		return nil
	}
	return fn(lo, h[lo:hi])
}

// streamedRows reads the rows from the table, a chunk of at most
// clusterChunk steps at a time, from the row groups whose statistics can
// hold them, and puts each row's times where the spine has them.
type streamedRows struct {
	dir   string
	sp    *spine
	chunk int
	opts  []trace.ReadOption
	// cuts are where the table's row groups end, counted in rows: a chunk
	// ends at one when that is near, so that a table written in order (a
	// collector's) has each row group read once, not by two chunks
	cuts []int
	// parts are the table's parts and the attempts and steps each holds:
	// a chunk opens only those that can hold its steps (a collector writes
	// a part a minute: 26,000 for a run of 1.56 M steps at one a second,
	// whose footers past the few trace.Footers keeps open would be read
	// again for every chunk)
	parts []trace.PartRange
}

func newStreamedRows(dir string, sp *spine, chunk int, opts []trace.ReadOption) *streamedRows {
	s := &streamedRows{dir: dir, sp: sp, chunk: max(chunk, 1), opts: opts}
	at := 0
	for _, n := range trace.RowGroupRows(dir, opts...) {
		at += int(n)
		s.cuts = append(s.cuts, at)
	}
	s.parts = trace.PartRanges(dir, []string{"attempt", "step"}, opts...)
	return s
}

// partsFor are the parts that can hold rows within ranges (attempt, then
// step, as spine.ranges gives them).
func (s *streamedRows) partsFor(ranges []trace.Range) []string {
	var out []string
	for _, p := range s.parts {
		if !p.Known || (p.Max[0] >= ranges[0].Min && p.Min[0] <= ranges[0].Max && p.Max[1] >= ranges[1].Min && p.Min[1] <= ranges[1].Max) {
			out = append(out, p.Path)
		}
	}
	return out
}

// chunkEnd is where the chunk from lo ends: at the first row group's end
// at or past lo+chunk when that is within four chunks, else at lo+chunk.
func (s *streamedRows) chunkEnd(lo, hi int) int {
	want := lo + s.chunk
	if k, _ := slices.BinarySearch(s.cuts, want); k < len(s.cuts) && s.cuts[k] <= lo+4*s.chunk {
		want = s.cuts[k]
	}
	return min(want, hi)
}

func (s *streamedRows) each(lo, hi int, fn func(int, []tps.ClusterStep) error) error {
	sp := s.sp
	for lo < hi {
		end := s.chunkEnd(lo, hi)
		for end < hi && sp.key(end) == sp.key(end-1) {
			end++ // a step's rows stay in one chunk
		}
		ranges := sp.ranges(lo, end)
		all, err := trace.ReadAll[tps.ClusterStep](s.dir, append(s.opts, trace.Within(ranges...), trace.Parts(s.partsFor(ranges)...))...)
		if err != nil && !trace.IsUnreadable(err) { // unreadable parts: said when the spine was read
			return err
		}
		tps.SortSteps(all)
		// the spine's steps, in order: rows of parts finalised since the
		// spine was read (a running job) are passed over
		rows, j := all[:0], 0
		for i := lo; i < end; i++ {
			k := sp.key(i)
			for j < len(all) && cmpKeys([2]int64{int64(clampAttempt(all[j].Attempt)), all[j].Step}, k) < 0 {
				j++
			}
			if j == len(all) || all[j].Attempt != k[0] || all[j].Step != k[1] {
				return fmt.Errorf("report: %s changed while read: the cluster row of attempt %d step %d is gone", s.dir, k[0], k[1])
			}
			c := all[j]
			j++
			c.StartUnixNs, c.EndUnixNs = sp.start[i], sp.end[i]
			rows = append(rows, c)
		}
		if err := fn(lo, rows); err != nil {
			return err
		}
		lo = end
	}
	return nil
}

// clusterPass is every figure the report takes from the cluster rows
// alone, fed the rows in order.
type clusterPass struct {
	sp     *spine
	sum    *tps.Summarizer
	brk    breakdownAcc
	gen    generationAcc
	wait   waitAcc
	good   *goodputAcc
	att    *attemptsAcc
	energy *energyJoin // nil: no GPU samples to join
	crit   bool        // fill the spine's critical rank columns
	plot   []plotStep  // what the plots draw of each step; nil: no plots
}

func (p *clusterPass) add(off int, rows []tps.ClusterStep) error {
	sp := p.sp
	for j := range rows {
		c, i := &rows[j], off+j
		warm, skip := sp.warm(i), sp.skip(i)
		p.sum.Add(c, warm)
		if p.plot != nil {
			p.plot = append(p.plot, plotStepOf(c))
		}
		p.good.add(c, warm, sp.lastOfAttempt(i))
		p.att.add(c, warm)
		if p.crit {
			sp.slowest[i] = int32(min(max(c.SlowestRank, math.MinInt32), math.MaxInt32))
			sp.critComp[i], sp.critData[i] = c.ComputeNsMean, c.DataStallFractionMean*float64(c.StepTimeNs)
		}
		if skip || c.StepTimeNs <= 0 {
			continue
		}
		p.brk.add(c)
		p.gen.add(c)
		p.wait.add(c)
		if p.energy != nil && c.EndUnixNs > 0 {
			p.energy.addStep(c)
		}
	}
	return nil
}

// breakdownAcc is the time breakdown's per-step means, the fit of TPS on
// exposed communication and the live energy join, over steady steps.
type breakdownAcc struct {
	n, compute, overlap      float64
	fx, fy, fxx, fxy, fyy    float64 // the fit's sums (fitLine)
	fn                       int
	eSteps, eTokens, eJoules float64
	power, clock             float64
	throttled                int
}

func (b *breakdownAcc) add(c *tps.ClusterStep) {
	b.n++
	b.compute += c.ComputeNsMean / float64(c.StepTimeNs)
	b.overlap += c.CommOverlap
	x, y := c.CommFractionMean, c.TPS
	b.fn++
	b.fx += x
	b.fy += y
	b.fxx += x * x
	b.fxy += x * y
	b.fyy += y * y
	if c.GPUsJoined > 0 && c.EnergyJ > 0 {
		b.eSteps++
		b.eTokens += float64(c.Tokens)
		b.eJoules += c.EnergyJ
		b.power += c.PowerWMean
		b.clock += c.SMClockMHzMean
		// bits 0 (GPU idle) and 1 (application clocks) are not throttling
		if c.ClockEventReasons&^0x3 != 0 {
			b.throttled++
		}
	}
}

// result sets the report's breakdown, fit and live energy (rep.Summary
// and rep.Meta set).
func (b *breakdownAcc) result(rep *Report) {
	s := rep.Summary
	br := &rep.Breakdown
	if b.n > 0 {
		br.Compute = b.compute / b.n
		br.CommOverlap = b.overlap / b.n
	}
	br.ExposedComm, br.Bubble = s.CommFraction, s.BubbleFraction
	br.WaitingForPeers = s.WaitFraction
	br.DataStall, br.Checkpoint = s.DataStallFraction, s.CkptFraction
	if b.n > 0 {
		br.Other = max(0, 1-(br.Compute+br.ExposedComm+br.WaitingForPeers+br.Bubble+br.DataStall+br.Checkpoint))
	}
	if rep.Meta != nil {
		br.BubbleTheoretical = tps.TheoreticalBubble(rep.Meta.Topology.PP, rep.Meta.MicroBatches, rep.Meta.Interleave)
	}
	rep.CommFit = fitSums(float64(b.fn), b.fx, b.fy, b.fxx, b.fxy, b.fyy)
	if b.eSteps > 0 {
		rep.Energy = &Energy{TokensPerJoule: b.eTokens / b.eJoules, JoulesPerToken: b.eJoules / b.eTokens,
			Steps: int(b.eSteps), PowerWMean: b.power / b.eSteps, SMClockMHzMean: b.clock / b.eSteps, ThrottledSteps: b.throttled}
	}
}

// generationAcc sums up the generation phases and the text rate of the
// steady steps.
type generationAcc struct {
	g             Generation
	genSec, mfu   float64
	mfuN          int
	txt           TextRate
	bytes, tokens int64
	sec           float64
}

func (a *generationAcc) add(c *tps.ClusterStep) {
	if c.Bytes > 0 {
		a.txt.Steps++
		a.bytes += c.Bytes
		a.tokens += c.Tokens
		a.sec += float64(c.StepTimeNs) / 1e9
	}
	if c.GenNsMax <= 0 {
		return
	}
	g := &a.g
	g.Steps++
	g.Requests += c.GenRequests
	g.OutputTokens += c.GenOutputTokens
	g.PromptTokens += c.GenPromptTokens
	a.genSec += float64(c.GenNsMax) / 1e9
	wait := c.CommFractionMean + c.WaitFractionMean + c.BubbleFractionMean + c.DataStallFractionMean + c.CkptFractionMean
	g.GenShare += c.GenFractionMean
	g.WaitingShare += wait
	g.TrainingShare += max(0, 1-c.GenFractionMean-wait)
	if c.MFUTraining > 0 && c.MFUUnknown == "" {
		a.mfu += c.MFUTraining
		a.mfuN++
	}
}

// result sets the report's text rate and generation, merging the rollout
// events' latency sketches of the steps not skipped.
func (a *generationAcc) result(rep *Report, sp *spine, events []tps.Event) {
	txt := a.txt
	if txt.Steps > 0 && a.sec > 0 && a.bytes > 0 {
		txt.BytesPerSecond, txt.TokensPerByte = float64(a.bytes)/a.sec, float64(a.tokens)/float64(a.bytes)
		rep.Text = &txt
	}
	g := a.g
	if g.Steps == 0 {
		return
	}
	n := float64(g.Steps)
	g.GenShare, g.WaitingShare, g.TrainingShare = g.GenShare/n, g.WaitingShare/n, g.TrainingShare/n
	if a.genSec > 0 {
		g.OutputTPS = float64(g.OutputTokens) / a.genSec
		g.TotalTPS = float64(g.OutputTokens+g.PromptTokens) / a.genSec
	}
	if a.mfuN > 0 {
		m := a.mfu / float64(a.mfuN)
		g.MFUTraining = &m
	}
	var ttft, itl tps.Sketch
	for _, e := range events {
		if e.Kind != tps.EventRollout {
			continue
		}
		if i, ok := sp.stepAt([2]int64{e.Attempt, e.Step}); !ok || sp.skip(i) {
			continue
		}
		if d, err := tps.ParseRollout(e.Detail); err == nil {
			ttft.Merge(&d.TTFT)
			itl.Merge(&d.ITL)
		}
	}
	g.TTFT, g.ITL = latencyOf(&ttft), latencyOf(&itl)
	rep.Generation = &g
}

// waitAcc sums each steady, complete step's waiting (wait fraction × step
// time) by its critical rank; result charges it to the ranks' nodes.
type waitAcc struct {
	total float64
	by    map[int64]*rankWait
}

type rankWait struct {
	steps int
	waitS float64
}

func (a *waitAcc) add(c *tps.ClusterStep) {
	if !c.Complete() || c.SlowestRank < 0 || c.WaitFractionMean <= 0 {
		return
	}
	w := c.WaitFractionMean * float64(c.StepTimeNs) / 1e9
	a.total += w
	x := a.by[c.SlowestRank]
	if x == nil {
		if len(a.by) >= 1<<16 {
			return
		}
		if a.by == nil {
			a.by = map[int64]*rankWait{}
		}
		x = &rankWait{}
		a.by[c.SlowestRank] = x
	}
	x.steps++
	x.waitS += w
}

// result is the waiting by node, most first, at most top nodes.
func (a *waitAcc) result(nodeOf map[int64]string, top int) []WaitShare {
	ranks := make([]int64, 0, len(a.by))
	for r := range a.by {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	by := map[string]*WaitShare{}
	for _, r := range ranks {
		n := nodeLabel(nodeOf[r], r)
		x := by[n]
		if x == nil {
			if len(by) >= 4096 {
				continue
			}
			x = &WaitShare{Node: n}
			by[n] = x
		}
		x.Steps += a.by[r].steps
		x.WaitS += a.by[r].waitS
		if len(x.Ranks) < 64 {
			x.Ranks = append(x.Ranks, r)
		}
	}
	out := make([]WaitShare, 0, len(by))
	for _, x := range by {
		x.Share = x.WaitS / a.total
		out = append(out, *x)
	}
	slices.SortFunc(out, func(a, b WaitShare) int {
		return cmp.Or(cmp.Compare(b.WaitS, a.WaitS), cmp.Compare(a.Node, b.Node))
	})
	return out[:min(len(out), top)]
}
