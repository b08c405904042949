package report

import (
	"cmp"
	"fmt"
	"math"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// analysis is one report being made: the job folder opened once, and
// what each stage leaves the next. Its stages, in order:
//
//	openJob      the folder, once (trace.Job: its byte meter, its parts' footers)
//	readSteps    the cluster steps: held, or a spine read in chunks
//	readEvents   events, metadata, clock offsets, the warm-up mask
//	passes       the rank source chosen, then at once, on two goroutines:
//	  clusterPass  every stepFigure fed the cluster rows once
//	  rankRows     rank_steps or rank_windows into one rankSink
//	             then rankFigures, the figures of ranks alone
//	finish       the figures written, then what joins them all
//
// The two passes share only what neither writes: the spine (the rank
// pass takes the world size and each step's critical rank from it, read
// with it) and the job's reads. The cluster pass writes the report; the
// rank pass's rows write a rankOut, taken into it after both.
type analysis struct {
	dir, clusterDir string
	opt             Options
	plots           bool
	rep             *Report
	pd              *Plots
	job             *trace.Job

	// readSteps
	steps    []tps.ClusterStep // the rows, when held (nil: streamed)
	sp       *spine
	src      clusterSource
	selected *selectedSteps // nil: no selection
	ranges   []trace.Range  // a selection's row groups (nil: all)

	// readEvents
	events   []tps.Event
	profiled map[[2]int64]bool
	flops    *flopsAcc
	wopt     tps.WindowOptions

	// passes
	rankSrc   string
	rankTotal int64 // rank rows to read (progress)

	// clusterPass
	summary *summaryFigure
	energy  *energyPass // nil: no GPU samples
	gpu     *gpuSeries
	figures []stepFigure
	crit    *critFigure // nil: rank_windows read

	// rankRows
	ranks *rankSink
}

func analyze(dir string, opt Options, plots bool) (*Report, *Plots, error) {
	a, err := openJob(dir, opt, plots)
	if err != nil {
		return nil, nil, err
	}
	defer a.close()
	for _, stage := range []func() error{a.readSteps, a.readEvents, a.passes, a.finish} {
		if err := stage(); err != nil {
			return nil, nil, err
		}
	}
	return a.rep, a.pd, nil
}

// openJob opens the job folder dir: its reads metered (BytesRead), each
// part's footer read once.
func openJob(dir string, opt Options, plots bool) (*analysis, error) {
	if opt.TopStragglers <= 0 {
		opt.TopStragglers = 5
	}
	job, err := trace.OpenJob(dir)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	a := &analysis{dir: dir, clusterDir: job.Table(trace.ClusterSteps), opt: opt, plots: plots, pd: &Plots{}, job: job}
	rep := &Report{Job: filepath.Base(dir), Dir: dir, Events: map[string]int64{}, read: job.Read()}
	for _, t := range []string{trace.ClusterSteps, trace.RankSteps, trace.RankWindows, trace.Events, trace.GPUSamples} {
		rep.BytesInTables += trace.TableBytes(job.Table(t))
	}
	a.rep = rep
	return a, nil
}

func (a *analysis) close() {
	a.rep.BytesRead = a.job.BytesRead()
	a.job.Close()
}

// readSteps reads the steps: held (a selection, or a run of one chunk),
// or a spine of them with their rows read in chunks (see cluster.go).
func (a *analysis) readSteps() error {
	rep, opt, read := a.rep, a.opt, a.rep.read
	var err error
	jumps, back := 0, 0.0
	switch {
	case opt.Select.Active():
		a.selected, err = readSelected(a.clusterDir, opt.Select, opt.Warmup, opt.valuesInMemory, read)
		if a.selected != nil {
			a.steps = a.selected.steps
		}
	case opt.chunk <= 0 && trace.RowCount(a.clusterDir, read) <= int64(clusterChunk):
		// one chunk: read once
		a.steps, err = trace.ReadAll[tps.ClusterStep](a.clusterDir, read)
	default:
		a.sp, jumps, back, err = readSpine(a.clusterDir, []trace.ReadOption{read}, opt.valuesInMemory)
		if a.sp != nil {
			a.src = newStreamedRows(a.clusterDir, a.sp, cmp.Or(opt.chunk, clusterChunk), []trace.ReadOption{read})
		}
	}
	if err = rep.tolerate(err); err != nil {
		return err
	}
	if a.sp == nil {
		if a.selected != nil {
			jumps, back = a.selected.jumps, a.selected.back
		} else {
			tps.SortSteps(a.steps)
			jumps, back = unstepClocks(a.steps)
		}
		a.sp, a.src = spineOf(a.steps), heldRows(a.steps)
	}
	if err := a.noSteps(); err != nil {
		return err
	}
	n := a.sp.len()
	if open := a.openParts(); open > 0 {
		rep.Running = true
		rep.runningWhy = fmt.Sprintf("%d part(s) still being written", open)
	}
	if sel := a.selected; sel != nil {
		if n == 0 {
			return fmt.Errorf("report: the selection (%s) holds none of the job's %d cluster steps", opt.Select, sel.of)
		}
		rep.Selection = opt.Select.String()
		rep.Notes = append(rep.Notes, fmt.Sprintf("a selection: %s (%d of %d cluster steps, read from the row groups that hold them); elapsed time runs from its first step's start to its last step's end", opt.Select, n, sel.of))
		a.ranges = a.sp.ranges(0, n)
	}
	if jumps > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("the job's clock stepped back %d time(s), by up to %s: the steps after each jump are placed after the one before it (their durations are the ranks' own)", jumps, dur(back)))
	}
	return nil
}

