package report

import (
	"fmt"

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
}

// Outcome says how the attempt ended.
func (a *AttemptRow) Outcome() string {
	switch {
	case a.ExitCode == nil:
		return "no end recorded"
	case *a.ExitCode == 0:
		return "finished"
	}
	return fmt.Sprintf("crashed (exit %d)", *a.ExitCode)
}

// attemptRows builds the table from steps sorted by (attempt, step).
func attemptRows(steps []tps.ClusterStep, warm []bool, events []tps.Event) []AttemptRow {
	launched := map[int64]bool{}
	exit := map[int64]int64{}
	for _, e := range events {
		switch e.Kind {
		case tps.EventAttemptStart:
			launched[e.Attempt] = true
		case tps.EventAttemptEnd:
			if c, ok := exit[e.Attempt]; !ok || c == 0 {
				exit[e.Attempt] = e.ExitCode // a failing rank's code wins
			}
		}
	}
	var out []AttemptRow
	var tok, ns, mfu float64
	var nMFU int
	var from, to int64
	flush := func() {
		a := &out[len(out)-1]
		if ns > 0 {
			a.TPS = tok / (ns / 1e9)
		}
		if nMFU > 0 {
			m := mfu / float64(nMFU)
			a.MFU = &m
		}
		a.WallS = float64(to-from) / 1e9
		if c, ok := exit[a.Attempt]; ok {
			a.ExitCode = &c
		}
	}
	for i, c := range steps {
		if len(out) == 0 || out[len(out)-1].Attempt != c.Attempt {
			if len(out) > 0 {
				flush()
			}
			out = append(out, AttemptRow{Attempt: c.Attempt, Launch: launched[c.Attempt], FirstStep: c.Step})
			tok, ns, mfu, nMFU, from, to = 0, 0, 0, 0, c.StartUnixNs, c.EndUnixNs
		}
		a := &out[len(out)-1]
		a.LastStep, a.Steps = c.Step, a.Steps+1
		from, to = min(from, c.StartUnixNs), max(to, c.EndUnixNs)
		if warm[i] || !c.Complete() || c.StepTimeNs <= 0 {
			continue
		}
		tok += float64(c.Tokens)
		ns += float64(c.StepTimeNs)
		if c.MFUUnknown == "" && c.MFU > 0 {
			mfu += c.MFU
			nMFU++
		}
	}
	if len(out) > 0 {
		flush()
	}
	return out
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
		out = append(out, fmt.Sprintf("%d (%s): steps %d-%d (%d), %s tokens/s, %s, %s, %s",
			a.Attempt, kind, a.FirstStep, a.LastStep, a.Steps, tps.SI(a.TPS), m, dur(a.WallS), a.Outcome()))
	}
	return out
}
