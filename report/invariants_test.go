package report

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// The invariant check finds what it is there to find: a breakdown past
// 100%, a headline that is a mean of rates, a figure that is not a
// number, goodput parts that miss the elapsed time.
func TestInvariantsCatch(t *testing.T) {
	good := func() *Report {
		r := &Report{Job: "j", Summary: tps.Summary{Steps: 2, SteadySteps: 2, Tokens: 300, AggregateTPS: 100, TPSPerGPU: 100, WorldSize: 1,
			StepTimeS: tps.Dist{Mean: 1.5}}}
		r.Breakdown.Compute, r.Breakdown.ExposedComm, r.Breakdown.Other = 0.7, 0.2, 0.1
		r.Goodput = Goodput{ElapsedS: 10, ProductiveS: 8, Goodput: 0.8, BadputS: map[string]float64{BadIdle: 2}}
		return r
	}
	if v := Invariants(good()); len(v) != 0 {
		t.Fatalf("a sound report: %v", v)
	}
	for name, c := range map[string]struct {
		spoil func(r *Report)
		want  string
	}{
		"compute past 100%":   {func(r *Report) { r.Breakdown.Compute = 1.018 }, "breakdown compute"},
		"parts short of 100%": {func(r *Report) { r.Breakdown.Other = 0 }, "add up to 0.9000"},
		"mean of rates":       {func(r *Report) { r.Summary.AggregateTPS = 124.7 }, "not tokens ÷ step time"},
		"NaN wait":            {func(r *Report) { r.Breakdown.WaitingForPeers = math.NaN() }, "waiting_for_peers = NaN"},
		"goodput parts":       {func(r *Report) { r.Goodput.BadputS[BadEval] = 1 }, "goodput parts add up"},
		"worst step":          {func(r *Report) { r.Summary.CommFractionMax = 1.494 }, "worst step's exposed"},
		"no tokens, a figure": {func(r *Report) { r.Summary.TPSUnknown = tps.NoTokens }, "throughput figures beside"},
	} {
		r := good()
		c.spoil(r)
		v := strings.Join(Invariants(r), "; ")
		if !strings.Contains(v, c.want) {
			t.Errorf("%s: found %q, want %q", name, v, c.want)
		}
	}
}

