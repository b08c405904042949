package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// BenchmarkReportVsDuckDB: the report over 10 M rank rows (64 ranks ×
// 156,250 steps; TPSPROF_REPORT_STEPS changes the steps) beside DuckDB's
// own reader computing the comparable summary from the same files
// (testdata/duckdb_summary.mjs), alternately in one run. Reports each's
// seconds (the report in process; DuckDB from its instance's creation,
// node's start-up excluded) and the ratio.
//
//	go test -run '^$' -bench ReportVsDuckDB -benchtime 3x ./cmd/tpsprof/e2e/
func BenchmarkReportVsDuckDB(b *testing.B) {
	steps := 156_250
	if v, err := strconv.Atoi(os.Getenv("TPSPROF_REPORT_STEPS")); err == nil && v > 0 {
		steps = v
	}
	script := duckdbScript(b, "duckdb_summary.mjs")
	dir, err := tracetest.Write(b.TempDir(), "big", tracetest.Run{World: 64, Steps: steps, Jitter: os.Getenv("TPSPROF_REPORT_JITTER") != ""})
	if err != nil {
		b.Fatal(err)
	}
	// Both read the files once untimed first: the report ran first in
	// every loop, so at one iteration (CI's) it alone paid the cold reads.
	if _, err := report.Analyze(dir, report.Options{Warmup: tps.AutoWarmup}); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("node", script, dir).Output(); err != nil {
		b.Fatalf("node: %v\n%s", err, out)
	}
	var ours, theirs time.Duration
	for b.Loop() {
		t := time.Now()
		rep, err := report.Analyze(dir, report.Options{Warmup: tps.AutoWarmup})
		if err != nil {
			b.Fatal(err)
		}
		ours += time.Since(t)
		if rep.RankRows != int64(64*steps) {
			b.Fatalf("report read %d rank rows, want %d", rep.RankRows, 64*steps)
		}
		out, err := exec.Command("node", script, dir).Output()
		if err != nil {
			b.Fatalf("node: %v\n%s", err, out)
		}
		var got struct {
			Ranks, Steps int
			Ms           float64
		}
		if err := json.Unmarshal(out, &got); err != nil || got.Ranks != 64 || got.Steps != steps {
			b.Fatalf("duckdb: %v %s", err, out)
		}
		theirs += time.Duration(got.Ms * float64(time.Millisecond))
	}
	n := float64(b.N)
	b.ReportMetric(ours.Seconds()/n, "report_s")
	b.ReportMetric(theirs.Seconds()/n, "duckdb_s")
	b.ReportMetric(ours.Seconds()/theirs.Seconds(), "ratio")
}
