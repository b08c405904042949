package report

import (
	"errors"
	"slices"

	"github.com/tpsprof/tpsprof/tps"
)

// A stepFigure is one figure of the report taken from the cluster rows.
// The cluster pass hands it every step once, in the run's order; once
// both passes are done, write puts its part into the report. A new
// figure is one file (its accumulator, step and write) and one line in
// stepFigures.
type stepFigure interface {
	step(s *stepAt)
	// write sets the figure's part of a.rep; it may read what figures
	// before it in stepFigures wrote (the summary first) and what the rank
	// pass found (a.ranks: nodes, the ranks' own figures).
	write(a *analysis) error
}

// chunkedFigure is a stepFigure that reads more as the rows go by (the
// energy join reads the GPU samples of each chunk of steps): chunkDone
// ends a chunk of the cluster rows, passDone the pass.
type chunkedFigure interface {
	stepFigure
	chunkDone() error
	passDone(a *analysis) error
}

// eventFigure is a stepFigure that depends on the events' times: when the
// rank pass names the nodes of events that named none and their clocks
// move them, again gives a fresh one, fed every step anew.
type eventFigure interface {
	stepFigure
	again(a *analysis) stepFigure
}

// stepAt is a step as figures see it: its row, its place in the spine,
// and what the spine says of it.
type stepAt struct {
	c    *tps.ClusterStep
	i    int
	warm bool // a warm-up step
	skip bool // out of the steady figures (warm-up, profiled, FLOP-counted, incomplete)
	last bool // its attempt's last step
}

// steady is whether the step counts in the steady-state figures.
func (s *stepAt) steady() bool { return !s.skip && s.c.StepTimeNs > 0 }

// stepFigures is every figure of the cluster rows this run has, in the
// order they are written (nil entries: not this run's).
func (a *analysis) stepFigures() []stepFigure {
	all := []stepFigure{
		a.summary,           // the summary: throughput, step time, MFU
		&breakdownFigure{},  // the time breakdown, the fit, the live energy join
		a.plotFigure(),      // what the plots draw of each step
		&waitFigure{},       // the waiting charged to the critical ranks' nodes
		a.critFigure(),      // what the critical rank had more of
		a.flopsFigure(),     // the steps PyTorch counted
		a.goodputFigure(),   // goodput and its badput
		a.attemptsFigure(),  // the attempts table
		&generationFigure{}, // rollouts' generation, the text rate
		a.energyFigure(),    // the GPU samples' energy join
		&lossFigure{},       // the training loss (loss.go)
	}
	figs := all[:0]
	for _, f := range all {
		if f != nil {
			figs = append(figs, f)
		}
	}
	return figs
}

// feed hands the rows of a chunk to figs.
func feed(sp *spine, figs []stepFigure, off int, rows []tps.ClusterStep) error {
	for j := range rows {
		i := off + j
		s := stepAt{c: &rows[j], i: i, warm: sp.warm(i), skip: sp.skip(i), last: sp.lastOfAttempt(i)}
		for _, f := range figs {
			f.step(&s)
		}
	}
	for _, f := range figs {
		if c, ok := f.(chunkedFigure); ok {
			if err := c.chunkDone(); err != nil {
				return err
			}
		}
	}
	return nil
}

// summaryFigure is the run's summary (tps.Summarizer): throughput, step
// time, MFU, the breakdown's shares. The rank pass is sized by its world.
type summaryFigure struct{ sum *tps.Summarizer }

func (f *summaryFigure) step(s *stepAt) { f.sum.Add(s.c, s.warm) }

func (f *summaryFigure) write(a *analysis) (err error) {
	a.rep.Summary, err = f.sum.Result()
	return err
}

type breakdownFigure struct{ breakdownAcc }

func (f *breakdownFigure) step(s *stepAt) {
	if s.steady() {
		f.add(s.c)
	}
}

func (f *breakdownFigure) write(a *analysis) error {
	f.result(a.rep)
	return nil
}

type generationFigure struct{ generationAcc }

func (f *generationFigure) step(s *stepAt) {
	if s.steady() {
		f.add(s.c)
	}
}

func (f *generationFigure) write(a *analysis) error {
	f.result(a.rep, a.sp, a.events)
	return nil
}

type waitFigure struct{ waitAcc }

func (f *waitFigure) step(s *stepAt) {
	if s.steady() {
		f.add(s.c)
	}
}

func (f *waitFigure) write(a *analysis) error {
	a.rep.WaitCharged = f.result(a.ranks.nodes, a.opt.TopStragglers)
	return nil
}

// plotFigure is what the plots draw of each step (AnalyzeWithPlots).
type plotFigure struct{ steps []plotStep }

func (a *analysis) plotFigure() stepFigure {
	if !a.plots {
		return nil
	}
	return &plotFigure{steps: make([]plotStep, 0, a.sp.len())}
}

func (f *plotFigure) step(s *stepAt) { f.steps = append(f.steps, plotStepOf(s.c)) }

func (f *plotFigure) write(a *analysis) error {
	a.pd.steps, a.pd.warm = f.steps, make([]bool, a.sp.len())
	for i := range a.pd.warm {
		a.pd.warm[i] = a.sp.warm(i)
	}
	return nil
}

