package report

import (
	"fmt"
	"strings"

	"github.com/tpsprof/tpsprof/tps"
)

// AttemptRow is one attempt of the run: a launch, or a restart inside one
// (torchrun elastic). Figures are over its steady, complete steps.
type AttemptRow struct {
	Attempt int64 `json:"attempt"`
	// Launch: started by a launcher (an attempt_start event), not
	// restarted inside a launch.
	Launch    bool     `json:"launch"`
	FirstStep int64    `json:"first_step"`
	LastStep  int64    `json:"last_step"`
	Steps     int      `json:"steps"`
	TPS       float64  `json:"tps"` // Σ tokens / Σ step time
	MFU       *float64 `json:"mfu"` // null: unknown for all its steps
	WallS     float64  `json:"wall_s"`
	// ExitCode is the attempt_end event's (null: no end recorded, as for
	// an attempt still running or killed with its launcher).
	ExitCode *int64 `json:"exit_code"`
	// Stopped is why its launcher says it was stopped, where it was by a
	// signal it forwarded ("preempted": Slurm's SIGTERM for a requeue or
	// a preemption), not a crash of its own.
	Stopped string `json:"stopped,omitempty"`
	// WorldSize is the attempt's ranks (the largest of its steps'); Change
	// names a relaunch with another world size than the attempt before
	// ("scale-down 4→2", "scale-up 2→4"); CapacityLostS is the wall time
	// of full capacity it lost: its wall time × the share of the run's
	// largest world size it ran without (an elastic job's badput, as
	// ml-goodput counts it; a GPU-time figure, not a part of the elapsed
	// time's goodput).
	WorldSize     int64   `json:"world_size"`
	Change        string  `json:"change,omitempty"`
	CapacityLostS float64 `json:"capacity_lost_s,omitempty"`
	// Time accounts for the attempt's wall time from its first step's
	// start to its last step's end: the wall time under its steps (warm-up
	// and incomplete steps included) and the named gaps between steps
	// (evaluation, checkpoint, steps missing from the traces). What is
	// left is unaccounted: a step is the loop's period, so it stays under
	// 1% (report.Invariants).
	Time AttemptTime `json:"time"`
}

// AttemptTime is where an attempt's wall time between its first step's
// start and its last step's end went, s.
type AttemptTime struct {
	SpanS float64 `json:"span_s"`
	// StepsS is the wall time under the steps: Σ step time less OverlapS.
	StepsS float64 `json:"steps_s"`
	// OverlapS is step time that ran beside the step before: a step's
	// time is its slowest rank's, and a rank that ended a step first
	// starts its next one while a slower rank is still in the last (it
	// waits in its first collective), so the next step's slowest duration
	// begins before the last one's end. Counted once, in the step before.
	OverlapS     float64 `json:"overlap_s"`
	GapsS        float64 `json:"gaps_s"` // named: evaluation, checkpoint, unmonitored steps
	UnaccountedS float64 `json:"unaccounted_s"`
}

// Outcome says how the attempt ended.
func (a *AttemptRow) Outcome() string {
	switch {
	case a.ExitCode == nil && a.Stopped != "":
		return a.Stopped
	case a.ExitCode == nil:
		return "no end recorded"
	case *a.ExitCode == 0:
		return "finished"
	case a.Stopped != "":
		return fmt.Sprintf("%s (exit %d)", a.Stopped, *a.ExitCode)
	}
	return fmt.Sprintf("crashed (exit %d)", *a.ExitCode)
}

// attemptsAcc is the attempts table of steps fed in order (attemptRows,
// in the tests, feeds them all at once).
type attemptsAcc struct {
	launched     map[int64]bool
	exit         map[int64]int64
	stopped      map[int64]string // its launcher's end: stopped by a signal, and whose
	began, ended map[int64]int64  // its launcher's start and end events
	out          []AttemptRow
	tok, ns, mfu float64
	mfuNs        float64
	nMFU         int
	from, to     int64
	named        [][2]int64 // evaluation and checkpoint events: the gaps between steps with a name
	first, last  int64      // the attempt's first step start, the end so far
	prevStep     int64
	stepsNs      int64 // wall time under steps
	overlapNs    int64 // step time beside the step before
	gapsNs       int64
}

