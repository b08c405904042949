package report

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// simulateCheckpoints runs a job that checkpoints every tau seconds of work
// (each save c seconds) through interruptions at the given times (sorted):
// an interruption loses the work since the last completed save, and the
// job restarts at once. It returns the fraction of the time spent on work
// that was kept.
func simulateCheckpoints(tau, c float64, failures []float64, horizon float64) float64 {
	var t, kept float64
	next := 0
	for t < horizon {
		end := t + tau + c // a segment of work, then its save
		for next < len(failures) && failures[next] <= t {
			next++
		}
		if next < len(failures) && failures[next] < end {
			t = failures[next] // the segment is lost
			next++
			continue
		}
		t = end
		kept += tau
	}
	return kept / t
}

// The advice against a discrete-event simulation of the same interruption
// rate and save time: Llama 3's rate (an interruption every 3.1 h: 419 in
// 54 days, Meta's "The Llama 3 Herd of Models", 2024) and a 60 s save.
// Young's interval, 19.3 min, lies within 10% of the interval the
// simulation finds best (a parabola through its best points, in log τ, the
// interruptions the same for every interval), and the goodput it gains
// over hourly checkpoints is the simulation's within a point.
func TestCheckpointAdviceAgainstSimulation(t *testing.T) {
	const c, m = 60.0, 3.1 * 3600
	young := YoungInterval(c, m)
	if math.Abs(young/60-19.3) > 0.05 || math.Abs(100*CheckpointWaste(young, c, m)-10.4) > 0.05 || math.Abs(100*CheckpointWaste(3600, c, m)-17.8) > 0.05 {
		t.Fatalf("Young %v s, waste %.2f%% there and %.2f%% hourly (want 19.3 min, 10.4%%, 17.8%%)", young, 100*CheckpointWaste(young, c, m), 100*CheckpointWaste(3600, c, m))
	}
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 99))
		horizon := 4000 * m
		var failures []float64
		for x := rng.ExpFloat64() * m; x < horizon; x += rng.ExpFloat64() * m {
			failures = append(failures, x)
		}
		type point struct{ logTau, useful float64 }
		var pts []point
		best := point{useful: -1}
		for lt := math.Log(young / 3); lt < math.Log(3*young); lt += 0.02 {
			p := point{lt, simulateCheckpoints(math.Exp(lt), c, failures, horizon)}
			pts = append(pts, p)
			if p.useful > best.useful {
				best = p
			}
		}
		// a parabola through the points near the best (least squares)
		var s [5]float64
		var sy [3]float64
		for _, p := range pts {
			if math.Abs(p.logTau-best.logTau) > 0.5 {
				continue
			}
			x := p.logTau - best.logTau
			for k := range 5 {
				s[k] += math.Pow(x, float64(k))
			}
			for k := range 3 {
				sy[k] += math.Pow(x, float64(k)) * p.useful
			}
		}
		// normal equations for y = a + b x + q x²
		mat := [3][4]float64{{s[0], s[1], s[2], sy[0]}, {s[1], s[2], s[3], sy[1]}, {s[2], s[3], s[4], sy[2]}}
		for i := range 3 {
			for j := range 3 {
				if j != i {
					f := mat[j][i] / mat[i][i]
					for k := range 4 {
						mat[j][k] -= f * mat[i][k]
					}
				}
			}
		}
		b, q := mat[1][3]/mat[1][1], mat[2][3]/mat[2][2]
		opt := math.Exp(best.logTau - b/(2*q))
		if math.Abs(young-opt) > 0.1*opt {
			t.Errorf("seed %d: Young's %.0f s against the simulation's best %.0f s", seed, young, opt)
		}
		simGain := 100 * (simulateCheckpoints(young, c, failures, horizon) - simulateCheckpoints(3600, c, failures, horizon))
		advGain := 100 * (CheckpointWaste(3600, c, m) - CheckpointWaste(young, c, m))
		if math.Abs(simGain-advGain) > 1 {
			t.Errorf("seed %d: the advice gains %.1f points over hourly saves, the simulation %.1f", seed, advGain, simGain)
		}
		t.Logf("seed %d: simulated best %.0f s (Young %.0f s); gain over hourly %.1f points simulated, %.1f advised", seed, opt, young, simGain, advGain)
	}
}

// The report's advice from a run's own saves and interruptions: three
// attempts (two crashed), saves of 60 s every hour; and absent, with why,
// without an interruption.
func TestCheckpointAdviceFromTheRun(t *testing.T) {
	crash, ok := int64(1), int64(0)
	hour := int64(3600e9)
	var events []tps.Event
	for i := range int64(9) {
		at := i / 3
		start := int64(1.7e18) + i*hour
		for r := range int64(2) {
			events = append(events, tps.Event{Kind: tps.EventCheckpointSave, Attempt: at, Step: 100 * i, Rank: r, StartUnixNs: start, EndUnixNs: start + 60e9 + r*1e9})
		}
	}
	rep := &Report{Goodput: Goodput{ElapsedS: 9.3 * 3600}, Attempts: []AttemptRow{{Attempt: 0, ExitCode: &crash}, {Attempt: 1}, {Attempt: 2, ExitCode: &ok}}}
	rep.checkpointAdvice(events)
	a := rep.Checkpoint
	if a.Unknown != "" || a.Saves != 9 || a.SaveS != 61 || a.IntervalS != 3600 || a.Interruptions != 2 || math.Abs(a.MTBFS-9.3*3600/2) > 1e-6 {
		t.Fatalf("advice %+v", a)
	}
	if want := YoungInterval(61, 9.3*3600/2); a.OptimalS != want || a.GainPoints <= 0 {
		t.Errorf("advice %+v, want every %.0f s", a, want)
	}
	if txt := CheckpointText(a); !strings.Contains(txt, "instead of 1h0m") {
		t.Errorf("%q", txt)
	}
	rep.Attempts = []AttemptRow{{Attempt: 0, ExitCode: &ok}}
	rep.checkpointAdvice(events)
	if a := rep.Checkpoint; !strings.Contains(a.Unknown, "no interruption") || a.Saves != 9 {
		t.Errorf("without an interruption: %+v", a)
	}
}