// critFigure keeps each step's critical rank in the spine and the mean
// rank's compute, data wait and host work by critical rank; the rank pass adds the
// critical rank's own (a.ranks.crit). Only when rank_steps is read.
type critFigure struct {
	sp *spine
	x  *critExcess
	// the rows' critical ranks, where one differs from the spine's, which
	// the rank pass read beside this one (nil: none differs)
	fixed []int32
}

func (a *analysis) critFigure() stepFigure {
	if a.ranks.crit == nil {
		return nil
	}
	a.crit = &critFigure{sp: a.sp, x: a.ranks.crit}
	return a.crit
}

// differs is every step's critical rank when the rows' differ from the
// spine's (nil when none does, or f is nil).
func (f *critFigure) differs() []int32 {
	if f == nil {
		return nil
	}
	return f.fixed
}

func (f *critFigure) step(s *stepAt) {
	c := s.c
	if r := clampInt32(c.SlowestRank); f.fixed != nil {
		f.fixed[s.i] = r
	} else if r != f.sp.slowest[s.i] {
		f.fixed = slices.Clone(f.sp.slowest)
		f.fixed[s.i] = r
	}
	if !s.warm && c.StepTimeNs > 0 && c.SlowestRank >= 0 {
		f.x.addMean(c.SlowestRank, c.ComputeNsMean, c.DataStallFractionMean*float64(c.StepTimeNs), c.HostFractionMean*float64(c.StepTimeNs))
	}
}

func (f *critFigure) write(a *analysis) error {
	f.x.explain(a.rep.WaitCharged, a.ranks.nodes)
	return nil
}

// flopsFigure is the steps PyTorch counted the FLOPs of (flopsAcc).
type flopsFigure struct{ acc *flopsAcc }

func (a *analysis) flopsFigure() stepFigure {
	if a.flops == nil {
		return nil
	}
	return &flopsFigure{acc: a.flops}
}

func (f *flopsFigure) step(s *stepAt) { f.acc.row(s.c) }

func (f *flopsFigure) write(a *analysis) error {
	rep := a.rep
	var cfg tps.AccumulatorConfig
	peak, peakErr := 0.0, errors.New("no run metadata")
	if rep.Meta != nil {
		cfg, _ = rep.Meta.AccumulatorConfig(int(rep.Summary.WorldSize), "")
		peak, peakErr = rep.Meta.Peak("")
	}
	rep.CountedFLOPs = f.acc.result(cfg, peak, peakErr, rep.Summary.AggregateTPS, rep.Summary.WorldSize, rep.Summary.StepTimeS.Mean*1e9)
	return nil
}

// goodputFigure is goodput and the badput by cause (goodputAcc); it is
// written after the summary, whose wall TPS it brings to the job's own,
// monitored time.
type goodputFigure struct{ acc *goodputAcc }

func (a *analysis) goodputFigure() stepFigure {
	return &goodputFigure{acc: newGoodputAcc(a.sp, a.events)}
}

func (f *goodputFigure) step(s *stepAt) { f.acc.add(s.c, s.warm, s.last) }

func (f *goodputFigure) again(a *analysis) stepFigure { return a.goodputFigure() }

func (f *goodputFigure) write(a *analysis) error {
	rep := a.rep
	rep.Goodput = f.acc.result()
	if s := &rep.Summary; s.WallTPS > 0 {
		// Wall TPS over the job's own, monitored time.
		span := s.WallToUnixNs - s.WallFromUnixNs
		if out := rep.Goodput.ExcludedWithin(s.WallFromUnixNs, s.WallToUnixNs); out > 0 && out < span {
			s.WallTPS *= float64(span) / float64(span-out)
		}
	}
	return nil
}

// attemptsFigure is the attempts table (attemptsAcc).
type attemptsFigure struct{ acc *attemptsAcc }

func (a *analysis) attemptsFigure() stepFigure {
	return &attemptsFigure{acc: newAttemptsAcc(a.events)}
}

func (f *attemptsFigure) step(s *stepAt) { f.acc.add(s.c, s.warm) }

func (f *attemptsFigure) again(a *analysis) stepFigure { return a.attemptsFigure() }

func (f *attemptsFigure) write(a *analysis) error {
	a.rep.Attempts = f.acc.result()
	return nil
}

// energyFigure joins the GPU samples to the steady steps (energyPass),
// reading the samples a chunk of steps at a time; it is written after
// the breakdown, whose live join it replaces when the samples give one.
type energyFigure struct{ p *energyPass }

func (a *analysis) energyFigure() stepFigure {
	if a.energy == nil {
		return nil
	}
	return &energyFigure{p: a.energy}
}

func (f *energyFigure) step(s *stepAt) {
	if s.steady() && s.c.EndUnixNs > 0 {
		f.p.addStep(s.c)
	}
}

func (f *energyFigure) chunkDone() error { return f.p.chunkDone() }

func (f *energyFigure) passDone(a *analysis) error {
	if err := a.rep.tolerate(f.p.finish()); err != nil {
		return err
	}
	a.rep.GPUSamples = f.p.n
	return nil
}

func (f *energyFigure) write(a *analysis) error {
	if tpj, n, ok := f.p.acc.result(); ok && a.rep.Energy != nil {
		a.rep.Energy.TokensPerJoule, a.rep.Energy.JoulesPerToken = tpj, perJoule(1, tpj)
		a.rep.Energy.Steps, a.rep.Energy.FromSamples = n, true
	}
	return nil
}