func newAttemptsAcc(events []tps.Event) *attemptsAcc {
	a := &attemptsAcc{launched: map[int64]bool{}, exit: map[int64]int64{}, stopped: map[int64]string{}, began: map[int64]int64{}, ended: map[int64]int64{}}
	for _, e := range events {
		switch e.Kind {
		case tps.EventAttemptStart, tps.EventJobStart:
			if e.Kind == tps.EventAttemptStart {
				a.launched[e.Attempt] = true
			}
			if b, ok := a.began[e.Attempt]; !ok || e.StartUnixNs < b {
				a.began[e.Attempt] = e.StartUnixNs
			}
		}
		switch e.Kind {
		case tps.EventAttemptEnd, tps.EventJobEnd:
			a.ended[e.Attempt] = max(a.ended[e.Attempt], e.EndUnixNs, e.StartUnixNs)
		}
		switch e.Kind {
		case tps.EventEval, tps.EventCheckpointSave, tps.EventCheckpointRestore, tps.EventTraceStop:
			a.named = append(a.named, [2]int64{e.StartUnixNs, e.EndUnixNs})
		}
		switch e.Kind {
		case tps.EventAttemptEnd:
			if c, ok := a.exit[e.Attempt]; !ok || c == 0 {
				a.exit[e.Attempt] = e.ExitCode // a failing rank's code wins
			}
			if why, ok := strings.CutPrefix(e.Detail, tps.StoppedPrefix); ok && e.ExitCode != 0 {
				a.stopped[e.Attempt] = why
			}
		}
	}
	return a
}

func (a *attemptsAcc) flush() {
	r := &a.out[len(a.out)-1]
	if a.ns > 0 {
		r.TPS = a.tok / (a.ns / 1e9)
	}
	if a.nMFU > 0 && a.mfuNs > 0 {
		m := a.mfu / a.mfuNs // weighted by step time, as the run's
		r.MFU = &m
	}
	// from its launch (or first step) until its launcher ended (or its
	// last step): the same span whether the report is of the whole run
	// or of this attempt (--attempt)
	from, to := a.from, a.to
	if b, ok := a.began[r.Attempt]; ok {
		from = min(from, b)
	}
	if e, ok := a.ended[r.Attempt]; ok {
		to = max(to, e)
	}
	r.WallS = float64(to-from) / 1e9
	if c, ok := a.exit[r.Attempt]; ok {
		r.ExitCode = &c
		r.Stopped = a.stopped[r.Attempt]
	}
	span := a.last - a.first
	r.Time = AttemptTime{SpanS: sec(span), StepsS: sec(a.stepsNs), OverlapS: sec(a.overlapNs), GapsS: sec(a.gapsNs),
		UnaccountedS: sec(span - a.stepsNs - a.gapsNs)}
}

func (a *attemptsAcc) add(c *tps.ClusterStep, warm bool) {
	if len(a.out) == 0 || a.out[len(a.out)-1].Attempt != c.Attempt {
		if len(a.out) > 0 {
			a.flush()
		}
		a.out = append(a.out, AttemptRow{Attempt: c.Attempt, Launch: a.launched[c.Attempt], FirstStep: c.Step})
		a.tok, a.ns, a.mfu, a.mfuNs, a.nMFU, a.from, a.to = 0, 0, 0, 0, 0, c.StartUnixNs, c.EndUnixNs
		// the span begins where the first step's step time does (its
		// slowest rank's duration back from its end)
		a.first, a.last, a.stepsNs, a.overlapNs, a.gapsNs, a.prevStep = c.EndUnixNs-max(c.StepTimeNs, 0), c.EndUnixNs-max(c.StepTimeNs, 0), 0, 0, 0, c.Step-1
	}
	r := &a.out[len(a.out)-1]
	a.account(c)
	r.LastStep, r.Steps = c.Step, r.Steps+1
	r.WorldSize = max(r.WorldSize, c.WorldSize)
	a.from, a.to = min(a.from, c.StartUnixNs), max(a.to, c.EndUnixNs)
	if warm || !c.Complete() || c.StepTimeNs <= 0 {
		return
	}
	a.tok += float64(c.Tokens)
	a.ns += float64(c.StepTimeNs)
	if c.MFUUnknown == "" && c.MFU > 0 {
		a.mfu += c.MFU * float64(c.StepTimeNs)
		a.mfuNs += float64(c.StepTimeNs)
		a.nMFU++
	}
}