// A run with no interruption of its own pools the fleet's: the other jobs
// of its output folder (their attempt events). x: attempt 0 crashed after
// 2 h, attempt 1 ran 3 h; y: attempt 0 killed after 1 h, attempt 1
// recorded no end before attempt 2 (an interruption, its time unknown),
// attempt 2 ran 2 h. 3 interruptions in 8 h, with this run's 2 h: one
// every 3 h 20 min.
func TestCheckpointAdviceFromTheFleet(t *testing.T) {
	out := t.TempDir()
	hour := int64(3600e9)
	t0 := int64(1.7e18)
	attempt := func(a, start, end, exit int64, ended bool) []tps.Event {
		ev := []tps.Event{{Kind: tps.EventAttemptStart, Attempt: a, Rank: -1, StartUnixNs: t0 + start*hour, EndUnixNs: t0 + start*hour}}
		if ended {
			ev = append(ev, tps.Event{Kind: tps.EventAttemptEnd, Attempt: a, Rank: -1, StartUnixNs: t0 + end*hour, EndUnixNs: t0 + end*hour, ExitCode: exit})
		}
		return ev
	}
	for job, evs := range map[string][][]tps.Event{
		"x": {attempt(0, 0, 2, 1, true), attempt(1, 2, 5, 0, true)},
		"y": {attempt(0, 0, 1, 137, true), attempt(1, 1, 0, 0, false), attempt(2, 3, 5, 0, true)},
	} {
		w, err := trace.NewPartWriter[tps.Event](out, job, trace.Events, trace.WriterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			for i := range e {
				e[i].Job = job
			}
			w.Write(e)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Join(out, job, trace.ClusterSteps), 0o755)
	}
	self := filepath.Join(out, "run")
	os.MkdirAll(filepath.Join(self, trace.ClusterSteps), 0o755)
	ok := int64(0)
	var events []tps.Event
	for i := range int64(4) {
		start := t0 + i*hour/2
		events = append(events, tps.Event{Kind: tps.EventCheckpointSave, Step: 10 * i, StartUnixNs: start, EndUnixNs: start + 30e9})
	}
	rep := &Report{Dir: self, Goodput: Goodput{ElapsedS: 2 * 3600}, Attempts: []AttemptRow{{Attempt: 0, ExitCode: &ok}}}
	rep.checkpointAdvice(events)
	a := rep.Checkpoint
	if a.Unknown != "" || a.FleetJobs != 2 || a.FleetInterruptions != 3 || a.FleetElapsedS != 8*3600 || math.Abs(a.MTBFS-10*3600/3.0) > 1e-6 {
		t.Fatalf("advice %+v", a)
	}
	if txt := CheckpointText(a); !strings.Contains(txt, "3 in 10h0m0s of this run and 2 other jobs of its folder") {
		t.Errorf("%q", txt)
	}
	// alone in its folder: no rate
	rep.Dir = filepath.Join(t.TempDir(), "run")
	rep.checkpointAdvice(events)
	if !strings.Contains(rep.Checkpoint.Unknown, "no interruption") {
		t.Errorf("alone: %+v", rep.Checkpoint)
	}
}

// Degenerate inputs get no advice, and say why (they printed "+Inf
// points", "every 949ms instead of -1s", a 227,184-hour save, "waste
// 100.0% now"): a save longer than the run, a save not well below the
// interruption interval, saves that took no time.
func TestCheckpointAdviceDegenerate(t *testing.T) {
	crash := int64(1)
	crashes := []AttemptRow{{Attempt: 0, ExitCode: &crash}, {Attempt: 1, ExitCode: &crash}, {Attempt: 2}}
	save := func(attempt, step, start, length int64) tps.Event {
		return tps.Event{Kind: tps.EventCheckpointSave, Attempt: attempt, Step: step, StartUnixNs: start, EndUnixNs: start + length}
	}
	t0 := int64(1.7e18)
	for name, c := range map[string]struct {
		elapsed float64
		events  []tps.Event
		want    string
	}{
		"a save longer than the run":              {600, []tps.Event{save(0, 1, t0, 818e15)}, "longer than the run"},
		"a save near the interruptions' interval": {3600, []tps.Event{save(0, 1, t0, 600e9), save(0, 2, t0+1000e9, 600e9)}, "well below"},
		"saves at one instant":                    {3600, []tps.Event{save(0, 1, t0, 1), save(0, 2, t0, 1)}, "not positive"},
	} {
		rep := &Report{Goodput: Goodput{ElapsedS: c.elapsed}, Attempts: crashes}
		rep.checkpointAdvice(c.events)
		a := rep.Checkpoint
		txt := CheckpointText(a)
		if !strings.Contains(a.Unknown, c.want) || a.GainPoints != 0 || strings.Contains(txt, "Inf") || strings.Contains(txt, "NaN") {
			t.Errorf("%s: %+v: %q", name, a, txt)
		}
	}
}
