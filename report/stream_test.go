package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// Every report this package's tests make (analyzeChecked) is made a
// second time with the cluster rows streamed three steps at a time, and
// the two must be the same, byte for byte in JSON, but for the bytes read
// (the streamed one reads the spine, then the rows, then the episodes'
// rows again); and it must hold the invariants (what people read first
// is true). Every fixture of every test is so a case of the streamed
// pass. The findings fail the run (TestMain).
var (
	streamMu    sync.Mutex
	streamDiffs []string
	streamRuns  int
)

func TestMain(m *testing.M) {
	code := m.Run()
	if len(streamDiffs) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d findings over %d reports (streamed reports that differ from the held ones, invariants that do not hold):\n%s\n", len(streamDiffs), streamRuns, strings.Join(streamDiffs, "\n"))
		code = 1
	}
	os.Exit(code)
}

// checkStreamed records what differs between held, the report of dir,
// and streamed, the same report streamed (err its error), and the
// invariants held does not hold.
func checkStreamed(dir string, held, streamed *Report, err error) {
	streamMu.Lock()
	defer streamMu.Unlock()
	streamRuns++
	for _, v := range Invariants(held) {
		streamDiffs = append(streamDiffs, fmt.Sprintf("%s: invariant: %s", dir, v))
	}
	if err != nil {
		streamDiffs = append(streamDiffs, fmt.Sprintf("%s: streamed: %v", dir, err))
		return
	}
	if d := reportDiff(held, streamed); d != "" {
		streamDiffs = append(streamDiffs, fmt.Sprintf("%s: held and streamed reports differ:\n%s", dir, d))
	}
}

// reportDiff is the lines that differ between two reports' JSON, bytes
// read aside ("" when none).
func reportDiff(a, b *Report) string {
	ja, jb := reportJSON(a), reportJSON(b)
	if ja == jb {
		return ""
	}
	return lineDiff(ja, jb)
}