// A rank whose step began before the previous step ended on the critical
// path (its start taken on the host while the device still ran the last
// step: the single-GPU H200 job that read "compute 101.8%") has parts that
// cover more than the period: its shares are over the parts, so they add
// up to 100% and compute stays within it.
func TestSharesOfOverlappingStep(t *testing.T) {
	const ms = int64(1e6)
	a, err := tps.NewStepAccumulator("j", 0, 1, 1, tps.AccumulatorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// the previous step ended at 1000 ms; this one's record says it ran
	// 980-1420 ms (440 ms, 20 ms of it before the previous end)
	a.Add(&tps.StepRecord{Job: "j", Step: 1, WorldSize: 1, Tokens: 10, StartUnixNs: 980 * ms, EndUnixNs: 1420 * ms, DurationNs: 440 * ms, ExposedCommNs: 40 * ms})
	c := a.ResultIn(tps.StepContext{PrevEndUnixNs: 1000 * ms})
	if c.StepTimeNs != 420*ms {
		t.Fatalf("step time %d ms, want the period 420", c.StepTimeNs/ms)
	}
	if old := c.ComputeNsMean / float64(c.StepTimeNs); old <= 0.95 {
		t.Fatalf("compute over the period %.3f: the case is not the one it tests", old)
	}
	s := c.Shares()
	if math.Abs(s.Sum()-1) > 1e-12 || s.Compute > 1 || math.Abs(s.Compute-400.0/440) > 1e-9 || math.Abs(s.ExposedComm-40.0/440) > 1e-9 {
		t.Errorf("shares %+v (sum %v), want compute 400/440 and exposed 40/440", s, s.Sum())
	}
	if c.CommFractionMax > 1 {
		t.Errorf("worst exposed share %v", c.CommFractionMax)
	}
}

// A run that counted no token says so everywhere, and prints no figure
// for it: no 0 tokens/s, no NaN% below, no Inf J/token; its JSON has
// nulls and the reason.
func TestNoTokensSaid(t *testing.T) {
	var steps []tps.ClusterStep
	for i := range int64(20) {
		steps = append(steps, tps.ClusterStep{Job: "j", Step: i, WorldSize: 2, RanksReported: 2, StepTimeNs: 1e8,
			StartUnixNs: 1e9 + i*1e8, EndUnixNs: 1e9 + (i+1)*1e8, ComputeNsMean: 9e7, CommFractionMean: 0.1, GPUsJoined: 2, EnergyJ: 50})
	}
	s := tps.Summarize(steps, tps.WindowOptions{Warmup: 1})
	if s.TPSUnknown == "" || s.AggregateTPS != 0 || s.MFU != nil || !strings.Contains(s.MFUUnknown, "no tokens") {
		t.Fatalf("summary %+v", s)
	}
	r := &Report{Job: "j", Summary: s, Energy: &Energy{Steps: 19, PowerWMean: 500, SMClockMHzMean: 1900}}
	r.Breakdown.Shares = s.Breakdown
	if v := Invariants(r); len(v) > 0 {
		t.Errorf("invariants: %v", v)
	}
	var text bytes.Buffer
	WriteText(&text, r)
	for _, bad := range []string{"NaN", "Inf", " 0.0 tokens/s", "0.00 tokens/J"} {
		if strings.Contains(text.String(), bad) {
			t.Errorf("text has %q:\n%s", bad, text.String())
		}
	}
	if !strings.Contains(text.String(), "n/a: no tokens counted") {
		t.Errorf("text does not say no tokens were counted:\n%s", text.String())
	}
	b, _ := json.Marshal(r)
	var back struct {
		Summary map[string]any `json:"summary"`
	}
	json.Unmarshal(b, &back)
	for _, k := range []string{"aggregate_tps", "tps_per_gpu", "wall_tps", "tps"} {
		if v, ok := back.Summary[k]; !ok || v != nil {
			t.Errorf("JSON %s = %v, want null", k, v)
		}
	}
	if back.Summary["tps_unknown"] != tps.NoTokens {
		t.Errorf("JSON tps_unknown = %v", back.Summary["tps_unknown"])
	}
}

// TestAttemptTimeInvariant: an attempt's wall time from its first step's
// start to its last step's end is its steps' step time and its named gaps
// (evaluation, checkpoint, the profiler's stop, steps missing from the
// traces); where the job's producer says its steps are the loop's period
// (tps.StepsLoop), time left over is a violation.
func TestAttemptTimeInvariant(t *testing.T) {
	const s = int64(1e9)
	t0 := int64(1_700_000_000) * s
	rows := func(gapAfter3, idleAfter6 int64) []tps.ClusterStep {
		var out []tps.ClusterStep
		at := t0
		for i := int64(0); i < 10; i++ {
			out = append(out, tps.ClusterStep{Step: i, StartUnixNs: at, EndUnixNs: at + s, StepTimeNs: s, Tokens: 100, RanksReported: 1, WorldSize: 1})
			at += s
			if i == 3 {
				at += gapAfter3
			}
			if i == 6 {
				at += idleAfter6
			}
		}
		return out
	}
	events := []tps.Event{
		{Kind: tps.EventEval, StartUnixNs: t0 + 4*s, EndUnixNs: t0 + 4*s + s/2},
		{Kind: tps.EventCheckpointSave, StartUnixNs: t0 + 4*s + s/2, EndUnixNs: t0 + 5*s},
	}
	account := func(steps []tps.ClusterStep) AttemptTime {
		a := newAttemptsAcc(events)
		for i := range steps {
			a.add(&steps[i], false)
		}
		return a.result()[0].Time
	}
	// an evaluation then a checkpoint fill the gap after step 3: all accounted
	got := account(rows(s, 0))
	if got.SpanS != 11 || got.StepsS != 10 || got.GapsS != 1 || got.UnaccountedS != 0 {
		t.Errorf("named gap: %+v", got)
	}
	r := &Report{Meta: &tps.RunMeta{Steps: tps.StepsLoop}, Attempts: []AttemptRow{{Time: got}}}
	if v := Invariants(r); len(v) != 0 {
		t.Errorf("a sound attempt: %v", v)
	}
	// 0.3 s between steps 6 and 7 that nothing names: caught (2.6% of 11.3 s)
	got = account(rows(s, 3*s/10))
	if math.Abs(got.UnaccountedS-0.3) > 1e-9 {
		t.Errorf("idle gap: %+v", got)
	}
	r.Attempts[0].Time = got
	if v := strings.Join(Invariants(r), "; "); !strings.Contains(v, "0.300 s of its 11.300 s unaccounted") {
		t.Errorf("an unnamed gap in a loop-period job: %q", v)
	}
	// step 8's slowest rank began 0.2 s before step 7 ended (a rank that
	// ended step 7 first waits in step 8 for the slowest): its step time
	// counts past step 7's end, the rest is overlap, nothing goes missing
	steps := rows(s, 0)
	steps[8].StepTimeNs += s / 5
	got = account(steps)
	if got.SpanS != 11 || got.StepsS != 10 || math.Abs(got.OverlapS-0.2) > 1e-9 || got.UnaccountedS != 0 {
		t.Errorf("a step beside the one before: %+v", got)
	}
	r.Attempts[0].Time = got
	if v := Invariants(r); len(v) != 0 {
		t.Errorf("a step beside the one before: %v", v)
	}
	// an older producer's steps (steps unsaid) left the time between them out: not held to it
	r.Meta.Steps = ""
	if v := Invariants(r); len(v) != 0 {
		t.Errorf("steps unsaid: %v", v)
	}
}
