package report

import (
	"bytes"
	"encoding/json"
	"flag"
	"image"
	_ "image/png"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// A generated trace with known answers:
//   - 32 ranks: DP 2 × TP 4 × PP 4, 8 GPUs per node, 8 micro-batches, so the
//     pipeline bubble is (p−1)/(m+p−1) = 3/11 of every step;
//   - rank 13 (node-1) computes 1.5× longer: score 1/1.5;
//   - steps 20-39 are communication-heavy: 30% exposed instead of 5%;
//   - attempt 0 runs steps 0-59 and dies; attempt 1 resumes from step 50 and
//     runs to 99, so steps 50-59 of attempt 0 were redone;
//   - the first step of each attempt is a 3× slower warm-up.
const (
	genDP, genTP, genPP, genMicro = 2, 4, 4, 8
	genWorld                      = genDP * genTP * genPP
	genT0                         = int64(1_760_000_000_000_000_000)
	genCompute                    = int64(600e6) // ns of compute per rank per step
	genStraggler                  = 13
)

type genTrace struct {
	dir           string
	attempt1Start int64
	attempt0End   int64
}

func generate(t testing.TB, root string, steps0, steps1 int) genTrace {
	t.Helper()
	topo := tps.Topology{DP: genDP, TP: genTP, PP: genPP}
	meta := tps.RunMeta{Job: "gen", Topology: topo, MicroBatches: genMicro, ModelPreset: "llama3-8b", GPU: "h100-sxm", GPUHourUSD: 2}
	mb, _ := json.Marshal(meta)
	opt := trace.WriterOptions{WriterID: "gen", Metadata: func() map[string]string { return map[string]string{trace.MetaRun: string(mb)} }}
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, "gen", trace.RankSteps, opt)
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "gen", trace.ClusterSteps, opt)
	events, _ := trace.NewPartWriter[tps.Event](root, "gen", trace.Events, opt)
	cfg, err := meta.AccumulatorConfig(genWorld, "")
	if err != nil {
		t.Fatal(err)
	}
	bubble := tps.TheoreticalBubble(genPP, genMicro, 1)
	g := genTrace{dir: filepath.Join(root, "gen")}
	now := genT0
	var evs []tps.Event
	run := func(attempt int64, first, last int) {
		evs = append(evs, tps.Event{Job: "gen", Attempt: attempt, Kind: tps.EventAttemptStart, Rank: -1, StartUnixNs: now, EndUnixNs: now})
		if attempt == 1 {
			g.attempt1Start = now
		}
		now += 20e9 // 20 s of start-up before the first step
		recs := make([]tps.StepRecord, genWorld)
		for s := first; s <= last; s++ {
			exposedFrac := 0.05
			if s >= 20 && s < 40 {
				exposedFrac = 0.30
			}
			warm := 1.0
			if s == first {
				warm = 3
			}
			// The step lasts as long as the straggler's compute plus waits.
			slowest := float64(genCompute) * 1.5 * warm
			d := slowest / (1 - bubble - exposedFrac)
			for r := 0; r < genWorld; r++ {
				comp := float64(genCompute) * warm
				if r == genStraggler {
					comp = slowest
				}
				pp := bubble * d
				exposed := d - comp - pp
				recs[r] = tps.StepRecord{Job: "gen", Attempt: attempt, Step: int64(s), Rank: int64(r), WorldSize: genWorld,
					Node: "node-" + string(rune('0'+r/8)), StartUnixNs: now, EndUnixNs: now + int64(d), DurationNs: int64(d),
					Tokens: genMicro * 8192, PPWaitNs: int64(pp), ExposedCommNs: int64(exposed), CommNs: int64(exposed) + 100e6}
			}
			c, err := tps.Aggregate(recs, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := ranks.Write(recs); err != nil {
				t.Fatal(err)
			}
			cluster.Write([]tps.ClusterStep{c})
			now += int64(d) + 100e6 // 100 ms idle between steps
		}
		if attempt == 0 {
			g.attempt0End = now - 100e6 // the last step's end
			now += 60e9                 // a minute until the relaunch
		} else {
			evs = append(evs, tps.Event{Job: "gen", Attempt: attempt, Kind: tps.EventAttemptEnd, Rank: -1, StartUnixNs: now, EndUnixNs: now})
		}
	}
	run(0, 0, steps0-1)
	run(1, 50, 50+steps1-1)
	events.Write(evs)
	for _, w := range []interface{ Close() error }{ranks, cluster, events} {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

func TestKnownAnswers(t *testing.T) {
	g := generate(t, t.TempDir(), 60, 50)
	rep, pd, err := analyzeWithPlotsChecked(g.dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Summary
	if s.Steps != 110 || s.WarmupSteps != 2 || s.Attempts != 2 {
		t.Errorf("steps %d, warm-up %d, attempts %d; want 110, 2, 2", s.Steps, s.WarmupSteps, s.Attempts)
	}
	// The straggler rank and node, with the right score.
	if len(rep.Stragglers) == 0 || rep.Stragglers[0].Rank != genStraggler || math.Abs(rep.Stragglers[0].Score-1/1.5) > 1e-3 {
		t.Errorf("straggler ranks: %+v, want rank 13 scored 0.667", rep.Stragglers)
	}
	if rep.Nodes[0].Node != "node-1" || !rep.Nodes[0].Straggler || rep.Nodes[1].Straggler {
		t.Errorf("straggler nodes: %+v, want node-1 alone flagged", rep.Nodes)
	}
	// Bubble as theory says; the comm-heavy phase in the breakdown and the fit.
	if want := 3.0 / 11; math.Abs(rep.Breakdown.Bubble-want) > 1e-6 || math.Abs(rep.Breakdown.BubbleTheoretical-want) > 1e-12 {
		t.Errorf("bubble %g (theory %g), want %g", rep.Breakdown.Bubble, rep.Breakdown.BubbleTheoretical, want)
	}
	heavy, light := 0, 0
	for i, c := range pd.steps {
		if pd.warm[i] {
			continue
		}
		if c.Step >= 20 && c.Step < 40 {
			heavy++
		} else {
			light++
		}
	}
	// mean exposed fraction over ranks: the straggler waits only for the
	// common part, the others also for the straggler.
	if rep.Breakdown.ExposedComm <= 0.3*float64(heavy)/float64(heavy+light) {
		t.Errorf("exposed comm %g does not show the heavy phase (%d heavy steps of %d)", rep.Breakdown.ExposedComm, heavy, heavy+light)
	}
	if rep.CommFit.Slope >= 0 || rep.CommFit.R2 < 0.9 {
		t.Errorf("TPS against comm: slope %g R² %g, want clearly negative", rep.CommFit.Slope, rep.CommFit.R2)
	}
	// Goodput: the restart's redone steps, the restart gap and start-ups.
	gp := rep.Goodput
	if gp.RedoneSteps != 10 || gp.Restarts != 1 {
		t.Errorf("redone %d steps over %d restarts, want 10 and 1", gp.RedoneSteps, gp.Restarts)
	}
	// The second attempt is a new launch (a launcher's attempt_start):
	// the minute before it is not the job's time, so not badput.
	if got, want := gp.BetweenLaunchesS, float64(g.attempt1Start-g.attempt0End)/1e9; math.Abs(got-want) > 1e-6 || gp.BadputS[BadRestart] != 0 || gp.Launches != 1 {
		t.Errorf("between launches %g s (restart badput %g s, %d launches), want %g, 0 and 1", got, gp.BadputS[BadRestart], gp.Launches, want)
	}
	if got := gp.BadputS[BadStartup]; math.Abs(got-40) > 1e-6 {
		t.Errorf("start-up badput %g s, want 40 (20 s per attempt)", got)
	}
	var sum float64
	for _, v := range gp.BadputS {
		sum += v
	}
	if math.Abs(sum+gp.ProductiveS-gp.ElapsedS) > 1e-3 {
		t.Errorf("productive %g + badput %g != elapsed %g", gp.ProductiveS, sum, gp.ElapsedS)
	}
	if rep.RankRows != 110*genWorld {
		t.Errorf("rank rows %d", rep.RankRows)
	}
}

func TestGoldenSummaries(t *testing.T) {
	g := generate(t, t.TempDir(), 60, 50)
	rep, err := analyzeChecked(g.dir, Options{Warmup: tps.AutoWarmup, TrainTokens: 1e12})
	if err != nil {
		t.Fatal(err)
	}
	rep.Dir = "OUT/gen" // the temporary folder differs per run
	var text, md, js bytes.Buffer
	WriteText(&text, rep)
	WriteMarkdown(&md, rep)
	enc := json.NewEncoder(&js)
	enc.SetIndent("", "  ")
	enc.Encode(rep)
	checkGolden(t, map[string][]byte{"summary.txt": text.Bytes(), "summary.md": md.Bytes(), "summary.json": js.Bytes()})
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var a, c string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			c = g[i]
		}
		if a != c {
			b.WriteString("- " + a + "\n+ " + c + "\n")
		}
	}
	return b.String()
}

func TestPlots(t *testing.T) {
	g := generate(t, t.TempDir(), 60, 50)
	rep, pd, err := analyzeWithPlotsChecked(g.dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	figs, err := pd.Figures(rep)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range figs {
		names[f.Name] = true
	}
	for _, want := range []string{"tps_comm", "tps_vs_comm", "breakdown", "rank_heatmap", "mfu"} {
		if !names[want] {
			t.Errorf("no %s plot", want)
		}
	}
	if names["gpu"] {
		t.Error("a GPU plot without GPU samples")
	}
	out := t.TempDir()
	paths, err := SaveFigures(figs, out)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(p, ".svg") {
			if !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("@font-face")) || len(b) < 10_000 {
				t.Errorf("%s: not an SVG with embedded fonts (%d bytes)", p, len(b))
			}
			continue
		}
		img, _, err := image.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if bb := img.Bounds(); bb.Dx() < 600 || bb.Dy() < 300 {
			t.Errorf("%s: %v is too small", p, bb)
		}
		// non-blank: many distinct colours
		colours := map[[4]uint32]bool{}
		for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 3 {
			for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 3 {
				r, g, b, a := img.At(x, y).RGBA()
				colours[[4]uint32{r, g, b, a}] = true
			}
		}
		if len(colours) < 8 {
			t.Errorf("%s: only %d colours: blank?", p, len(colours))
		}
	}
}

