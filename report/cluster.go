package report

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// The report's cluster pass. A whole-run report does not hold the run's
// cluster rows (416 B a step in memory, and the heap peaks at about twice
// that): it reads a spine of every step (spine.go: its key, completeness
// and warm-up, about 1 B a step) and then the rows themselves in chunks of
// clusterChunk steps, in (attempt, step) order, each fed to the
// accumulators below and dropped (the plots keep a plotStep of each). A
// report of a selection, or of a run of one chunk, holds its rows and
// feeds them as one chunk: the figures are computed by the same code
// either way (TestStreamedReportEqualsInMemory; every Analyze and
// AnalyzeWithPlots of this package's tests checks it, see TestMain).

// clusterChunk is how many steps of cluster rows a streamed report holds
// at once (64 Ki rows: 27 MB); a run of no more steps is read at once.
var clusterChunk = 1 << 16

// ranges bound the rank rows of the spine's steps [lo, hi), for skipping
// row groups by their statistics.
func (sp *spine) ranges(lo, hi int) []trace.Range {
	first, last := sp.key(lo), sp.key(hi-1)
	a := trace.Range{Column: "attempt", Min: first[0], Max: last[0]}
	st := trace.Range{Column: "step", Min: first[1], Max: first[1]}
	for i := lo; i < hi; {
		// a run's steps rise (or stay): its first and last bound it
		r := sp.runAt(i)
		end := min(hi, sp.runEnd(r))
		a0, b := sp.key(i)[1], sp.key(end - 1)[1]
		st.Min, st.Max = min(st.Min, a0, b), max(st.Max, a0, b)
		i = end
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
	// buf is the array each chunk is read into (its rows are the
	// callback's until it returns: each is not reentrant)
	buf []tps.ClusterStep
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
		kc := keyCursor{ks: &sp.keys}
		for end < hi && kc.at(end) == kc.at(end-1) {
			end++ // a step's rows stay in one chunk
		}
		ranges := sp.ranges(lo, end)
		all, err := trace.ReadAllInto(s.buf, s.dir, append(s.opts, trace.Within(ranges...), trace.Parts(s.partsFor(ranges)...))...)
		s.buf = all[:0]
		if err != nil && !trace.IsUnreadable(err) { // unreadable parts: said when the spine was read
			return err
		}
		tps.SortSteps(all)
		// the spine's steps, in order: rows of parts finalised since the
		// spine was read (a running job) are passed over
		rows, j := all[:0], 0
		for i := lo; i < end; i++ {
			k := kc.at(i)
			for j < len(all) && cmpKeys([2]int64{int64(clampInt32(all[j].Attempt)), all[j].Step}, k) < 0 {
				j++
			}
			if j == len(all) || all[j].Attempt != k[0] || all[j].Step != k[1] {
				return fmt.Errorf("report: %s changed while read: the cluster row of attempt %d step %d is gone", s.dir, k[0], k[1])
			}
			c := all[j]
			j++
			d := sp.shiftAt(i)
			c.StartUnixNs, c.EndUnixNs = c.StartUnixNs+d, c.EndUnixNs+d
			rows = append(rows, c)
		}
		if err := fn(lo, rows); err != nil {
			return err
		}
		lo = end
	}
	return nil
}

// breakdownAcc is the time breakdown's per-step means, the fit of TPS on
// exposed communication and the live energy join, over steady steps.
type breakdownAcc struct {
	n, overlap               float64
	fx, fy, fxx, fxy, fyy    float64 // the fit's sums (fitLine)
	fn                       int
	eSteps, eTokens, eJoules float64
	power, clock             float64
	throttled                int
}

func (b *breakdownAcc) add(c *tps.ClusterStep) {
	b.n++
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
		br.CommOverlap = b.overlap / b.n
	}
	// the summary's breakdown, each part's time over the steady steps' time
	br.Shares = s.Breakdown
	if rep.Meta != nil {
		br.BubbleTheoretical = tps.TheoreticalBubble(rep.Meta.Topology.PP, rep.Meta.MicroBatches, rep.Meta.Interleave)
	}
	rep.CommFit = fitSums(float64(b.fn), b.fx, b.fy, b.fxx, b.fxy, b.fyy)
	if b.eSteps > 0 {
		rep.Energy = &Energy{TokensPerJoule: perJoule(b.eTokens, b.eJoules), JoulesPerToken: perJoule(b.eJoules, b.eTokens),
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
	// one node: the waiting is charged to each rank, not to the node (all
	// its ranks were "waiting caused by vm 100%")
	nodes := map[string]bool{}
	for r, n := range nodeOf {
		if len(nodes) > 1 {
			break
		}
		nodes[nodeLabel(n, r)] = true
	}
	oneNode := len(nodes) <= 1
	by := map[string]*WaitShare{}
	for _, r := range ranks {
		n := nodeLabel(nodeOf[r], r)
		key := n
		if oneNode {
			key = fmt.Sprintf("rank %d", r)
		}
		x := by[key]
		if x == nil {
			if len(by) >= 4096 {
				continue
			}
			x = &WaitShare{Node: n, ByRank: oneNode}
			by[key] = x
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
		return cmp.Or(cmp.Compare(b.WaitS, a.WaitS), cmp.Compare(a.Node, b.Node), cmp.Compare(a.Ranks[0], b.Ranks[0]))
	})
	return out[:min(len(out), top)]
}

// perJoule is a over b, 0 where b is not above 0 (no tokens: tokens per
// joule is unknown, and the views say so, never +Inf J/token).
func perJoule(a, b float64) float64 {
	if b <= 0 || a <= 0 {
		return 0
	}
	return a / b
}
