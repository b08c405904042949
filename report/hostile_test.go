package report

import (
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// lieRows rewrites a part's footer so that it and its row groups claim
// rows rows (tracetest.LieRows).
func lieRows(t *testing.T, path string, rows int64) {
	t.Helper()
	if err := tracetest.LieRows(path, rows, false); err != nil {
		t.Fatal(err)
	}
}

// Hostile Parquet: a cluster_steps part and a rank_steps part whose
// footers claim 10^9 rows (the report allocated 8 GB for one column and
// was OOM-killed even with 10 GiB) are named and skipped, the report
// made of the other parts, in bounded memory.
func TestLyingFootersSkipped(t *testing.T) {
	dir, err := tracetest.Write(t.TempDir(), "lie", tracetest.Run{World: 4, Steps: 200, ClusterRowsPerPart: 50, RankRowsPerPart: 200})
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := trace.PartFiles(filepath.Join(dir, trace.ClusterSteps))
	rk, _ := trace.PartFiles(filepath.Join(dir, trace.RankSteps))
	if len(cl) != 4 || len(rk) != 4 {
		t.Fatalf("%d cluster parts and %d rank parts, want 4 each", len(cl), len(rk))
	}
	lieRows(t, cl[1], 1e9)
	lieRows(t, rk[2], 1e9)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rep, err := analyzeChecked(dir, Options{Warmup: 1})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("the report stopped at a lying footer: %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 512<<20 {
		t.Errorf("the report allocated %d MiB", grew>>20)
	}
	if rep.Summary.Steps != 150 {
		t.Errorf("%d steps, want the 150 of the readable cluster parts", rep.Summary.Steps)
	}
	notes := strings.Join(rep.Notes, "\n")
	for _, p := range []string{filepath.Base(cl[1]), filepath.Base(rk[2])} {
		if !strings.Contains(notes, p) {
			t.Errorf("the skipped part %s is not named: %v", p, rep.Notes)
		}
	}
}

// Hostile rank_windows sketches (offsets 2^32 apart, which panicked with
// "makeslice: len out of range" or asked for 12 GB) make a report in
// bounded memory.
func TestHostileWindowSketches(t *testing.T) {
	root := t.TempDir()
	dir, err := tracetest.Write(root, "win", tracetest.Run{World: 2, Steps: 200, Windows: true})
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.NewPartWriter[tps.RankWindow](root, "win", trace.RankWindows, trace.WriterOptions{WriterID: "hostile"})
	if err != nil {
		t.Fatal(err)
	}
	far := func(off int32) []byte {
		return []byte(`{"count":1,"sum":1,"min":1,"max":1,"offset":` + strconv.FormatInt(int64(off), 10) + `,"bins":[1]}`)
	}
	w.Write([]tps.RankWindow{
		{Job: "win", Attempt: 0, Rank: 0, Window: 0, FirstStep: 1, LastStep: 1, Steps: 1, ComputeSketch: far(-1 << 31)},
		{Job: "win", Attempt: 0, Rank: 0, Window: 0, FirstStep: 2, LastStep: 2, Steps: 1, ComputeSketch: far(1<<31 - 1)},
	})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := analyzeChecked(dir, Options{Warmup: 1, RankSource: RankSourceWindows}); err != nil {
		t.Logf("report: %v", err) // an error is an answer; a panic or 12 GB is not
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 512<<20 {
		t.Errorf("the report allocated %d MiB", grew>>20)
	}
}

// With the default rank source, a rank_steps part whose footer claims 1e9
// rows does not count towards the choice of rank_windows (it switched the
// report to them unsaid): rank_steps are read, the lying part named. A job
// whose only cluster part lies says so, not "no cluster steps".
func TestLyingFooterAndTheRankSource(t *testing.T) {
	dir, err := tracetest.Write(t.TempDir(), "src", tracetest.Run{World: 4, Steps: 200, RankRowsPerPart: 200, Windows: true})
	if err != nil {
		t.Fatal(err)
	}
	rk, _ := trace.PartFiles(filepath.Join(dir, trace.RankSteps))
	lieRows(t, rk[1], 1e9)
	rep, err := analyzeChecked(dir, Options{Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.TablesRead, trace.RankSteps) || slices.Contains(rep.TablesRead, trace.RankWindows) {
		t.Errorf("tables read %v: want rank_steps (the lying part's rows are no reason for rank_windows)", rep.TablesRead)
	}
	if notes := strings.Join(rep.Notes, "\n"); !strings.Contains(notes, filepath.Base(rk[1])) {
		t.Errorf("the lying rank part is not named: %v", rep.Notes)
	}

	one, err := tracetest.Write(t.TempDir(), "one", tracetest.Run{World: 2, Steps: 20})
	if err != nil {
		t.Fatal(err)
	}
	cl, _ := trace.PartFiles(filepath.Join(one, trace.ClusterSteps))
	for _, p := range cl {
		lieRows(t, p, 1e9)
	}
	_, err = Analyze(one, Options{})
	if err == nil || !strings.Contains(err.Error(), "no readable cluster steps") || !strings.Contains(err.Error(), filepath.Base(cl[0])) {
		t.Errorf("a job of lying cluster parts: %v", err)
	}
}