func TestAnalyzeErrors(t *testing.T) {
	if _, err := analyzeChecked(filepath.Join(t.TempDir(), "nope"), Options{}); err == nil {
		t.Error("missing folder accepted")
	}
	if _, err := analyzeChecked(t.TempDir(), Options{}); err == nil || !strings.Contains(err.Error(), "no cluster steps") {
		t.Errorf("empty folder: %v", err)
	}
}

// BenchmarkReport10M reports over 10 million rank_steps rows (64 ranks ×
// 156,250 steps) and reports rows/s.
//
//	go test -run '^$' -bench Report10M -benchtime 1x ./report/
func BenchmarkReport10M(b *testing.B) {
	root := b.TempDir()
	dir := generateLarge(b, root, 64, 156_250)
	// The report's own peak: the live heap sampled every 100 ms while it
	// runs, after the generation's garbage is collected.
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				if ms.HeapInuse > peak.Load() {
					peak.Store(ms.HeapInuse)
				}
			}
		}
	}()
	b.ResetTimer()
	for b.Loop() {
		rep, err := Analyze(dir, Options{Warmup: tps.AutoWarmup})
		if err != nil {
			b.Fatal(err)
		}
		if rep.RankRows != 10_000_000 {
			b.Fatalf("rows %d", rep.RankRows)
		}
	}
	close(stop)
	b.ReportMetric(10e6*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(peak.Load())/(1<<20), "peak_heap_MiB")
	b.ReportMetric(float64(base.HeapInuse)/(1<<20), "heap_before_MiB")
}

