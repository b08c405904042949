package report

import "github.com/tpsprof/tpsprof/tps"

// Test-only entry points: the report made twice and checked
// (stream_test.go), and the report's accumulators fed all at once what
// the report's pass feeds them step by step.

// analyzeChecked is Analyze, and checkStreamed handed its report and the
// same report streamed three steps at a time (the energy join 50 steady
// steps at a time, the step times and TPS in files past two values).
func analyzeChecked(dir string, opt Options) (*Report, error) {
	rep, _, err := analyzeWithPlotsOr(dir, opt, false)
	return rep, err
}

// analyzeWithPlotsChecked is AnalyzeWithPlots, checked as analyzeChecked.
func analyzeWithPlotsChecked(dir string, opt Options) (*Report, *Plots, error) {
	return analyzeWithPlotsOr(dir, opt, true)
}

func analyzeWithPlotsOr(dir string, opt Options, plots bool) (*Report, *Plots, error) {
	rep, pd, err := analyze(dir, opt, plots)
	if err != nil {
		return nil, nil, err
	}
	opt.chunk, opt.energyChunk, opt.valuesInMemory = 3, 50, 2
	streamed, _, serr := analyze(dir, opt, false)
	checkStreamed(dir, rep, streamed, serr)
	return rep, pd, nil
}

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