func (a *analysis) openParts() int {
	return trace.OpenParts(a.clusterDir) + trace.OpenParts(a.job.Table(trace.RankSteps))
}

// noSteps says why a job without steps has no report.
func (a *analysis) noSteps() error {
	if a.sp.len() > 0 || (a.selected != nil && a.selected.of > 0) {
		return nil
	}
	if a.openParts() > 0 {
		return fmt.Errorf("report: job %s is running and none of its parts is finalised yet: the collector finalises them every part age (default 1 min), when an attempt ends and when the job has been quiet for 10 s; try again shortly", a.rep.Job)
	}
	if jobs, _ := Jobs(a.dir); len(jobs) > 0 {
		return fmt.Errorf("report: %s is a collector's output folder, not a job's: give one of its %d job folders (tpsprof report %s lists them)", a.dir, len(jobs), a.dir)
	}
	if _, err := trace.RowCountChecked(a.clusterDir, a.rep.read); err != nil {
		// parts there, none readable: say which and why, not "no steps"
		return fmt.Errorf("report: no readable cluster steps under %s: %w", a.clusterDir, err)
	}
	return fmt.Errorf("report: no cluster steps under %s", a.clusterDir)
}

// readEvents reads the run metadata, the clock offsets and the events,
// and marks the warm-up, profiled and FLOP-counted steps in the spine.
func (a *analysis) readEvents() error {
	rep, pd := a.rep, a.pd
	rep.Meta = readMeta(a.clusterDir)
	rep.ClockOffsetsNs = readClockOffsets(a.clusterDir)
	if err := trace.Each(a.job.Table(trace.Events), func(rows []tps.Event) error {
		for _, e := range rows {
			if e.Kind == tps.EventRankUser {
				continue // the agent's bookkeeping for the fleet view
			}
			rep.Events[e.Kind]++
			a.events = append(a.events, e)
			if (e.Kind == tps.EventCheckpointSave || e.Kind == tps.EventEval) && len(pd.events) < 10000 {
				pd.events = append(pd.events, e)
			}
		}
		return nil
	}, rep.read); rep.tolerate(err) != nil {
		return err
	}
	launchEnds(a.events, a.sp.attempts())
	if rep.Selection != "" {
		lo, hi := a.sp.span()
		a.events = selectEvents(a.events, lo, hi, a.opt.Select)
		pd.events = selectEvents(pd.events, lo, hi, a.opt.Select)
		clear(rep.Events)
		for _, e := range a.events {
			rep.Events[e.Kind]++
		}
	}
	// What the ranks showed against the declared layout (identical batches
	// on separate replicas: tokens counted more than once), said first.
	seenWarn := map[string]bool{}
	for _, e := range a.events {
		if e.Kind == tps.EventTopologyWarning && len(seenWarn) < 3 && !seenWarn[e.Detail] {
			seenWarn[e.Detail] = true
			rep.Notes = append(rep.Notes, fmt.Sprintf("layout contradicted (node %s, attempt %d): %s", e.Node, e.Attempt, e.Detail))
		}
	}
	conflicts := 0
	for _, e := range a.events {
		if e.Kind == tps.EventRankConflict {
			if conflicts++; conflicts <= 3 {
				rep.Notes = append(rep.Notes, "rank claimed twice: "+e.Detail)
			}
		}
	}
	if conflicts > 3 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("rank claimed twice: %d more ranks so (rank_conflict events)", conflicts-3))
	}
	if !rep.Running && rep.Selection == "" {
		if why := openAttempt(a.events, a.clusterDir, time.Now()); why != "" {
			rep.Running, rep.runningWhy = true, why
		}
	}
	if rep.Running {
		lo, hi := a.sp.key(0), a.sp.key(a.sp.len()-1)
		rep.Notes = append(rep.Notes, fmt.Sprintf("running: this report covers steps %d-%d, written so far (%s); newer steps are not in it", lo[1], hi[1], rep.runningWhy))
	}
	// (the steps' times are the collector's, repaired: the events' too
	// before the steps are marked by them)
	alignEvents(a.events, rep.ClockOffsetsNs, nil)
	alignEvents(pd.events, rep.ClockOffsetsNs, nil)
	return a.markSteps()
}

