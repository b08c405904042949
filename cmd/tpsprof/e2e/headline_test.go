package e2e

import (
	"bytes"
	"math"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// headlineHolds analyses a real job's folder (its first step of each
// attempt warm-up) and holds what people read first to the job's own
// truth: the report's invariants hold, and its headline is the tokens the
// job says it trained in its steady steps (tokens by step number) over
// those steps' step time, within 0.5%, in the text and the JSON alike.
func headlineHolds(t *testing.T, dir string, tokens map[int64]int64) *report.Report {
	t.Helper()
	rep, err := report.Analyze(dir, report.Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	rows, err := trace.ReadAll[tps.ClusterStep](filepath.Join(dir, trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	tps.SortSteps(rows)
	// steps that ran under a profiler or PyTorch's FLOP counter are out of
	// the figures (docs/report.md)
	events, err := trace.ReadAll[tps.Event](filepath.Join(dir, trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	sampled := map[[2]int64]bool{}
	for _, e := range events {
		if e.Kind == tps.EventTraceAnalysis || e.Kind == tps.EventFlopCount {
			sampled[[2]int64{e.Attempt, e.Step}] = true
		}
	}
	var tok, sec float64
	for i, c := range rows {
		if i == 0 || c.Attempt != rows[i-1].Attempt || c.StepTimeNs <= 0 {
			continue // the warm-up step of each attempt
		}
		if sampled[[2]int64{c.Attempt, c.Step}] {
			continue
		}
		n, ok := tokens[c.Step]
		if !ok {
			t.Fatalf("step %d: not in the job's truth", c.Step)
		}
		tok += float64(n)
		sec += float64(c.StepTimeNs) / 1e9
	}
	want := tok / sec
	if got := rep.Summary.AggregateTPS; math.Abs(got-want) > 0.005*want {
		t.Errorf("headline %v tokens/s, the job's tokens over the steps' time %v", got, want)
	}
	var text bytes.Buffer
	report.WriteText(&text, rep)
	if !regexp.MustCompile(`(?m)^  TPS +` + regexp.QuoteMeta(tps.SI(want)) + ` tokens/s`).MatchString(text.String()) {
		t.Errorf("the text does not lead with %s tokens/s:\n%s", tps.SI(want), text.String())
	}
	return rep
}

// checkInvariants fails the test on any report invariant that does not
// hold (report.Invariants: its text and JSON included).
func checkInvariants(t *testing.T, rep *report.Report) {
	t.Helper()
	for _, v := range report.Invariants(rep) {
		t.Errorf("report of %s: %s", rep.Job, v)
	}
}
