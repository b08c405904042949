package report

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// A selection reports part of a run and reads only the rank-row groups
// that can hold it: 2 attempts of 100 steps × 4 ranks, 10 steps a row
// group. --steps 50:59 of attempt 1 reads one row group of 20 and reports
// those 10 steps alone; --last, --since and an empty selection behave.
func TestSelection(t *testing.T) {
	root := t.TempDir()
	opt := trace.WriterOptions{WriterID: "s", RowsPerGroup: 40}
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, "sel", trace.RankSteps, opt)
	if err != nil {
		t.Fatal(err)
	}
	cluster, _ := trace.NewPartWriter[tps.ClusterStep](root, "sel", trace.ClusterSteps, opt)
	const s = int64(1e9)
	t0 := int64(1_760_000_000) * s
	at := t0
	for a := int64(0); a < 2; a++ {
		for i := int64(0); i < 100; i++ {
			d := s
			if a == 1 && i >= 50 && i < 60 {
				d = 2 * s // the window asked for is slower
			}
			var recs []tps.StepRecord
			for r := int64(0); r < 4; r++ {
				recs = append(recs, tps.StepRecord{Job: "sel", Attempt: a, Step: i, Rank: r, WorldSize: 4, Node: "n0",
					StartUnixNs: at, EndUnixNs: at + d, DurationNs: d, Tokens: 1000})
			}
			ranks.Write(recs)
			cluster.Write([]tps.ClusterStep{{Job: "sel", Attempt: a, Step: i, WorldSize: 4, RanksReported: 4, Replicas: 4, Tokens: 4000,
				StepTimeNs: d, StartUnixNs: at, EndUnixNs: at + d, TPS: 4000 / (float64(d) / 1e9)}})
			at += d
		}
	}
	ranks.Close()
	cluster.Close()
	dir := filepath.Join(root, "sel")
	one := int64(1)
	from, to, err := ParseSteps("50:59")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := analyzeChecked(dir, Options{Warmup: 0, Select: Selection{Attempt: &one, StepFrom: from, StepTo: to}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Steps != 10 || rep.Summary.TPS.Mean != 2000 || rep.Summary.Attempts != 1 {
		t.Errorf("steps %d, TPS %g, attempts %d; want 10 steps at 2000 tokens/s in one attempt", rep.Summary.Steps, rep.Summary.TPS.Mean, rep.Summary.Attempts)
	}
	if rep.RankRows > 80 || rep.RankRows+rep.RankRowsSkipped != 800 {
		t.Errorf("read %d rank rows, skipped %d; want at most two row groups of 40 read of 800", rep.RankRows, rep.RankRowsSkipped)
	}
	if rep.Selection != "attempt 1, steps 50:59" || !strings.Contains(strings.Join(rep.Notes, "\n"), "10 of 200 cluster steps") {
		t.Errorf("selection %q, notes %q", rep.Selection, rep.Notes)
	}
	if g := rep.Goodput; g.ElapsedS != 20 || g.BadputS[BadRestart] != 0 {
		t.Errorf("elapsed %g s, restart %g: want the selection's 20 s", g.ElapsedS, g.BadputS[BadRestart])
	}
	rep, pd, err := analyzeWithPlotsChecked(dir, Options{Warmup: 0, Select: Selection{Last: 5}})
	if err != nil || rep.Summary.Steps != 5 || pd.steps[0].Attempt != 1 || pd.steps[0].Step != 95 {
		t.Errorf("--last 5: %v, %d steps from %+v", err, rep.Summary.Steps, pd.steps[0])
	}
	// the warm-up is the whole run's: a window from mid-attempt has none
	rep, err = analyzeChecked(dir, Options{Warmup: tps.AutoWarmup, Select: Selection{Last: 5}})
	if err != nil || rep.Summary.WarmupSteps != 0 || rep.Summary.SteadySteps != 5 {
		t.Errorf("--last 5 with the automatic warm-up: %v, %d warm-up steps", err, rep.Summary.WarmupSteps)
	}
	since := time.Unix(0, t0+195*s) // 195 s in: attempt 1's steps ending from then, 84 to 99 (the slow window took 10 s more)
	rep, err = analyzeChecked(dir, Options{Warmup: 0, Select: Selection{Since: since}})
	if err != nil || rep.Summary.Steps != 16 {
		t.Errorf("--since: %v, %d steps", err, rep.Summary.Steps)
	}
	big := int64(500)
	if _, err := analyzeChecked(dir, Options{Select: Selection{StepFrom: &big}}); err == nil || !strings.Contains(err.Error(), "holds none of the job's 200 cluster steps") {
		t.Errorf("an empty selection: %v", err)
	}
	for _, bad := range []string{"5", "9:3", ":", "a:b", "-1:4"} {
		if _, _, err := ParseSteps(bad); err == nil {
			t.Errorf("ParseSteps(%q) accepted", bad)
		}
	}
}

// A window of a long run costs what the window holds. Over the last 1% of
// a run of 64 ranks × 10,000 steps (tracetest's jittered rows, 29 B a
// rank row; a row group of 100 steps, as a collector's parts rotated every
// 100 s at a step a second hold), the report reads at most 2% of the bytes
// of the tables it reads, the parts' footers aside, and each footer once:
// the test measures the footers itself (each part's last 8 bytes give its
// footer's length), as they grow with the row groups (100 here, where the
// default row group would make 10 of this run) and not with the window.
// The same holds for 1% from the middle of the run. GPU samples (one a
// second, 100 a row group) are read from the row groups within a minute of
// the selected steps.
func TestSelectionReadsItsShare(t *testing.T) {
	const world, steps = 64, 10_000
	dir, err := tracetest.Write(t.TempDir(), "long", tracetest.Run{World: world, Steps: steps, Jitter: true,
		RankRowsPerGroup: world * 100, ClusterRowsPerGroup: 100})
	if err != nil {
		t.Fatal(err)
	}
	// a GPU sample a second, 100 a row group
	gw, err := trace.NewPartWriter[tps.GPUSample](filepath.Dir(dir), "long", trace.GPUSamples, trace.WriterOptions{WriterID: "g", RowsPerGroup: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i := range int64(steps) {
		util := 90.0
		gw.Write([]tps.GPUSample{{Job: "long", Node: "n", UnixNs: tracetest.T0 + i*1e9, GPUUtilPct: &util}})
	}
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
	var footers, data int64
	for _, table := range []string{trace.ClusterSteps, trace.RankSteps, trace.GPUSamples} {
		files, _ := trace.PartFiles(filepath.Join(dir, table))
		for _, p := range files {
			b, err := os.ReadFile(p)
			if err != nil || len(b) < 12 {
				t.Fatalf("%s: %v", p, err)
			}
			footers += int64(binary.LittleEndian.Uint32(b[len(b)-8:])) + 8
			data += int64(len(b))
		}
	}
	data -= footers
	from, to := int64(steps/2), int64(steps/2+steps/100-1)
	for _, sel := range []Selection{{Last: steps / 100}, {StepFrom: &from, StepTo: &to}} {
		rep, err := analyzeChecked(dir, Options{Warmup: tps.AutoWarmup, Select: sel})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Summary.Steps != steps/100 || rep.RankRows != world*steps/100 || rep.Summary.Tokens != world*4096*steps/100 {
			t.Errorf("%s: %d steps, %d rank rows, %d tokens; want %d, %d, %d", sel, rep.Summary.Steps, rep.RankRows, rep.Summary.Tokens,
				steps/100, world*steps/100, world*4096*steps/100)
		}
		if rep.GPUSamples < steps/100 || rep.GPUSamples > 300 {
			t.Errorf("%s: %d GPU samples read; want the row groups within a minute of the 100 s selected (200)", sel, rep.GPUSamples)
		}
		read := rep.BytesRead - footers
		t.Logf("%s: read %d B of %d (%.2f%%), footers %d B aside", sel, read, data, 100*float64(read)/float64(data), footers)
		if read > data/50 || read <= 0 {
			t.Errorf("%s: read %d B besides the footers, of %d: want at most 2%%", sel, read, data)
		}
	}
	rep, err := analyzeChecked(dir, Options{Warmup: tps.AutoWarmup})
	if err != nil {
		t.Fatal(err)
	}
	if rep.BytesRead < data/2 || rep.BytesRead > rep.BytesInTables || rep.GPUSamples != steps {
		t.Errorf("the whole run: read %d B of %d, %d GPU samples", rep.BytesRead, rep.BytesInTables, rep.GPUSamples)
	}
}

// A selection read from rank_windows reads the row groups that hold its
// windows alone: 8 ranks × 5,000 steps, windows of 100 steps, 80 window
// rows (10 windows of 8 ranks) a row group; --last 250 (steps 4,750-4,999)
// reads the group of windows 40-49 and of it uses windows 47-49, whole
// (window figures cover whole windows: 8 ranks × 300 steps of rank rows).
func TestSelectionFromRankWindows(t *testing.T) {
	root := t.TempDir()
	dir, err := tracetest.Write(root, "w", tracetest.Run{World: 8, Steps: 5000, Windows: true})
	if err != nil {
		t.Fatal(err)
	}
	// rewrite rank_windows in row groups of 400 rows
	wdir := filepath.Join(dir, trace.RankWindows)
	rows, err := trace.ReadAll[tps.RankWindow](wdir)
	if err != nil || len(rows) != 8*50 {
		t.Fatalf("%v: %d window rows", err, len(rows))
	}
	os.RemoveAll(wdir)
	ww, _ := trace.NewPartWriter[tps.RankWindow](root, "w", trace.RankWindows, trace.WriterOptions{WriterID: "w", RowsPerGroup: 80})
	if err := ww.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := ww.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := analyzeChecked(dir, Options{Warmup: 0, RankSource: RankSourceWindows, Select: Selection{Last: 250}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Steps != 250 || rep.RankWindows != 80 || rep.RankRows != 8*300 || rep.RankWindowsLeft != 0 {
		t.Errorf("%d steps, %d window rows read (%d left out), %d rank rows; want 250, one row group of 80 (windows 40-49), the 8 ranks × 300 steps of windows 47-49",
			rep.Summary.Steps, rep.RankWindows, rep.RankWindowsLeft, rep.RankRows)
	}
}

// Cluster rows out of order on disk (a part of the later steps first, as
// parts of several writers can be) are put in order before selecting: the
// last 5 steps are 195-199, and steps 0-9 hold the attempt's first step,
// which the automatic warm-up excludes.
func TestSelectionRowsOutOfOrder(t *testing.T) {
	root := t.TempDir()
	w, _ := trace.NewPartWriter[tps.ClusterStep](root, "o", trace.ClusterSteps, trace.WriterOptions{WriterID: "o"})
	rw, _ := trace.NewPartWriter[tps.StepRecord](root, "o", trace.RankSteps, trace.WriterOptions{WriterID: "o"})
	const s = int64(1e9)
	write := func(from, to int64) {
		for i := from; i < to; i++ {
			at := tracetest.T0 + i*s
			w.Write([]tps.ClusterStep{{Job: "o", Step: i, WorldSize: 1, RanksReported: 1, Replicas: 1, Tokens: 1000,
				StepTimeNs: s, StartUnixNs: at, EndUnixNs: at + s, TPS: 1000}})
			rw.Write([]tps.StepRecord{{Job: "o", Step: i, WorldSize: 1, StartUnixNs: at, EndUnixNs: at + s, DurationNs: s, Tokens: 1000}})
		}
		w.Rotate()
		rw.Rotate()
	}
	write(100, 200)
	write(0, 100)
	w.Close()
	rw.Close()
	dir := filepath.Join(root, "o")
	rep, pd, err := analyzeWithPlotsChecked(dir, Options{Warmup: tps.AutoWarmup, Select: Selection{Last: 5}})
	if err != nil || rep.Summary.Steps != 5 || pd.steps[0].Step != 195 {
		t.Fatalf("--last 5: %v, %d steps from %+v", err, rep.Summary.Steps, pd.steps)
	}
	from, to := int64(0), int64(9)
	rep, pd, err = analyzeWithPlotsChecked(dir, Options{Warmup: tps.AutoWarmup, Select: Selection{StepFrom: &from, StepTo: &to}})
	if err != nil || rep.Summary.Steps != 10 || rep.Summary.WarmupSteps != 1 || pd.steps[0].Step != 0 {
		t.Errorf("--steps 0:9: %v, %d steps, %d warm-up", err, rep.Summary.Steps, rep.Summary.WarmupSteps)
	}
}

// stepAt finds a step among sorted rows, the first of a repeated one, and
// says when it is not there.
func TestStepAt(t *testing.T) {
	steps := []tps.ClusterStep{{Attempt: 0, Step: 3}, {Attempt: 0, Step: 5}, {Attempt: 0, Step: 5}, {Attempt: 1, Step: 0}, {Attempt: 1, Step: 9}}
	for _, c := range []struct {
		k    [2]int64
		i    int
		want bool
	}{{[2]int64{0, 3}, 0, true}, {[2]int64{0, 5}, 1, true}, {[2]int64{1, 0}, 3, true}, {[2]int64{1, 9}, 4, true},
		{[2]int64{0, 4}, 0, false}, {[2]int64{0, 0}, 0, false}, {[2]int64{1, 10}, 0, false}, {[2]int64{2, 0}, 0, false}} {
		if i, ok := spineOf(steps).stepAt(c.k); ok != c.want || (ok && i != c.i) {
			t.Errorf("stepAt(%v) = %d, %v; want %d, %v", c.k, i, ok, c.i, c.want)
		}
	}
}