// markSteps marks the warm-up in the spine, and the steps out of the
// statistics as the events name them.
func (a *analysis) markSteps() error {
	// Steps a rank profiled (the agent analysed its trace) ran slower
	// under the profiler: out of the statistics, in wall TPS and goodput.
	a.profiled = map[[2]int64]bool{}
	for _, e := range a.events {
		if e.Kind == tps.EventTraceAnalysis && len(a.profiled) < 1<<20 {
			a.profiled[[2]int64{e.Attempt, e.Step}] = true
		}
	}
	// Steps PyTorch counted the FLOPs of ran under its counter: likewise.
	a.flops = newFlopsAcc(a.events)
	a.flops.sampled(a.profiled)
	var selWarm map[[2]int64]bool
	var threshold float64
	if a.selected != nil {
		// The warm-up is the whole run's: a window that starts mid-attempt
		// has none of its own.
		selWarm, threshold = a.selected.warm, a.selected.threshold
	}
	threshold, err := a.sp.markWarm(a.opt.Warmup, threshold, selWarm, a.profiled)
	if err != nil {
		return err
	}
	// Steps a save or an evaluation between steps ran into: their time is
	// partly the gap's (goodput), their parts not the step's own.
	cut, err := a.sp.markCut(cutsOf(a.events))
	if err = a.rep.tolerate(err); err != nil {
		return err
	}
	a.wopt = tps.WindowOptions{Warmup: a.opt.Warmup, Profiled: a.profiled, Cut: cut, Threshold: threshold}
	return nil
}

// passes chooses the rank source, then runs the cluster pass and the rank
// pass's rows at once (on a 10 M-row report each is about half the
// time: BENCHMARKS.md), then the figures of ranks alone. Where the
// spine's world size or critical ranks differ from the rows the cluster
// pass read (parts rewritten between the reads), the rank rows are read
// again with the rows' figures: the report is the same either way.
func (a *analysis) passes() error {
	if err := a.rankSource(); err != nil {
		return err
	}
	if spineRead != nil {
		spineRead(a.sp)
	}
	k, out := a.newRankSink(a.sp.world), &rankOut{}
	a.ranks = k
	rows := make(chan error, 1)
	go func() { rows <- a.rankRows(k, out) }()
	err := a.clusterPass()
	if rerr := <-rows; err == nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	world := a.summary.sum.WorldSize()
	if fixed := a.crit.differs(); world != k.world || fixed != nil {
		if fixed != nil {
			a.sp.slowest = fixed
		}
		a.sp.world = world
		rankRowsAgain.Add(1)
		k, out = a.newRankSink(world), &rankOut{}
		a.ranks = k
		if err := a.rankRows(k, out); err != nil {
			return err
		}
	}
	out.into(a.rep)
	return a.rankFigures()
}

// spineRead, when set (tests), is given the spine before the passes run;
// rankRowsAgain counts the rank rows read again.
var (
	spineRead     func(*spine)
	rankRowsAgain atomic.Int64
)

