package report

import (
	"fmt"
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
	BadIdle       = "idle"       // other gaps between steps, and the tail of an attempt
)

// ComputeGoodput analyses steps (sorted by attempt, step) with the warm-up
// mask and the run's events.
func ComputeGoodput(steps []tps.ClusterStep, warm []bool, events []tps.Event) Goodput {
	g := Goodput{BadputS: map[string]float64{}}
	if len(steps) == 0 {
		return g
	}
	// Steps of an attempt at or beyond where the next attempt resumed were redone.
	firstOf := map[int64]int64{} // attempt → first step
	var attempts []int64
	for _, c := range steps {
		if _, ok := firstOf[c.Attempt]; !ok {
			firstOf[c.Attempt] = c.Step
			attempts = append(attempts, c.Attempt)
		}
	}
	resumeAfter := map[int64]int64{} // attempt → step the next attempt resumed from
	for i := 0; i+1 < len(attempts); i++ {
		resumeAfter[attempts[i]] = firstOf[attempts[i+1]]
	}
	g.Restarts = len(attempts) - 1

	starts := map[int64]int64{}
	ends := map[int64]int64{}
	var evals, ckpts [][2]int64
	for _, e := range events {
		switch e.Kind {
		case tps.EventAttemptStart, tps.EventJobStart:
			if s, ok := starts[e.Attempt]; !ok || e.StartUnixNs < s {
				starts[e.Attempt] = e.StartUnixNs
			}
		case tps.EventAttemptEnd, tps.EventJobEnd:
			end := max(e.EndUnixNs, e.StartUnixNs)
			ends[e.Attempt] = max(ends[e.Attempt], end)
		case tps.EventEval:
			evals = append(evals, [2]int64{e.StartUnixNs, e.EndUnixNs})
		case tps.EventCheckpointSave:
			ckpts = append(ckpts, [2]int64{e.StartUnixNs, e.EndUnixNs})
		}
	}
	launch := map[int64]bool{}
	for _, a := range attempts[1:] {
		if _, ok := starts[a]; ok {
			g.Launches++
			launch[a] = true
		}
	}
	sec := func(ns int64) float64 { return float64(ns) / 1e9 }
	begin, finish := steps[0].StartUnixNs, steps[0].EndUnixNs
	for _, c := range steps {
		begin, finish = min(begin, c.StartUnixNs), max(finish, c.EndUnixNs)
	}
	for _, s := range starts {
		begin = min(begin, s)
	}
	for _, e := range ends {
		finish = max(finish, e)
	}
	g.ElapsedS = sec(finish - begin)

	// The elapsed time is cut at one cursor that only moves forward: each
	// stretch of time goes to exactly one part, so the parts add up to the
	// elapsed time whatever the rows say (a step that overlaps the previous
	// one counts from its end, as its step time does).
	cursor := begin
	account := func(cause string, to int64) {
		if to > cursor {
			g.BadputS[cause] += sec(to - cursor)
			cursor = to
		}
	}
	for i, c := range steps {
		first := i == 0 || steps[i-1].Attempt != c.Attempt
		if first {
			s, ok := starts[c.Attempt]
			if i > 0 { // restart: the previous attempt's last step to this attempt's start
				to := c.StartUnixNs
				if ok && s < to {
					to = s
				}
				if launch[c.Attempt] && to > cursor {
					// another launch: its own start-up counts, the wait before it is not the job's
					g.BetweenLaunchesS += sec(to - cursor)
					g.excluded = append(g.excluded, [2]int64{cursor, to})
					cursor = to
				}
				account(BadRestart, to)
			}
			account(BadStartup, c.StartUnixNs)
		} else if miss := c.Step - steps[i-1].Step - 1; miss > 0 && c.StartUnixNs > cursor {
			// Steps missing from the traces: trained, not monitored.
			g.UnmonitoredS += sec(c.StartUnixNs - cursor)
			g.UnmonitoredSteps += miss
			g.excluded = append(g.excluded, [2]int64{cursor, c.StartUnixNs})
			cursor = c.StartUnixNs
		} else if gap := c.StartUnixNs - cursor; gap > 0 {
			// Between steps: evaluation, checkpoints, and the rest idle.
			ev := overlap(evals, cursor, c.StartUnixNs)
			ck := min(overlap(ckpts, cursor, c.StartUnixNs), gap-ev)
			g.BadputS[BadEval] += sec(ev)
			g.BadputS[BadCheckpoint] += sec(ck)
			g.BadputS[BadIdle] += sec(gap - ev - ck)
			cursor = c.StartUnixNs
		}
		// The step's part of the timeline: from where the previous one
		// ended (or its own start, after a gap) to its end.
		var d float64
		if c.EndUnixNs > cursor {
			d = sec(c.EndUnixNs - cursor)
			cursor = c.EndUnixNs
		}
		if ra, ok := resumeAfter[c.Attempt]; ok && c.Step >= ra {
			g.BadputS[BadRedone] += d
			g.RedoneSteps++
		} else if warm[i] {
			g.BadputS[BadWarmup] += d
		} else {
			stall := d * min(max(c.DataStallFractionMean, 0), 1)
			ck := min(d*max(c.CkptFractionMean, 0), d-stall)
			g.BadputS[BadDataStall] += stall
			g.BadputS[BadCheckpoint] += ck
			g.ProductiveS += d - stall - ck
		}
		last := i+1 == len(steps) || steps[i+1].Attempt != c.Attempt
		if e, ok := ends[c.Attempt]; last && ok {
			account(BadIdle, e) // the attempt's tail
		}
	}
	account(BadIdle, finish)
	g.ElapsedS -= g.BetweenLaunchesS
	if d := g.ElapsedS - g.UnmonitoredS; d > 0 {
		g.Goodput = g.ProductiveS / d
	}
	for k, v := range g.BadputS {
		if v <= 0 {
			delete(g.BadputS, k)
		}
	}
	return g
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
