package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
)

// grepLines is the lines of s that hold sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// One straggler verdict on real jobs: a 4-rank job on one node whose rank
// 2 spends 60 ms more in its forward each step, and one whose rank 2 waits
// 60 ms more for its data (examples/pytorch/phase_straggler.py, DDP over
// gloo, under tpsprof launch): the report's summary line, its HTML and
// --compare name rank 2, and the waiting is charged to rank 2, not to the
// node (it read "waiting caused by vm 100.0% (ranks 0-3)", rank 2 never
// flagged).
func TestTorchStragglerVerdict(t *testing.T) {
	py := torchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "phase_straggler.py")
	for _, phase := range []string{"forward", "data"} {
		t.Run(phase, func(t *testing.T) {
			truth := t.TempDir()
			// the live page's slowest ranks and /metrics, once the job's rows are in
			live := func(col *collector.Collector) {
				var jobs []collector.LiveJob
				for _, j := range col.Summary().Jobs {
					if j.Job == "verdict-"+phase {
						jobs = append(jobs, j)
					}
				}
				if len(jobs) != 1 || len(jobs[0].SlowestRanks) == 0 || jobs[0].SlowestRanks[0].Rank != 2 || jobs[0].SlowestRanks[0].Score >= tps.StragglerThreshold {
					t.Errorf("the live page's slowest ranks: %+v", jobs)
				}
				srv := httptest.NewServer(col.Handler())
				defer srv.Close()
				res, err := http.Get(srv.URL + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				// the job ended (attempt_end): no straggler left on the gauge
				if !strings.Contains(string(b), `tpsprof_stragglers{job="verdict-`+phase+`"} 0`) {
					t.Errorf("/metrics: %s", grepLines(string(b), "tpsprof_stragglers"))
				}
			}
			dir, log := launchTorchThen(t, "verdict-"+phase, false, torchrun(py, 4, script, "--slow-rank", "2", "--delay-ms", "60",
				"--phases", phase, "--per-phase", "1000", "--max-steps", "40", "--stop", filepath.Join(truth, "never"), "--truth", truth), live)
			rep, err := report.Analyze(dir, report.Options{Warmup: 2})
			if err != nil {
				t.Fatalf("%v\n%s", err, log)
			}
			checkInvariants(t, rep)
			var text bytes.Buffer
			report.WriteText(&text, rep)
			for _, l := range strings.Split(text.String(), "\n") {
				if strings.Contains(l, "straggler") || strings.Contains(l, "waiting caused") || strings.Contains(l, "slowest") {
					t.Log(strings.TrimSpace(l))
				}
			}
			if !regexp.MustCompile(`(?m)^  straggler ranks +rank 2 \(`).MatchString(text.String()) {
				t.Errorf("the summary line does not name rank 2:\n%s", text.String())
			}
			if m := regexp.MustCompile(`(?m)^  waiting caused by +(.*)$`).FindStringSubmatch(text.String()); m != nil && !strings.HasPrefix(m[1], "rank 2 ") {
				t.Errorf("the waiting is charged to %q, not to rank 2", m[1])
			}
			var page bytes.Buffer
			if err := report.WriteHTML(&page, rep, nil); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(page.String(), "slowest rank") {
				t.Error("the HTML has no card for the slowest rank")
			}
			var cmp bytes.Buffer
			if err := report.WriteCompare(&cmp, rep, rep); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(cmp.String(), "rank 2 ") {
				t.Errorf("--compare does not name rank 2:\n%s", cmp.String())
			}
		})
	}
}
