package report

import "github.com/tpsprof/tpsprof/tps"

// Test-only entry points into the report's accumulators: what the
// report's pass feeds them step by step, taken all at once.

// computeGoodput analyses steps (sorted by attempt, step) with the warm-up
// mask and the run's events.
func computeGoodput(steps []tps.ClusterStep, warm []bool, events []tps.Event) Goodput {
	if len(steps) == 0 {
		return Goodput{BadputS: map[string]float64{}}
	}
	a := newGoodputAcc(spineOf(steps), events)
	for i := range steps {
		a.add(&steps[i], warm[i], i+1 == len(steps) || steps[i+1].Attempt != steps[i].Attempt)
	}
	return a.result()
}

// attemptRows builds the table from steps sorted by (attempt, step).
func attemptRows(steps []tps.ClusterStep, warm []bool, events []tps.Event) []AttemptRow {
	a := newAttemptsAcc(events)
	for i := range steps {
		a.add(&steps[i], warm[i])
	}
	return a.result()
}