// rankSource chooses the table the per-rank figures come from.
func (a *analysis) rankSource() error {
	rep := a.rep
	if a.selected == nil {
		// only parts that pass the footer check count towards the choice
		// of rank source, and each left out is named (a part claiming 1e9
		// rows switched the report to rank_windows unsaid)
		var err error
		a.rankTotal, err = trace.RowCountChecked(a.job.Table(trace.RankSteps), rep.read)
		if err = rep.tolerate(err); err != nil {
			return err
		}
	} else {
		// the selection's rank rows as the cluster rows count them: the
		// parts' footers are read once, by the pass
		for _, c := range a.steps {
			a.rankTotal += max(c.RanksReported, 0)
		}
	}
	var err error
	if a.rankSrc, err = rankSource(a.dir, a.opt.RankSource, a.rankTotal); err != nil {
		return err
	}
	if a.rankSrc != trace.RankSteps {
		a.sp.slowest = nil // (rank_windows has no critical rank's rows)
	}
	return nil
}

// newRankSink is an empty rankSink for world ranks, its critical rank's
// excess the cluster pass's (its mean rank's sums) when rank_steps is read.
func (a *analysis) newRankSink(world int64) *rankSink {
	k := &rankSink{world: world, nodes: map[int64]string{}}
	if a.rankSrc == trace.RankSteps {
		if a.crit != nil {
			k.crit = a.crit.x
			k.crit.resetOwn() // (read again)
		} else {
			k.crit = newCritExcess()
		}
	}
	k.heat = newHeatGrid(a.sp.len(), int(world))
	minWin := 0 // episode windows hold whole rank windows when those are read
	if a.rankSrc == trace.RankWindows {
		minWin = tps.RankWindowSteps
	}
	k.wins = newWindows(a.sp, world, minWin)
	return k
}

// clusterPass feeds every figure of the cluster rows (stepFigures) the
// steps once.
func (a *analysis) clusterPass() error {
	rep, sp := a.rep, a.sp
	lo, hi := sp.span()
	a.gpu = newGPUSeries(lo, hi)
	a.gpu.offsets = rep.ClockOffsetsNs
	if len(partsOf(a.job.Table(trace.GPUSamples))) > 0 {
		limit := [2]int64{math.MinInt64, math.MaxInt64}
		if a.selected != nil {
			// samples within a minute of the selection's steps (the plots and
			// the episodes' causes join samples near their steps)
			margin := int64(60e9) + largestOffset(rep.ClockOffsetsNs)
			limit = [2]int64{lo - margin, hi + margin}
		}
		a.energy = newEnergyPass(a.dir, []trace.ReadOption{rep.read}, limit, rep.ClockOffsetsNs, a.gpu, cmp.Or(a.opt.energyChunk, clusterChunk))
	}
	// the steady steps' times and rates: in files past a limit (values)
	a.summary = &summaryFigure{sum: tps.NewSummarizerOf(a.wopt, sp.anyComplete(), newValues(a.opt.valuesInMemory), newValues(a.opt.valuesInMemory))}
	a.figures = a.stepFigures()
	if err := a.src.each(0, sp.len(), func(off int, rows []tps.ClusterStep) error {
		return feed(sp, a.figures, off, rows)
	}); err != nil {
		return err
	}
	for _, f := range a.figures {
		if c, ok := f.(chunkedFigure); ok {
			if err := c.passDone(a); err != nil {
				return err
			}
		}
	}
	rep.TablesRead = append(rep.TablesRead, trace.ClusterSteps, trace.Events)
	return nil
}

// rankRows reads rank_steps or rank_windows into k: per-rank compute
// medians, nodes, the heatmap, the episode windows, the critical rank's
// own figures, padding; and into out the capture's cost and memory, the
// rows and what was skipped. It runs beside clusterPass: it reads the
// spine and writes k and out alone.
func (a *analysis) rankRows(k *rankSink, out *rankOut) error {
	if a.rankSrc == trace.RankWindows {
		return a.windowPass(k, out)
	}
	return a.stepPass(k, out)
}

