package report

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// Goodput splits the job's elapsed time, across attempts, into productive
// step time, badput by cause and unmonitored time. The parts add up to
// ElapsedS (the time between launches is not in it): each moment
// goes to one part (a step's part runs from the previous step's end, as
// its step time does; see docs/report.md).
type Goodput struct {
	ElapsedS    float64            `json:"elapsed_s"`
	ProductiveS float64            `json:"productive_s"`
	Goodput     float64            `json:"goodput"` // productive / elapsed
	BadputS     map[string]float64 `json:"badput_s"`
	RedoneSteps int                `json:"redone_steps"`
	Restarts    int                `json:"restarts"`
	// Launches counts the restarts that were new launches (their attempt
	// has a launcher's attempt_start event); the others restarted inside a
	// launch (torchrun elastic restarts).
	Launches int `json:"launches"`
	// FailedLaunches counts launches that ended before their first step
	// (badput launch_failed; the wait before the next launch is between
	// launches).
	FailedLaunches int `json:"failed_launches,omitempty"`
	// BetweenLaunchesS is the time from one launch's last step (or end) to
	// the next launch's start: not the job's time (a job id reused hours
	// later), so not in ElapsedS, wall TPS or cost.
	BetweenLaunchesS float64 `json:"between_launches_s,omitempty"`
	// UnmonitoredS is the time of steps no rank's record reached the
	// traces for (step numbers jump inside an attempt: an agent or the
	// collector was down): in ElapsedS but neither productive nor badput,
	// and out of goodput's denominator. UnmonitoredSteps counts them.
	UnmonitoredS     float64 `json:"unmonitored_s,omitempty"`
	UnmonitoredSteps int64   `json:"unmonitored_steps,omitempty"`

	excluded [][2]int64 // between launches and unmonitored, for wall TPS
	// steadyGapS is the badput between steps before steady steps, by
	// cause: the findings' "checkpoints between steps" and the like, over
	// the steady steps' wall span (a checkpoint's part inside steps is
	// the checkpoint part's, and the warm-up's saves lie before the span:
	// counted in, they read 79.7% of it for the job's own 71.3%)
	steadyGapS map[string]float64
}

// Badput causes.
const (
	BadStartup    = "startup"    // attempt start to its first step
	BadWarmup     = "warmup"     // warm-up steps
	BadCheckpoint = "checkpoint" // blocking checkpoint time in steps and checkpoint events between steps
	BadDataStall  = "data_stall" // data-loader waits inside steady steps
	BadRestart    = "restart"    // from an attempt's last step to the next attempt's start
	BadRedone     = "redone"     // steps repeated after a restart (progress lost)
	BadEval       = "eval"       // evaluation between steps
	BadIdle       = "idle"       // other gaps between steps
	// BadProfiling is the profiler's stop after a traced step (trace_stop
	// events between steps).
	BadProfiling = "profiling"
	// BadShutdown is an attempt's tail: from its last step's end until its
	// launcher exited (torchrun's shutdown, or a hang after training).
	BadShutdown = "shutdown"
	// BadLaunchFailed is a launch that ended before its first step: from
	// its start to its end.
	BadLaunchFailed = "launch_failed"
)

// goodputAcc is the goodput of steps fed in order (the report feeds it in its
// pass; computeGoodput, in the tests, all at once).
type goodputAcc struct {
	g           Goodput
	resumeAfter map[int64]int64 // attempt → step the next attempt resumed from
	starts      map[int64]int64
	ends        map[int64]int64
	evals       [][2]int64
	ckpts       [][2]int64
	traces      [][2]int64
	// the checkpoints and evaluations, and those and the profiler's stops
	// (what a gap between steps is measured against, each once)
	ckptEvals, gaps [][2]int64
	// the causes a step adds to (stepCauses) and of them the gaps before
	// steady steps, summed apart from BadputS and steadyGapS until result
	// (a map write for each of a step's causes was a third of this
	// figure's time in a 156,250-step report)
	stepBad    [len(stepCauses)]float64
	steadyGap  [len(stepCauses)]float64
	cuts       cuts // the saves and evaluations, sorted (spine.markCut's rule)
	launch     map[int64]bool
	failed     [][2]int64 // launches without a step: start, end (start when none recorded), in time order
	nextFailed int
	finish     int64
	// the elapsed time is cut at one cursor that only moves forward: each
	// stretch of time goes to exactly one part, so the parts add up to the
	// elapsed time whatever the rows say (a step that overlaps the previous
	// one counts from its end, as its step time does)
	cursor    int64
	n         int
	prev      [2]int64 // the previous step's attempt and step
	prevStart int64    // and its start
}

// stepCauses are the badput causes a step adds to; the attempts' (startup,
// restart, shutdown, failed launches) are added to BadputS at once.
var stepCauses = [...]string{BadEval, BadCheckpoint, BadProfiling, BadIdle, BadRedone, BadWarmup, BadDataStall}

const (
	sbEval = iota
	sbCheckpoint
	sbProfiling
	sbIdle
	sbRedone
	sbWarmup
	sbDataStall
)