// account adds a step to its attempt's time: its step time past the last
// step's end (the rest ran beside it: OverlapS), and the gap before it
// where it began after the last one ended (named where an evaluation or
// checkpoint event covers it, or where steps are missing from the
// traces).
func (a *attemptsAcc) account(c *tps.ClusterStep) {
	st := max(c.StepTimeNs, 0)
	begin := c.EndUnixNs - st
	if begin > a.last {
		if c.Step-a.prevStep > 1 {
			a.gapsNs += begin - a.last // unmonitored: trained, not seen
		} else {
			a.gapsNs += overlap(a.named, a.last, begin)
		}
	}
	beside := min(max(a.last-begin, 0), st)
	a.stepsNs += st - beside
	a.overlapNs += beside
	a.last = max(a.last, c.EndUnixNs)
	a.prevStep = c.Step
}

func (a *attemptsAcc) result() []AttemptRow {
	if len(a.out) > 0 {
		a.flush()
	}
	elastic(a.out)
	for i := range a.out[:max(len(a.out)-1, 0)] {
		if r := &a.out[i]; r.ExitCode == nil && !a.out[i+1].Launch {
			// its launch's end is a later attempt's (launchEnds): a
			// restart inside the launch (torchrun's) ended this one
			r.Stopped = "restarted inside its launch"
		}
	}
	return a.out
}

// launchEnds moves a launch's end (its attempt_end, a job_end) to the
// last attempt that ran inside that launch: torchrun's restarts are
// attempts of their own (TPSPROF_ATTEMPT plus the restart count) with no
// launcher events, and the launch's end named its first attempt: that
// one read "finished" with the restart's whole time as its shutdown
// badput (goodput 21.6% against about 57% by the job's clocks), the
// attempt that finished "no end recorded". attempts are those the steps
// hold; events is changed in place.
func launchEnds(events []tps.Event, attempts []int64) {
	launched := map[int64]bool{}
	for _, e := range events {
		if e.Kind == tps.EventAttemptStart || e.Kind == tps.EventJobStart {
			launched[e.Attempt] = true
		}
	}
	if len(launched) == 0 {
		return
	}
	last := func(l int64) int64 { // the last attempt of the launch that started l
		a := l
		for _, at := range attempts {
			if at <= a {
				continue
			}
			for b := a + 1; b <= at; b++ {
				if launched[b] {
					return a
				}
			}
			a = at
		}
		return a
	}
	for i := range events {
		e := &events[i]
		if (e.Kind == tps.EventAttemptEnd || e.Kind == tps.EventJobEnd) && launched[e.Attempt] {
			e.Attempt = last(e.Attempt)
		}
	}
}

// elastic names the attempts whose world size differs from the one before
// and the capacity each attempt lost against the run's largest.
func elastic(rows []AttemptRow) {
	var most int64
	for _, r := range rows {
		most = max(most, r.WorldSize)
	}
	for i := range rows {
		r := &rows[i]
		if i > 0 && r.WorldSize != rows[i-1].WorldSize && r.WorldSize > 0 && rows[i-1].WorldSize > 0 {
			kind := "scale-up"
			if r.WorldSize < rows[i-1].WorldSize {
				kind = "scale-down"
			}
			r.Change = fmt.Sprintf("%s %d→%d", kind, rows[i-1].WorldSize, r.WorldSize)
		}
		if most > 0 && r.WorldSize > 0 && r.WorldSize < most {
			r.CapacityLostS = r.WallS * float64(most-r.WorldSize) / float64(most)
		}
	}
}

// attemptLines are the table's text lines, at most 20 (and how many more).
func attemptLines(rows []AttemptRow) []string {
	var out []string
	for i := range rows {
		if i == 20 {
			out = append(out, fmt.Sprintf("and %d more attempts", len(rows)-20))
			break
		}
		a := &rows[i]
		kind := "restart"
		if a.Launch || i == 0 {
			kind = "launch"
		}
		m := "MFU n/a"
		if a.MFU != nil {
			m = "MFU " + pct(*a.MFU)
		}
		ranks := ""
		if a.WorldSize > 0 {
			ranks = fmt.Sprintf(", %d ranks", a.WorldSize)
		}
		line := fmt.Sprintf("%d (%s): steps %d-%d (%d)%s, %s tokens/s, %s, %s, %s",
			a.Attempt, kind, a.FirstStep, a.LastStep, a.Steps, ranks, tps.SI(a.TPS), m, dur(a.WallS), a.Outcome())
		if a.Change != "" {
			line += "; " + a.Change
		}
		if a.CapacityLostS > 0 {
			line += fmt.Sprintf("; %s of full capacity lost", dur(a.CapacityLostS))
		}
		out = append(out, line)
	}
	return out
}
