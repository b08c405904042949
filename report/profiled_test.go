package report

import (
	"bytes"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Steps a rank profiled (trace_every: the agent analysed their trace) ran
// twice as slow; they are left out of the step statistics and said so,
// their tokens and time still in wall TPS.
func TestProfiledStepsLeftOut(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "prof")
	cw, err := trace.NewPartWriter[tps.ClusterStep](root, "prof", trace.ClusterSteps, trace.WriterOptions{WriterID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	ew, err := trace.NewPartWriter[tps.Event](root, "prof", trace.Events, trace.WriterOptions{WriterID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	at := t0
	var evs []tps.Event
	for i := range int64(40) {
		d := s
		if i%10 == 5 {
			d = 2 * s // profiled
			evs = append(evs, tps.Event{Job: "prof", Kind: tps.EventTraceAnalysis, Step: i, Rank: 0, StartUnixNs: at + d, EndUnixNs: at + d})
		}
		cw.Write([]tps.ClusterStep{{Job: "prof", Step: i, WorldSize: 1, RanksReported: 1, Replicas: 1, Tokens: 1000,
			StepTimeNs: d, StartUnixNs: at, EndUnixNs: at + d, TPS: 1000 / (float64(d) / 1e9)}})
		at += d
	}
	ew.Write(evs)
	cw.Close()
	ew.Close()
	rep, err := analyzeChecked(dir, Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	sm := rep.Summary
	if sm.ProfiledLeftOut != 4 || sm.SteadySteps != 36 || sm.TPS.Min != 1000 || sm.StepTimeS.Max != 1 {
		t.Errorf("profiled left out %d, steady %d, TPS min %g, step time max %g; want 4, 36, 1000, 1", sm.ProfiledLeftOut, sm.SteadySteps, sm.TPS.Min, sm.StepTimeS.Max)
	}
	if want := 40000 / 44.0; math.Abs(sm.WallTPS-want) > 1e-9 {
		t.Errorf("wall TPS %g, want %g (every step's tokens over the wall time)", sm.WallTPS, want)
	}
	var b bytes.Buffer
	WriteText(&b, rep)
	if !strings.Contains(b.String(), "4 profiled or FLOP-counted (slowed by the profiler or counter) left out of the figures") {
		t.Errorf("the text does not say so:\n%s", b.String())
	}
}

// A clock stepped back an hour mid-run (an NTP correction): the steps
// after the jump are placed after the one before it. Before, wall TPS read
// about a hundredth of the real rate and idle went far past 100%.
func TestClockSteppedBack(t *testing.T) {
	root := t.TempDir()
	cw, err := trace.NewPartWriter[tps.ClusterStep](root, "jump", trace.ClusterSteps, trace.WriterOptions{WriterID: "j"})
	if err != nil {
		t.Fatal(err)
	}
	const s = int64(1e9)
	at := int64(1_760_000_000) * s
	for i := range int64(40) {
		if i == 20 {
			at -= 3600 * s
		}
		cw.Write([]tps.ClusterStep{{Job: "jump", Step: i, WorldSize: 1, RanksReported: 1, Replicas: 1, Tokens: 1000,
			StepTimeNs: s, RankTimeMaxNs: s, StartUnixNs: at, EndUnixNs: at + s, TPS: 1000}})
		at += s
	}
	cw.Close()
	rep, err := analyzeChecked(filepath.Join(root, "jump"), Options{Warmup: 0})
	if err != nil {
		t.Fatal(err)
	}
	g := rep.Goodput
	if math.Abs(g.ElapsedS-40) > 1e-9 || g.BadputS[BadIdle] != 0 || math.Abs(rep.Summary.WallTPS-1000) > 1e-9 {
		t.Errorf("elapsed %g s, idle %g s, wall TPS %g; want 40, 0, 1000", g.ElapsedS, g.BadputS[BadIdle], rep.Summary.WallTPS)
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "stepped back 1 time(s), by up to 1h0m") {
		t.Errorf("notes %q", rep.Notes)
	}
}