// newGoodputAcc prepares the analysis of the spine's steps (attempts,
// where each resumed, the run's span) and the events.
func newGoodputAcc(sp *spine, events []tps.Event) *goodputAcc {
	a := &goodputAcc{g: Goodput{BadputS: map[string]float64{}, steadyGapS: map[string]float64{}}, resumeAfter: map[int64]int64{},
		starts: map[int64]int64{}, ends: map[int64]int64{}, launch: map[int64]bool{}}
	if sp.len() == 0 {
		return a
	}
	// Steps of an attempt at or beyond where the next attempt resumed were redone.
	var attempts, firsts []int64
	for r, k := range sp.runs {
		if r == 0 || k.attempt != sp.runs[r-1].attempt {
			attempts, firsts = append(attempts, int64(k.attempt)), append(firsts, k.step)
		}
	}
	for i := 0; i+1 < len(attempts); i++ {
		a.resumeAfter[attempts[i]] = firsts[i+1]
	}
	a.g.Restarts = len(attempts) - 1
	for _, e := range events {
		switch e.Kind {
		case tps.EventAttemptStart, tps.EventJobStart:
			if s, ok := a.starts[e.Attempt]; !ok || e.StartUnixNs < s {
				a.starts[e.Attempt] = e.StartUnixNs
			}
		case tps.EventAttemptEnd, tps.EventJobEnd:
			end := max(e.EndUnixNs, e.StartUnixNs)
			a.ends[e.Attempt] = max(a.ends[e.Attempt], end)
		case tps.EventEval:
			a.evals = append(a.evals, [2]int64{e.StartUnixNs, e.EndUnixNs})
		case tps.EventCheckpointSave, tps.EventCheckpointRestore:
			// (a restore between steps is a named gap of the attempts'
			// time too: attemptsAcc)
			a.ckpts = append(a.ckpts, [2]int64{e.StartUnixNs, e.EndUnixNs})
		case tps.EventTraceStop:
			a.traces = append(a.traces, [2]int64{e.StartUnixNs, e.EndUnixNs})
		}
	}
	a.ckptEvals, a.gaps = slices.Concat(a.ckpts, a.evals), slices.Concat(a.ckpts, a.evals, a.traces)
	for _, at := range attempts[1:] {
		if _, ok := a.starts[at]; ok {
			a.g.Launches++
			a.launch[at] = true
		}
	}
	for at, s := range a.starts {
		if !slices.Contains(attempts, at) {
			a.failed = append(a.failed, [2]int64{s, max(s, a.ends[at])})
		}
	}
	slices.SortFunc(a.failed, func(x, y [2]int64) int { return cmp.Compare(x[0], y[0]) })
	a.cuts = cutsOf(events)
	a.g.FailedLaunches = len(a.failed)
	begin, finish := sp.span()
	for _, s := range a.starts {
		begin = min(begin, s)
	}
	for _, e := range a.ends {
		finish = max(finish, e)
	}
	a.g.ElapsedS = sec(finish - begin)
	a.cursor, a.finish = begin, finish
	return a
}

func sec(ns int64) float64 { return float64(ns) / 1e9 }

func (a *goodputAcc) account(cause string, to int64) {
	if to > a.cursor {
		a.g.BadputS[cause] += sec(to - a.cursor)
		a.cursor = to
	}
}

// between moves the cursor to a launch's start: the wait before it is
// not the job's time.
func (a *goodputAcc) between(to int64) {
	if to > a.cursor {
		a.g.BetweenLaunchesS += sec(to - a.cursor)
		a.g.excluded = append(a.g.excluded, [2]int64{a.cursor, to})
		a.cursor = to
	}
}

// failedBefore takes the launches that failed before any step and
// started before t: the wait before each is between launches, the
// launch itself launch_failed.
func (a *goodputAcc) failedBefore(t int64) {
	for a.nextFailed < len(a.failed) && a.failed[a.nextFailed][0] < t {
		f := a.failed[a.nextFailed]
		a.nextFailed++
		a.between(f[0])
		a.account(BadLaunchFailed, min(f[1], t))
	}
}

