package report

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
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
	rep, err := Analyze(dir, Options{Warmup: 0, Select: Selection{Attempt: &one, StepFrom: from, StepTo: to}})
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
	rep, err = Analyze(dir, Options{Warmup: 0, Select: Selection{Last: 5}})
	if err != nil || rep.Summary.Steps != 5 || rep.data.steps[0].Attempt != 1 || rep.data.steps[0].Step != 95 {
		t.Errorf("--last 5: %v, %d steps from %+v", err, rep.Summary.Steps, rep.data.steps[0])
	}
	// the warm-up is the whole run's: a window from mid-attempt has none
	rep, err = Analyze(dir, Options{Warmup: tps.AutoWarmup, Select: Selection{Last: 5}})
	if err != nil || rep.Summary.WarmupSteps != 0 || rep.Summary.SteadySteps != 5 {
		t.Errorf("--last 5 with the automatic warm-up: %v, %d warm-up steps", err, rep.Summary.WarmupSteps)
	}
	since := time.Unix(0, t0+195*s) // 195 s in: attempt 1's steps ending from then, 84 to 99 (the slow window took 10 s more)
	rep, err = Analyze(dir, Options{Warmup: 0, Select: Selection{Since: since}})
	if err != nil || rep.Summary.Steps != 16 {
		t.Errorf("--since: %v, %d steps", err, rep.Summary.Steps)
	}
	big := int64(500)
	if _, err := Analyze(dir, Options{Select: Selection{StepFrom: &big}}); err == nil || !strings.Contains(err.Error(), "holds none of the job's 200 cluster steps") {
		t.Errorf("an empty selection: %v", err)
	}
	for _, bad := range []string{"5", "9:3", ":", "a:b", "-1:4"} {
		if _, _, err := ParseSteps(bad); err == nil {
			t.Errorf("ParseSteps(%q) accepted", bad)
		}
	}
}
