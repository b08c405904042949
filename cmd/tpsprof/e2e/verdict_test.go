package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/internal/browser"
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
// 2 spends 60 ms more in its forward each step, and a 2-rank job whose
// rank 1 waits 60 ms more for its data (examples/pytorch/phase_straggler.py,
// DDP over gloo, under tpsprof launch): the report's summary line, its
// HTML as Chromium renders it, --compare, the live page and /metrics name
// that rank, and the waiting is charged to it, not to the node (it read
// "waiting caused by vm 100.0% (ranks 0-3)", rank 2 never flagged).
func TestTorchStragglerVerdict(t *testing.T) {
	py := torchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "phase_straggler.py")
	for _, c := range []struct {
		phase       string
		ranks, slow int
	}{{"forward", 4, 2}, {"data", 2, 1}} {
		phase, slow := c.phase, strconv.Itoa(c.slow)
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
				if len(jobs) != 1 || len(jobs[0].SlowestRanks) == 0 || jobs[0].SlowestRanks[0].Rank != int64(c.slow) || jobs[0].SlowestRanks[0].Score >= tps.StragglerThreshold {
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
			dir, log := launchTorchThen(t, "verdict-"+phase, false, torchrun(py, c.ranks, script, "--slow-rank", slow, "--delay-ms", "60",
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
			if !regexp.MustCompile(`(?m)^  straggler ranks +rank ` + slow + ` \(`).MatchString(text.String()) {
				t.Errorf("the summary line does not name rank %s:\n%s", slow, text.String())
			}
			if m := regexp.MustCompile(`(?m)^  waiting caused by +(.*)$`).FindStringSubmatch(text.String()); m != nil && !strings.HasPrefix(m[1], "rank "+slow+" ") {
				t.Errorf("the waiting is charged to %q, not to rank %s", m[1], slow)
			}
			var page bytes.Buffer
			if err := report.WriteHTML(&page, rep, nil); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "report.html")
			if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			dom, err := browser.DumpDOM("file://"+file, t.TempDir())
			if err != nil {
				t.Fatalf("the HTML report in a browser: %v", err)
			}
			if !regexp.MustCompile(`<div class="label">slowest rank</div><div class="value">rank ` + slow + `\b`).MatchString(dom) {
				t.Errorf("the HTML's card for the slowest rank does not name rank %s:\n%s", slow, grepLines(dom, "card"))
			}
			// the top finding names the slow rank with its cause: the waiting
			// for it, or (the data case, where its own data stall is as much
			// of the mean rank's time as the others' waiting for it) its
			// data stall
			top := report.Finding{}
			if len(rep.Findings) > 0 {
				top = rep.Findings[0]
			}
			want := "waiting_for_peers"
			if phase == "data" && top.Bucket == "data_stall" {
				want = "data_stall"
			}
			// (its cause where the rank explains ≥ 80% of the waiting; under
			// load other ranks slow now and then, and the evidence names it)
			if top.Bucket != want || !strings.Contains(top.Cause+" "+top.Evidence, "rank "+slow+" ") {
				t.Errorf("findings %+v: want the slow rank %s's first", rep.Findings, slow)
			} else {
				t.Logf("finding 1: %s", report.FindingText(rep.Findings[0]))
			}
			var cmp bytes.Buffer
			if err := report.WriteCompare(&cmp, rep, rep); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(cmp.String(), "rank "+slow+" ") {
				t.Errorf("--compare does not name rank %s:\n%s", slow, cmp.String())
			}
		})
	}
}