// rankFigures are the figures of ranks alone (stragglers, nodes,
// episodes, the capture's cost, memory, padding), from the rank rows.
func (a *analysis) rankFigures() error {
	rep, k := a.rep, a.ranks
	rep.TablesRead = append(rep.TablesRead, a.rankSrc)
	if a.rankSrc == trace.RankWindows {
		rep.Notes = append(rep.Notes, fmt.Sprintf("per-rank figures from rank_windows (%d rows, one per rank and %d steps; %d holding warm-up steps left out): medians within 1%%, episodes to a window's edge; the critical rank's excess is not computed", rep.RankWindows, tps.RankWindowSteps, rep.RankWindowsLeft))
	}
	top := a.opt.TopStragglers
	scores := tps.ScoreMedians(k.med, k.nodes)
	rep.Nodes = tps.NodeScores(scores)
	rep.NodeCount = len(rep.Nodes)
	if rep.NodeCount <= 1 {
		rep.Nodes = nil // one node is not a straggler among nodes: its ranks are
	}
	rep.Stragglers = scores[:min(len(scores), top)]
	rep.Nodes = rep.Nodes[:min(len(rep.Nodes), top)]
	a.pd.heat, a.pd.nodeOf = k.heat, k.nodes
	var err error
	if rep.Episodes, err = k.wins.episodes(a.sp, k.nodes, a.src); err != nil {
		return err
	}
	if rep.Episodes == nil {
		rep.Episodes = []StragglerEpisode{}
	}
	rep.EpisodeWindow = k.wins.size
	rep.CaptureCost, rep.Memory = rep.own.result(k.nodes, top)
	if k.padTok > 0 && k.realTok <= k.padTok {
		rep.Padding = &Padding{RealTokens: k.realTok, PaddedTokens: k.padTok, RealFraction: float64(k.realTok) / float64(k.padTok)}
	}
	return nil
}

// finish writes every step figure, then what joins them: the traces, the
// GPU series, the episodes' causes and captures, cost and time to train.
func (a *analysis) finish() error {
	if err := a.realign(); err != nil {
		return err
	}
	for _, f := range a.figures {
		if err := f.write(a); err != nil {
			return err
		}
	}
	rep := a.rep
	var err error
	if rep.Traces, err = summarizeTraces(a.dir, a.events, rep.read); err != nil {
		return err
	}
	if rep.GPUSamples > 0 {
		a.pd.gpu = a.gpu
	}
	rep.episodeCauses(a.gpu)
	rep.episodeCaptures(a.events)
	a.cost()
	var g *gpmAcc
	if a.energy != nil {
		g = &a.energy.gpm
	}
	rep.ledger(g)
	rep.findings()
	rep.checkpointAdvice(a.events)
	return nil
}

// realign places the events that named no node by the nodes the rank
// pass found; when that moves any (events sent past an agent, on a node
// whose clock is off), the figures of the events' times are fed the
// steps again.
func (a *analysis) realign() error {
	nodes := a.ranks.nodes
	alignEvents(a.pd.events, a.rep.ClockOffsetsNs, nodes)
	if alignEvents(a.events, a.rep.ClockOffsetsNs, nodes) == 0 {
		return nil
	}
	var again []stepFigure
	for i, f := range a.figures {
		if e, ok := f.(eventFigure); ok {
			a.figures[i] = e.again(a)
			again = append(again, a.figures[i])
		}
	}
	return a.src.each(0, a.sp.len(), func(off int, rows []tps.ClusterStep) error {
		return feed(a.sp, again, off, rows)
	})
}

// cost sets the cost per million tokens and the time to train.
func (a *analysis) cost() {
	rep, s := a.rep, a.rep.Summary
	price := a.opt.GPUHourUSD
	if price <= 0 && rep.Meta != nil {
		price = rep.Meta.GPUHourUSD
	}
	if price > 0 && s.WallTPS > 0 && s.WorldSize > 0 {
		if c, err := tps.CostPerMillionTokens(s.WallTPS, int(s.WorldSize), price); err == nil {
			rep.CostPerMTok = &c
		}
	}
	if a.opt.TrainTokens > 0 && s.WallTPS > 0 {
		if d, err := tps.TimeToTrain(a.opt.TrainTokens, s.WallTPS); err == nil {
			x := d.Seconds()
			rep.TimeToTrainS = &x
		}
	}
}