// add takes the next step, whether it is warm-up and whether it is the
// last of its attempt.
func (a *goodputAcc) add(c *tps.ClusterStep, warm, lastOfAttempt bool) {
	g := &a.g
	first := a.n == 0 || a.prev[0] != c.Attempt
	if first {
		s, ok := a.starts[c.Attempt]
		to := c.StartUnixNs
		if ok && s < to {
			to = s
		}
		a.failedBefore(to)
		if a.n > 0 || a.nextFailed > 0 { // a restart, or a launch after failed ones
			if ok && (a.launch[c.Attempt] || a.n == 0) {
				// another launch: its own start-up counts, the wait before it is not the job's
				a.between(to)
			}
			a.account(BadRestart, to) // the previous attempt's last step to this attempt's start
		}
		a.account(BadStartup, c.StartUnixNs)
	} else if miss := c.Step - a.prev[1] - 1; miss > 0 && c.StartUnixNs > a.cursor {
		// Steps missing from the traces: trained, not monitored.
		g.UnmonitoredS += sec(c.StartUnixNs - a.cursor)
		g.UnmonitoredSteps += miss
		g.excluded = append(g.excluded, [2]int64{a.cursor, c.StartUnixNs})
		a.cursor = c.StartUnixNs
	} else {
		// Between steps: checkpoints, evaluation, the profiler's stop, and
		// the rest idle. Where they overlap (ranks' spans differ: the ranks
		// that do not save wait at a barrier for the one that does, their
		// evaluation's span running on), a checkpoint wins, then
		// evaluation: each instant is one cause's. A save or evaluation
		// that runs into the step (the step's start is the first rank's,
		// and the others wait for the one still saving) is the gap's to
		// its end: the step is out of the statistics (spine.markCut).
		to := c.StartUnixNs
		if e := a.cuts.into(a.prevStart, c.StartUnixNs); e > to {
			to = min(e, c.EndUnixNs)
		}
		if gap := to - a.cursor; gap > 0 {
			var ck, ev, pr int64
			if len(a.gaps) > 0 {
				ck = overlap(a.ckpts, a.cursor, to)
				ev = overlap(a.ckptEvals, a.cursor, to) - ck
				pr = overlap(a.gaps, a.cursor, to) - ck - ev
			}
			a.stepBad[sbEval] += sec(ev)
			a.stepBad[sbCheckpoint] += sec(ck)
			a.stepBad[sbProfiling] += sec(pr)
			if !warm {
				a.steadyGap[sbEval] += sec(ev)
				a.steadyGap[sbCheckpoint] += sec(ck)
				a.steadyGap[sbProfiling] += sec(pr)
			}
			a.stepBad[sbIdle] += sec(gap - ev - ck - pr)
			a.cursor = to
		}
	}
	a.n++
	a.prev, a.prevStart = [2]int64{c.Attempt, c.Step}, c.StartUnixNs
	// The step's part of the timeline: from where the previous one
	// ended (or its own start, after a gap) to its end.
	var d float64
	if c.EndUnixNs > a.cursor {
		d = sec(c.EndUnixNs - a.cursor)
		a.cursor = c.EndUnixNs
	}
	if ra, ok := a.resumeAfter[c.Attempt]; ok && c.Step >= ra {
		a.stepBad[sbRedone] += d
		g.RedoneSteps++
	} else if warm {
		a.stepBad[sbWarmup] += d
	} else {
		stall := d * min(max(c.DataStallFractionMean, 0), 1)
		ck := min(d*max(c.CkptFractionMean, 0), d-stall)
		a.stepBad[sbDataStall] += stall
		a.stepBad[sbCheckpoint] += ck
		g.ProductiveS += d - stall - ck
	}
	if lastOfAttempt {
		if e, ok := a.ends[c.Attempt]; ok {
			a.account(BadShutdown, e) // the attempt's tail, until its launcher exited
		}
	}
}

func (a *goodputAcc) result() Goodput {
	g := &a.g
	if a.n == 0 {
		return Goodput{BadputS: map[string]float64{}}
	}
	a.failedBefore(a.finish + 1) // launches that failed after the last attempt
	a.account(BadShutdown, a.finish)
	for i, k := range stepCauses {
		// (the attempts' causes are others: each sum is as if added here)
		if a.stepBad[i] != 0 {
			g.BadputS[k] += a.stepBad[i]
		}
		if a.steadyGap[i] != 0 {
			g.steadyGapS[k] += a.steadyGap[i]
		}
	}
	g.ElapsedS -= g.BetweenLaunchesS
	if d := g.ElapsedS - g.UnmonitoredS; d > 0 {
		g.Goodput = g.ProductiveS / d
	}
	for k, v := range g.BadputS {
		if v <= 0 {
			delete(g.BadputS, k)
		}
	}
	return *g
}

// ExcludedWithin is how much of [a, b) lay between launches or in
// unmonitored gaps, ns: wall time that was not the job's or not seen.
func (g *Goodput) ExcludedWithin(a, b int64) int64 { return overlap(g.excluded, a, b) }

// overlap is how much of [a, b) the intervals cover (they may overlap each other).
func overlap(iv [][2]int64, a, b int64) int64 {
	var segs [][2]int64
	for _, x := range iv {
		s, e := max(x[0], a), min(x[1], b)
		if e > s {
			segs = append(segs, [2]int64{s, e})
		}
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i][0] < segs[j][0] })
	var total, cur int64 = 0, a
	for _, s := range segs {
		if s[1] <= cur {
			continue
		}
		total += s[1] - max(s[0], cur)
		cur = s[1]
	}
	return total
}

// NotCountedText says what time the goodput leaves out ("" when none).
func (g *Goodput) NotCountedText() string {
	var parts []string
	if g.BetweenLaunchesS > 0 {
		parts = append(parts, fmt.Sprintf("%s between launches (not the job's time)", dur(g.BetweenLaunchesS)))
	}
	if g.UnmonitoredS > 0 {
		parts = append(parts, fmt.Sprintf("%s unmonitored (%d steps missing from the traces: an agent or the collector was down)", dur(g.UnmonitoredS), g.UnmonitoredSteps))
	}
	return strings.Join(parts, "; ")
}
