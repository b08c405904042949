package e2e

import (
	"context"
	"encoding/json"
	"math"
	"os/exec"
	"slices"
	"testing"

	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/demo"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/trace"
)

// The report from rank_windows (one row per rank and 100 steps, as a very
// long run reads it) finds what the report from rank_steps finds on the
// same demo run through the real collector: the slow node first, its ranks
// the top stragglers with scores within 2%, one episode on that node
// starting within a window of the other's start, the same padding. No
// warm-up is excluded: the windows path leaves out whole windows holding
// warm-up steps (one window in thousands on the runs it is for, a fifth of
// this one).
func TestReportFromRankWindows(t *testing.T) {
	cfg := demo.Defaults()
	cfg.Out, cfg.Steps, cfg.StepInterval = t.TempDir(), 500, 0
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	analyse := func(src string) *report.Report {
		rep, err := report.Analyze(res.JobDir, report.Options{Warmup: 0, RankSource: src, TopStragglers: 8})
		if err != nil {
			t.Fatal(err)
		}
		checkInvariants(t, rep)
		return rep
	}
	steps, wins := analyse(report.RankSourceSteps), analyse(report.RankSourceWindows)
	if !slices.Contains(wins.TablesRead, trace.RankWindows) || slices.Contains(wins.TablesRead, trace.RankSteps) || wins.RankWindows == 0 {
		t.Fatalf("windows report read %v (%d rank_windows rows)", wins.TablesRead, wins.RankWindows)
	}
	if !slices.Contains(steps.TablesRead, trace.RankSteps) {
		t.Fatalf("steps report read %v", steps.TablesRead)
	}
	slowNode := steps.Nodes[0].Node
	t.Logf("rank_steps: %d rows; rank_windows: %d rows (%d left out), standing for %d rank rows; slow node %s",
		steps.RankRows, wins.RankWindows, wins.RankWindowsLeft, wins.RankRows, slowNode)
	if len(wins.Nodes) == 0 || wins.Nodes[0].Node != slowNode {
		t.Errorf("slowest node from windows %v, from steps %s", wins.Nodes, slowNode)
	}
	if len(wins.Stragglers) != len(steps.Stragglers) {
		t.Fatalf("%d stragglers from windows, %d from steps", len(wins.Stragglers), len(steps.Stragglers))
	}
	score := map[int64]float64{}
	for _, s := range steps.Stragglers {
		score[s.Rank] = s.Score
	}
	for _, s := range wins.Stragglers {
		want, ok := score[s.Rank]
		if !ok || s.Node != slowNode || math.Abs(s.Score-want) > 0.02*want {
			t.Errorf("straggler rank %d (node %s) score %.3f from windows; from steps %.3f (listed %v)", s.Rank, s.Node, s.Score, want, ok)
		}
	}
	if len(steps.Episodes) != 1 || len(wins.Episodes) != 1 {
		t.Fatalf("episodes: %d from steps, %d from windows, want 1 each", len(steps.Episodes), len(wins.Episodes))
	}
	a, b := steps.Episodes[0], wins.Episodes[0]
	if a.Node != b.Node || b.Node != slowNode || math.Abs(float64(a.StartStep-b.StartStep)) > 100 {
		t.Errorf("episode from steps %s from step %d; from windows %s from step %d", a.Node, a.StartStep, b.Node, b.StartStep)
	}
	if (steps.Padding == nil) != (wins.Padding == nil) || (steps.Padding != nil && math.Abs(steps.Padding.RealFraction-wins.Padding.RealFraction) > 0.01) {
		t.Errorf("padding from steps %+v, from windows %+v", steps.Padding, wins.Padding)
	}
}

// The DuckDB query docs/parquet.md gives over rank_windows (each rank's mean
// compute per window, merging the rows of a key) equals DuckDB's own
// figure from rank_steps, for every rank and window of a demo run.
func TestDuckDBRankWindows(t *testing.T) {
	script := duckdbScript(t, "duckdb_windows.mjs")
	cfg := demo.Defaults()
	cfg.Out, cfg.Steps, cfg.StepInterval = t.TempDir(), 250, 0
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("node", script, res.JobDir).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	type row struct {
		Attempt, Rank string
		Window        string      `json:"window_index"`
		Mean          json.Number `json:"compute_ns_mean"`
	}
	var got struct{ Windows, Steps []row }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(got.Windows) == 0 || len(got.Windows) != len(got.Steps) {
		t.Fatalf("%d (rank, window) from rank_windows, %d from rank_steps", len(got.Windows), len(got.Steps))
	}
	for i, w := range got.Windows {
		s := got.Steps[i]
		a, _ := w.Mean.Float64()
		e, _ := s.Mean.Float64()
		if w.Rank != s.Rank || w.Window != s.Window || math.Abs(a-e) > 1e-6*e {
			t.Errorf("rank %s window %s: %v from rank_windows; rank %s window %s: %v from rank_steps", w.Rank, w.Window, w.Mean, s.Rank, s.Window, s.Mean)
		}
	}
}