func generateLarge(b *testing.B, root string, world, steps int) string {
	dir, err := tracetest.WriteRun(root, "big", world, steps)
	if err != nil {
		b.Fatal(err)
	}
	return dir
}

// The per-rank median reservoirs are bounded in total: 1,024 values each
// up to 16,384 ranks, fewer beyond, never under 64.
func TestMedianKeepBounded(t *testing.T) {
	for _, tc := range []struct {
		world int64
		keep  int
	}{{0, 1024}, {64, 1024}, {16384, 1024}, {32768, 512}, {131072, 128}, {1 << 20, 64}} {
		if got := medianKeepFor(tc.world); got != tc.keep {
			t.Errorf("world %d: keep %d, want %d", tc.world, got, tc.keep)
		}
		if tc.world >= 16384 && tc.world <= 1<<18 && int64(medianKeepFor(tc.world))*tc.world > medianBudget {
			t.Errorf("world %d: %d values in all, over the budget", tc.world, int64(medianKeepFor(tc.world))*tc.world)
		}
	}
}

// --compare in text, JSON and Markdown, against golden files: run B has
// twice the tokens per step, twice the world and an unknown MFU; fractions
// differ in points, rates in percent, and the unknown MFU reads n/a (null
// in JSON), never 0.
func TestGoldenCompare(t *testing.T) {
	g := generate(t, t.TempDir(), 60, 50)
	a, err := analyzeChecked(g.dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := analyzeChecked(g.dir, Options{Warmup: tps.AutoWarmup})
	b.Job = "gen-b"
	b.Summary.WorldSize *= 2
	b.Summary.Tokens *= 2
	b.Summary.AggregateTPS *= 1.5
	b.Summary.TPSPerGPU *= 0.75
	b.Summary.MFU, b.Summary.HFU, b.Summary.MFUSteps = nil, nil, 0
	b.Summary.MFUUnknown = "the run's topology dp=2 tp=2 pp=2 is 8 GPUs but the ranks report a world of 16"
	b.Breakdown.ExposedComm = a.Breakdown.ExposedComm / 2
	var text, md, js bytes.Buffer
	WriteCompare(&text, a, b)
	WriteCompareMarkdown(&md, a, b)
	enc := json.NewEncoder(&js)
	enc.SetIndent("", "  ")
	enc.Encode(Compare(a, b))
	for _, must := range []string{"n/a", " pt", "different world sizes", "different tokens per step", "MFU of gen-b is unknown"} {
		if !strings.Contains(text.String(), must) {
			t.Errorf("compare text lacks %q:\n%s", must, text.String())
		}
	}
	for _, r := range Compare(a, b).Rows {
		if (r.Name == "MFU" || r.Name == "HFU") && (r.B != nil || r.DeltaPoints != nil) {
			t.Errorf("unknown %s given a value: %+v", r.Name, r)
		}
	}
	checkGolden(t, map[string][]byte{"compare.txt": text.Bytes(), "compare.md": md.Bytes(), "compare.json": js.Bytes()})
}

// checkGolden compares outputs with testdata/NAME.golden (-update rewrites them).
func checkGolden(t *testing.T, outputs map[string][]byte) {
	t.Helper()
	for name, got := range outputs {
		path := filepath.Join("testdata", name+".golden")
		if *update {
			os.WriteFile(path, got, 0o644)
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update to create it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s (run go test ./report -update after checking):\n%s", name, path, lineDiff(string(want), string(got)))
		}
	}
}

// A job that declared no layout is not "dp=1 tp=1 pp=1" on the run line
// while its cluster rows count every rank a replica.
func TestLayoutText(t *testing.T) {
	if got := LayoutText(tps.RunMeta{}, 2); got != "no layout declared (every rank a data-parallel replica: dp=2)" {
		t.Errorf("%q", got)
	}
	if got := LayoutText(tps.RunMeta{Topology: tps.Topology{DP: 2, TP: 4}}, 8); got != "dp=2 tp=4 pp=1 cp=1 ep=1" {
		t.Errorf("%q", got)
	}
}
