package report

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Steps whose spans overlap (a rank starts the next step before the last
// rank ends this one) and a gap with an evaluation: each moment goes to
// one part, so the parts add up to the elapsed time exactly, the overlap
// is not counted twice, and no idle time appears where steps follow each
// other. Before, each step counted its slowest rank's duration and its
// start skew as idle: the parts added up to more than the elapsed time.
func TestGoodputPartsAddUp(t *testing.T) {
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	var steps []tps.ClusterStep
	end := t0
	for i := range int64(10) {
		start := end - s/10 // 100 ms of overlap with the previous step
		if i == 0 {
			start = t0
		}
		if i == 5 {
			start = end + 3*s // an evaluation of 3 s, then 1 s idle
		}
		steps = append(steps, tps.ClusterStep{Attempt: 0, Step: i, StartUnixNs: start, EndUnixNs: start + 2*s,
			StepTimeNs: 2 * s, DataStallFractionMean: 0.1})
		end = start + 2*s
	}
	ev := []tps.Event{{Kind: tps.EventEval, StartUnixNs: steps[4].EndUnixNs, EndUnixNs: steps[4].EndUnixNs + 2*s}}
	g := computeGoodput(steps, make([]bool, len(steps)), ev)
	sum := g.ProductiveS
	for _, v := range g.BadputS {
		sum += v
	}
	wantElapsed := float64(steps[9].EndUnixNs-t0) / 1e9
	if math.Abs(g.ElapsedS-wantElapsed) > 1e-9 || math.Abs(sum-g.ElapsedS) > 1e-9 {
		t.Fatalf("parts add up to %g s, elapsed %g s (want %g)", sum, g.ElapsedS, wantElapsed)
	}
	// 10 steps: the first and the one after the gap whole (2 s), the
	// others from the previous end (1.9 s); 10% of it data stall.
	steps2 := 2*2.0 + 8*1.9
	if math.Abs(g.ProductiveS-0.9*steps2) > 1e-9 || math.Abs(g.BadputS[BadDataStall]-0.1*steps2) > 1e-9 {
		t.Errorf("productive %g s, data stall %g s; want %g and %g", g.ProductiveS, g.BadputS[BadDataStall], 0.9*steps2, 0.1*steps2)
	}
	if math.Abs(g.BadputS[BadEval]-2) > 1e-9 || math.Abs(g.BadputS[BadIdle]-1) > 1e-9 {
		t.Errorf("eval %g s, idle %g s; want 2 and 1", g.BadputS[BadEval], g.BadputS[BadIdle])
	}
}

// An agent down for a while: steps 4-6 never reached the traces. Their
// time is unmonitored, not idle: in the elapsed time, out of goodput's
// denominator and out of wall TPS. A second launch an hour later adds
// nothing to the elapsed time.
func TestGoodputUnmonitoredAndBetweenLaunches(t *testing.T) {
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	var steps []tps.ClusterStep
	at := t0
	for _, i := range []int64{0, 1, 2, 3, 7, 8, 9} {
		if i == 7 {
			at += 3 * s // the three steps nobody recorded
		}
		steps = append(steps, tps.ClusterStep{Step: i, StartUnixNs: at, EndUnixNs: at + s, StepTimeNs: s, Tokens: 100})
		at += s
	}
	relaunch := at + 3600*s
	ev := []tps.Event{{Kind: tps.EventAttemptStart, Attempt: 1, Rank: -1, StartUnixNs: relaunch, EndUnixNs: relaunch}}
	for i := int64(10); i < 13; i++ {
		steps = append(steps, tps.ClusterStep{Attempt: 1, Step: i, StartUnixNs: relaunch + (i-9)*s, EndUnixNs: relaunch + (i-8)*s, StepTimeNs: s, Tokens: 100})
	}
	g := computeGoodput(steps, make([]bool, len(steps)), ev)
	if g.UnmonitoredSteps != 3 || math.Abs(g.UnmonitoredS-3) > 1e-9 || g.BadputS[BadIdle] != 0 {
		t.Errorf("unmonitored %g s over %d steps, idle %g s; want 3 s, 3 steps, no idle", g.UnmonitoredS, g.UnmonitoredSteps, g.BadputS[BadIdle])
	}
	if math.Abs(g.BetweenLaunchesS-3600) > 1e-9 || g.BadputS[BadRestart] != 0 || math.Abs(g.BadputS[BadStartup]-1) > 1e-9 {
		t.Errorf("between launches %g s, restart %g s, startup %g s; want 3600, 0, 1", g.BetweenLaunchesS, g.BadputS[BadRestart], g.BadputS[BadStartup])
	}
	// 7 + 3 steps of 1 s, 3 s unmonitored, 1 s start-up of the second launch
	if math.Abs(g.ElapsedS-14) > 1e-9 || math.Abs(g.ProductiveS-10) > 1e-9 || math.Abs(g.Goodput-10.0/11) > 1e-9 {
		t.Errorf("elapsed %g s, productive %g s, goodput %g; want 14, 10, 10/11", g.ElapsedS, g.ProductiveS, g.Goodput)
	}
	sum := g.ProductiveS + g.UnmonitoredS
	for _, v := range g.BadputS {
		sum += v
	}
	if math.Abs(sum-g.ElapsedS) > 1e-9 {
		t.Errorf("parts add up to %g s of %g", sum, g.ElapsedS)
	}
	if out := g.ExcludedWithin(t0, relaunch+4*s); out != 3603*s {
		t.Errorf("excluded from wall time: %d ns, want 3603 s", out)
	}
}

// The attempts table: a launch of 4 ranks that crashed (exit 137), an
// elastic restart inside it on 2 ranks that finished (a scale-down, half
// the capacity lost for its 3 s); TPS and MFU over each attempt's own
// steady, complete steps.
func TestAttemptRows(t *testing.T) {
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	var steps []tps.ClusterStep
	for i := range int64(6) {
		a := i / 3
		steps = append(steps, tps.ClusterStep{Attempt: a, Step: i, StartUnixNs: t0 + i*s, EndUnixNs: t0 + (i+1)*s, StepTimeNs: s,
			Tokens: 1000 * (a + 1), MFU: 0.1 * float64(a+1), WorldSize: 4 / (a + 1)})
	}
	steps[2].RanksMissing, steps[2].MFUUnknown = 1, "incomplete step" // left out of attempt 0's figures
	ev := []tps.Event{
		{Kind: tps.EventAttemptStart, Attempt: 0, Rank: -1, StartUnixNs: t0},
		{Kind: tps.EventAttemptEnd, Attempt: 0, Rank: 3, ExitCode: 137, StartUnixNs: t0 + 3*s},
		{Kind: tps.EventAttemptEnd, Attempt: 1, Rank: 0, StartUnixNs: t0 + 6*s},
	}
	warm := []bool{true, false, false, true, false, false}
	rows := attemptRows(steps, warm, ev)
	if len(rows) != 2 || !rows[0].Launch || rows[1].Launch || rows[0].Steps != 3 || rows[1].FirstStep != 3 || rows[1].LastStep != 5 {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].TPS != 1000 || rows[1].TPS != 2000 || rows[0].MFU == nil || math.Abs(*rows[1].MFU-0.2) > 1e-12 {
		t.Errorf("TPS %g, %g; MFU %v, %v", rows[0].TPS, rows[1].TPS, rows[0].MFU, rows[1].MFU)
	}
	if rows[0].Outcome() != "crashed (exit 137)" || rows[1].Outcome() != "finished" {
		t.Errorf("outcomes %q, %q", rows[0].Outcome(), rows[1].Outcome())
	}
	if l := attemptLines(rows); len(l) != 2 || l[0] != "0 (launch): steps 0-2 (3), 4 ranks, 1.0k tokens/s, MFU 10.0%, 3s, crashed (exit 137)" ||
		l[1] != "1 (restart): steps 3-5 (3), 2 ranks, 2.0k tokens/s, MFU 20.0%, 3s, finished; scale-down 4→2; 1.5s of full capacity lost" {
		t.Errorf("lines %q", l)
	}
	if rows[1].Change != "scale-down 4→2" || rows[1].CapacityLostS != 1.5 || rows[0].Change != "" || rows[0].CapacityLostS != 0 {
		t.Errorf("elastic: %+v", rows)
	}
}

// Steps missing inside an attempt break the plotted line (a gap, not a
// straight line across the unmonitored time); a new attempt does too.
func TestSegmentsBreakAtGaps(t *testing.T) {
	var steps []tps.ClusterStep
	for _, k := range [][2]int64{{0, 0}, {0, 1}, {0, 2}, {0, 6}, {0, 7}, {1, 5}, {1, 6}} {
		steps = append(steps, tps.ClusterStep{Attempt: k[0], Step: k[1]})
	}
	got := segments(plotStepsOf(steps))
	want := [][2]int{{0, 3}, {3, 5}, {5, 7}}
	if len(got) != len(want) {
		t.Fatalf("segments %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("segments %v, want %v", got, want)
		}
	}
}

// A short clean run after a launch that failed: the failed launch (5 s)
// is its own badput line, the minute before the next launch is between
// launches, the 10 s before the first step start-up, the 5 s after the
// last step until the launcher exited shutdown; the parts add up to the
// elapsed time, and the whole run and --attempt 1 agree on attempt 1's
// 35 s.
func TestGoodputShortRunNamed(t *testing.T) {
	const s = int64(1e9)
	root := t.TempDir()
	cluster, err := trace.NewPartWriter[tps.ClusterStep](root, "short", trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	events, _ := trace.NewPartWriter[tps.Event](root, "short", trace.Events, trace.WriterOptions{WriterID: "t"})
	t0 := int64(1.7e18)
	one, zero := int64(1), int64(0)
	events.Write([]tps.Event{
		{Job: "short", Attempt: 0, Kind: tps.EventAttemptStart, Rank: -1, StartUnixNs: t0, EndUnixNs: t0},
		{Job: "short", Attempt: 0, Kind: tps.EventAttemptEnd, Rank: -1, StartUnixNs: t0 + 5*s, EndUnixNs: t0 + 5*s, ExitCode: one},
		{Job: "short", Attempt: 1, Kind: tps.EventAttemptStart, Rank: -1, StartUnixNs: t0 + 65*s, EndUnixNs: t0 + 65*s},
		{Job: "short", Attempt: 1, Kind: tps.EventAttemptEnd, Rank: -1, StartUnixNs: t0 + 100*s, EndUnixNs: t0 + 100*s, ExitCode: zero},
	})
	var rows []tps.ClusterStep
	for i := range int64(20) {
		start := t0 + 75*s + i*s
		rows = append(rows, tps.ClusterStep{Job: "short", Attempt: 1, Step: i, WorldSize: 1, RanksReported: 1, Tokens: 1000, StepTimeNs: s,
			StartUnixNs: start, EndUnixNs: start + s, ComputeNsMean: float64(s), TPS: 1000})
	}
	cluster.Write(rows)
	cluster.Close()
	events.Close()
	rep, err := analyzeChecked(filepath.Join(root, "short"), Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	g := rep.Goodput
	want := map[string]float64{BadLaunchFailed: 5, BadStartup: 10, BadShutdown: 5, BadWarmup: 1}
	for k, v := range want {
		if math.Abs(g.BadputS[k]-v) > 1e-6 {
			t.Errorf("%s %g s, want %g (badput %v)", k, g.BadputS[k], v, g.BadputS)
		}
	}
	if g.BadputS[BadIdle] != 0 || g.BadputS[BadRestart] != 0 {
		t.Errorf("idle or restart badput in a run with neither: %v", g.BadputS)
	}
	if g.ElapsedS != 40 || g.BetweenLaunchesS != 60 || g.FailedLaunches != 1 || math.Abs(g.ProductiveS-19) > 1e-6 {
		t.Errorf("elapsed %g, between launches %g, failed launches %d, productive %g; want 40, 60, 1, 19", g.ElapsedS, g.BetweenLaunchesS, g.FailedLaunches, g.ProductiveS)
	}
	var text strings.Builder
	WriteText(&text, rep)
	for _, must := range []string{"launch_failed 12.5%", "shutdown 12.5%", "1m0s between launches"} {
		if !strings.Contains(text.String(), must) {
			t.Errorf("text lacks %q:\n%s", must, text.String())
		}
	}
	var wall float64
	for _, a := range rep.Attempts {
		if a.Attempt == 1 {
			wall = a.WallS
		}
	}
	att := int64(1)
	only, err := analyzeChecked(filepath.Join(root, "short"), Options{Warmup: 1, Select: Selection{Attempt: &att}})
	if err != nil {
		t.Fatal(err)
	}
	if wall != 35 || only.Goodput.ElapsedS != 35 || len(only.Attempts) != 1 || only.Attempts[0].WallS != 35 {
		t.Errorf("attempt 1: %g s in the whole run's table, --attempt 1 elapsed %g s (its table %+v); want 35", wall, only.Goodput.ElapsedS, only.Attempts)
	}
}

// An evaluation then a checkpoint in one gap, from two ranks: rank 0
// evaluates for 0.9 s then saves for 0.6 s; rank 1 evaluates for 0.9 s and
// waits at the barrier while rank 0 saves, its evaluation's span running
// on over the save. Each instant is one cause's, the checkpoint first: the
// save 0.6 s and the evaluation 0.9 s, the profiler's stop after them 0.2 s
// (the checkpoint read 0.3 s and the evaluation 1.2 s when the evaluation
// took what overlapped).
func TestGapsOfSeveralKinds(t *testing.T) {
	const ms = int64(1e6)
	t0 := int64(1_700_000_000) * 1000 * ms
	steps := []tps.ClusterStep{
		{Step: 0, StartUnixNs: t0, EndUnixNs: t0 + 1000*ms, StepTimeNs: 1000 * ms},
		{Step: 1, StartUnixNs: t0 + 2700*ms, EndUnixNs: t0 + 3700*ms, StepTimeNs: 1000 * ms},
	}
	gap := t0 + 1000*ms
	ev := []tps.Event{
		{Kind: tps.EventEval, Rank: 0, StartUnixNs: gap, EndUnixNs: gap + 900*ms},
		{Kind: tps.EventCheckpointSave, Rank: 0, StartUnixNs: gap + 900*ms, EndUnixNs: gap + 1500*ms},
		{Kind: tps.EventEval, Rank: 1, StartUnixNs: gap, EndUnixNs: gap + 1500*ms},
		{Kind: tps.EventTraceStop, Rank: 0, StartUnixNs: gap + 1500*ms, EndUnixNs: gap + 1700*ms},
	}
	g := computeGoodput(steps, make([]bool, 2), ev)
	for k, want := range map[string]float64{BadCheckpoint: 0.6, BadEval: 0.9, BadProfiling: 0.2, BadIdle: 0} {
		if math.Abs(g.BadputS[k]-want) > 1e-9 {
			t.Errorf("%s %.3f s, want %.3f (%v)", k, g.BadputS[k], want, g.BadputS)
		}
	}
}

// Two ranks save a checkpoint between steps, rank 1 for longer: rank 0
// starts the next step first and waits in its first collective for rank 1.
// The save's time runs to its end on rank 1 (the gap's, not that step's
// exposed communication), and the step it ran into is out of the
// statistics: the breakdown is the clean steps' (a checkpoint every 2
// steps on 2 ranks, causes.py, read 28% exposed comm and 27% host/other
// of the run's step time, and the checkpoint's headroom 96% against the
// job's own 265%).
func TestSaveRunningIntoAStepIsTheGaps(t *testing.T) {
	const ms = int64(1e6)
	const job, world, steps = "cut", 2, 24
	root := t.TempDir()
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, job, trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, job, trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	events, _ := trace.NewPartWriter[tps.Event](root, job, trace.Events, trace.WriterOptions{WriterID: "t"})
	now := int64(1.7e18)
	var saved int64
	for s := range int64(steps) {
		starts := [world]int64{now, now}
		if s > 0 && s%6 == 0 { // rank 0 saves for 20 ms, rank 1 for 50 ms
			for r, d := range [world]int64{20 * ms, 50 * ms} {
				events.Write([]tps.Event{{Job: job, Kind: tps.EventCheckpointSave, Rank: int64(r), Step: s - 1, StartUnixNs: now, EndUnixNs: now + d}})
				starts[r] = now + d
			}
			saved += 50 * ms
		}
		end := starts[1] + 10*ms
		recs := make([]tps.StepRecord, world)
		for r := range recs {
			d := end - starts[r]
			comm := d - 9*ms // 9 ms of compute, the rest waiting in the collectives
			recs[r] = tps.StepRecord{Job: job, Step: s, Rank: int64(r), WorldSize: world, Node: "n",
				StartUnixNs: starts[r], EndUnixNs: end, DurationNs: d, Tokens: 1000, ExposedCommNs: comm, CommNs: comm}
		}
		c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ranks.Write(recs)
		cluster.Write([]tps.ClusterStep{c})
		now = end
	}
	for _, w := range []interface{ Close() error }{ranks, cluster, events} {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := analyzeChecked(filepath.Join(root, job), Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Goodput.BadputS[BadCheckpoint]; math.Abs(got-float64(saved)/1e9) > 1e-6 {
		t.Errorf("checkpoint badput %.4f s, want the saves' %.4f s (%v)", got, float64(saved)/1e9, rep.Goodput.BadputS)
	}
	if rep.Summary.CutLeftOut != 3 || rep.Summary.SteadySteps != steps-3 {
		t.Errorf("%d steps cut, %d steady; want 3 and %d", rep.Summary.CutLeftOut, rep.Summary.SteadySteps, steps-3)
	}
	if got := rep.Breakdown.Shares.ExposedComm; math.Abs(got-0.1) > 1e-3 {
		t.Errorf("exposed comm %.4f of step time, want the clean steps' 0.1", got)
	}
	span := float64(now-int64(1.7e18)) / 1e9
	if len(rep.Findings) == 0 || rep.Findings[0].Bucket != BadCheckpoint ||
		math.Abs(rep.Findings[0].HeadroomPct-gain(float64(saved)/1e9/span)) > 0.5 {
		t.Errorf("findings %+v: want checkpoints first, +%.1f%%", rep.Findings, gain(float64(saved)/1e9/span))
	}
	var text strings.Builder
	if err := WriteText(&text, rep); err != nil || !strings.Contains(text.String(), "3 a save or evaluation between steps ran into") {
		t.Errorf("the text does not say which steps were left out (%v):\n%s", err, text.String())
	}
}