func reportJSON(r *Report) string {
	c := *r
	c.BytesRead = 0
	out, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// A run longer than a chunk is streamed (Analyze and AnalyzeWithPlots
// alike): 5 chunks of cluster rows, two attempts (the second resuming
// 1,000 steps back), rank_steps as the per-rank source. The reports and
// what the plots draw are those of the run held whole (the peak heaps are
// logged; BenchmarkReportLongRun measures memory).
func TestStreamedReportEqualsInMemory(t *testing.T) {
	root := t.TempDir()
	dir, err := tracetest.Write(root, "s", tracetest.Run{World: 4, Steps: 10_000, Jitter: true, ClusterRowsPerGroup: 1000, Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	run := func(chunk int) (rep *Report, pd *Plots, peak uint64) {
		old := clusterChunk
		clusterChunk = chunk
		defer func() { clusterChunk = old }()
		peak = heapPeak(func() { rep, pd, err = AnalyzeWithPlots(dir, Options{Warmup: tps.AutoWarmup}) })
		if err != nil {
			t.Fatal(err)
		}
		return rep, pd, peak
	}
	held, heldPlots, heldPeak := run(1 << 30)
	streamed, streamedPlots, _ := run(4096)
	if d := reportDiff(held, streamed); d != "" {
		t.Fatalf("held and streamed reports differ:\n%s", d)
	}
	if !reflect.DeepEqual(heldPlots.steps, streamedPlots.steps) || !reflect.DeepEqual(heldPlots.warm, streamedPlots.warm) || len(heldPlots.steps) != 20_000 {
		t.Fatalf("the plots' steps differ (%d held, %d streamed)", len(heldPlots.steps), len(streamedPlots.steps))
	}
	if held.Summary.Steps != 20_000 || held.Summary.Attempts != 2 || held.Goodput.RedoneSteps == 0 {
		t.Fatalf("fixture: %d steps, %d attempts, %d redone; want 20,000, 2 and some", held.Summary.Steps, held.Summary.Attempts, held.Goodput.RedoneSteps)
	}
	old := clusterChunk
	clusterChunk = 4096
	var streamedPeak uint64
	streamedPeak = heapPeak(func() { streamed, err = analyze1(dir, Options{Warmup: tps.AutoWarmup}) })
	clusterChunk = old
	if err != nil || reportDiff(held, streamed) != "" {
		t.Fatalf("Analyze streamed: %v, or a report unlike the held one", err)
	}
	t.Logf("peak live heap: held with plots %.1f MiB, streamed without %.1f MiB", float64(heldPeak)/(1<<20), float64(streamedPeak)/(1<<20))
}

// analyze1 is Analyze without the second, checking run.
func analyze1(dir string, opt Options) (*Report, error) {
	rep, _, err := analyze(dir, opt, false)
	return rep, err
}

// An evaluation reported by a rank of a node whose clock runs 2 s ahead is
// placed on the rows' clock whether the event names its node (as an agent
// does, known before the cluster pass) or not (its rank's node, known
// after the rank pass): 10 s of evaluation between steps 4 and 5, both
// ways, held and streamed.
func TestEventsAlignedWithoutTheirNode(t *testing.T) {
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	for _, named := range []bool{true, false} {
		root := t.TempDir()
		opt := trace.WriterOptions{WriterID: "w", Metadata: func() map[string]string {
			return map[string]string{trace.MetaClockOffsets: `{"b":2000000000}`}
		}}
		ranks, err := trace.NewPartWriter[tps.StepRecord](root, "j", trace.RankSteps, opt)
		if err != nil {
			t.Fatal(err)
		}
		cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "j", trace.ClusterSteps, opt)
		events, _ := trace.NewPartWriter[tps.Event](root, "j", trace.Events, opt)
		at := t0
		for i := range int64(10) {
			if i == 5 {
				at += 10 * s // the evaluation
			}
			recs := []tps.StepRecord{{Job: "j", Step: i, Rank: 0, WorldSize: 2, Node: "a", StartUnixNs: at, EndUnixNs: at + s, DurationNs: s, Tokens: 100},
				{Job: "j", Step: i, Rank: 1, WorldSize: 2, Node: "b", StartUnixNs: at, EndUnixNs: at + s, DurationNs: s, Tokens: 100}}
			c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
			if err != nil {
				t.Fatal(err)
			}
			ranks.Write(recs)
			cluster.Write([]tps.ClusterStep{c})
			at += s
		}
		ev := tps.Event{Job: "j", Kind: tps.EventEval, Rank: 1, Step: 4, StartUnixNs: t0 + 5*s + 2*s, EndUnixNs: t0 + 15*s + 2*s}
		if named {
			ev.Node = "b"
		}
		events.Write([]tps.Event{ev})
		for _, w := range []interface{ Close() error }{ranks, cluster, events} {
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
		}
		dir := filepath.Join(root, "j")
		held, err := analyzeChecked(dir, Options{Warmup: 0})
		if err != nil {
			t.Fatal(err)
		}
		streamed, err := analyze1(dir, Options{Warmup: 0, chunk: 3})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []*Report{held, streamed} {
			if e := r.Goodput.BadputS[BadEval]; math.Abs(e-10) > 1e-9 || r.Goodput.BadputS[BadIdle] > 1e-9 {
				t.Errorf("node named %v: evaluation %g s, idle %g s; want 10 and 0", named, e, r.Goodput.BadputS[BadIdle])
			}
		}
	}
}

// Cluster rows out of order across parts (two writers, one with the even
// steps, one with the odd, the second's parts first) and a step written
// twice: the streamed chunks read by key ranges, sort, and keep the
// duplicate where the held rows have it.
func TestStreamedRowsOutOfOrder(t *testing.T) {
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	root := t.TempDir()
	w := map[string]*trace.PartWriter[tps.ClusterStep]{}
	for _, id := range []string{"b-odd", "a-even"} {
		cw, err := trace.NewPartWriter[tps.ClusterStep](root, "o", trace.ClusterSteps, trace.WriterOptions{WriterID: id, RowsPerGroup: 7})
		if err != nil {
			t.Fatal(err)
		}
		w[id] = cw
	}
	for i := range int64(200) {
		id := "a-even"
		if i%2 == 1 {
			id = "b-odd"
		}
		d := s + (i%13)*s/100
		c := tps.ClusterStep{Job: "o", Attempt: i / 120, Step: i, WorldSize: 1, RanksReported: 1, Replicas: 1, Tokens: 1000 + i,
			StepTimeNs: d, RankTimeMaxNs: d, StartUnixNs: t0 + i*2*s, EndUnixNs: t0 + i*2*s + d, TPS: float64(1000+i) / (float64(d) / 1e9)}
		w[id].Write([]tps.ClusterStep{c})
		if i == 77 {
			c.Tokens, c.TPS = 5, 5 // written again by the other writer
			w["a-even"].Write([]tps.ClusterStep{c})
		}
	}
	for _, cw := range w {
		if err := cw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "o")
	held, _, err := analyzeWithPlotsChecked(dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{1, 3, 50} {
		streamed, err := analyze1(dir, Options{Warmup: tps.AutoWarmup, chunk: chunk})
		if err != nil {
			t.Fatal(err)
		}
		if d := reportDiff(held, streamed); d != "" {
			t.Fatalf("chunks of %d: held and streamed reports differ:\n%s", chunk, d)
		}
	}
	if held.Summary.Steps != 201 || held.Summary.Attempts != 2 {
		t.Fatalf("%d steps in %d attempts; want 201 in 2", held.Summary.Steps, held.Summary.Attempts)
	}
}

// The energy join over a streamed run is the held one's, chunk by chunk:
// 4 ranks × 2 attempts of 500 steps (a minute between them), each GPU
// read every second at a constant 400 W with its energy counter, 16
// readings (4 s) a row group. Analyze joins the samples 64 Ki steps at a
// time (one chunk here), TestMain's second run 50 at a time (20 chunks,
// each reading the row groups of its own time and the gap margins: the
// reports differ when the margins are left out) and the two reports must
// match. Tokens per
// joule are 4,096 tokens over 400 J a second for each rank's 0.9 s step
// time; every sample is in the GPU series once.
func TestEnergyJoinStreamed(t *testing.T) {
	const world, steps, watts = 4, 500, 400.0
	root := t.TempDir()
	dir, err := tracetest.Write(root, "e", tracetest.Run{World: world, Steps: steps, Jitter: true, Attempts: 2, ClusterRowsPerGroup: 100, Watts: watts})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := trace.NewPartWriter[tps.GPUSample](root, "e", trace.GPUSamples, trace.WriterOptions{WriterID: "g", RowsPerGroup: 16})
	if err != nil {
		t.Fatal(err)
	}
	written := 0
	for s := int64(-5); s < 2*steps+70; s++ { // from before the first step to after the last, through the gap
		at := tracetest.T0 + s*1e9 + 5e8
		for g := range world {
			mj, w := int64(watts*float64(at-tracetest.T0+1e12)/1e6), watts
			if err := gw.Write([]tps.GPUSample{{Job: "e", Node: "n", UUID: fmt.Sprintf("GPU-%d", g), Index: int32(g), UnixNs: at, EnergyMJ: &mj, PowerW: &w}}); err != nil {
				t.Fatal(err)
			}
			written++
		}
	}
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := analyzeChecked(dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Energy == nil || !rep.Energy.FromSamples || rep.Energy.Steps < rep.Summary.SteadySteps*9/10 {
		t.Fatalf("energy %+v over %d steady steps: want it from the samples, over nearly all", rep.Energy, rep.Summary.SteadySteps)
	}
	want := 4096 / (watts * 0.9)
	if got := rep.Energy.TokensPerJoule; math.Abs(got/want-1) > 0.03 {
		t.Errorf("%.4f tokens/J, want %.4f within 3%%", got, want)
	}
	if rep.GPUSamples != int64(written) {
		t.Errorf("%d GPU samples in the series, %d written: want each once", rep.GPUSamples, written)
	}
}

// The rank pass runs beside the cluster pass with the world size and the
// critical ranks the spine read; where those differ from the rows the
// cluster pass reads (parts rewritten between the reads: here the spine
// is altered), the rank rows are read again and the report is the one
// the rows give (and its heatmap of ranks, the world size's), on the
// held path and the streamed one.
func TestRankRowsReadAgainWhenSpineDiffers(t *testing.T) {
	dir, err := tracetest.Write(t.TempDir(), "s", tracetest.Run{World: 8, Steps: 3000, Jitter: true, ClusterRowsPerGroup: 500, Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{0, 700} {
		want, wantPlots, err := analyze(dir, Options{Warmup: tps.AutoWarmup, chunk: chunk}, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(want.WaitCharged) == 0 {
			t.Fatalf("fixture: no waiting charged to a rank")
		}
		for _, spoil := range []struct {
			name string
			fn   func(*spine)
		}{
			{"world", func(sp *spine) { sp.world = 3 }},
			{"critical ranks", func(sp *spine) {
				for i := range sp.slowest {
					sp.slowest[i] = (sp.slowest[i] + 1) % 8
				}
			}},
		} {
			before := rankRowsAgain.Load()
			spineRead = spoil.fn
			got, gotPlots, err := analyze(dir, Options{Warmup: tps.AutoWarmup, chunk: chunk}, true)
			spineRead = nil
			if err != nil {
				t.Fatal(err)
			}
			if rankRowsAgain.Load() != before+1 {
				t.Fatalf("chunk %d, %s altered: the rank rows were read again %d times, want once", chunk, spoil.name, rankRowsAgain.Load()-before)
			}
			if d := reportDiff(want, got); d != "" {
				t.Fatalf("chunk %d, %s altered: the report differs:\n%s", chunk, spoil.name, d)
			}
			if !reflect.DeepEqual(wantPlots.heat, gotPlots.heat) {
				t.Fatalf("chunk %d, %s altered: the heatmap differs", chunk, spoil.name)
			}
		}
	}
}
