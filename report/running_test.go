package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// A job whose parts are all finalised is still running when its newest
// attempt recorded a start and no end and its steps were written within
// RunningQuiet: the report says which steps it covers and never closes an
// episode "to the end"; the job list says running. With the attempt's end
// recorded, or its steps quiet past RunningQuiet (a launcher killed with
// the job), it is not.
func TestRunningByItsEvents(t *testing.T) {
	root := t.TempDir()
	dir, err := tracetest.WriteRun(root, "live", 4, 30)
	if err != nil {
		t.Fatal(err)
	}
	write := func(evs ...tps.Event) {
		os.RemoveAll(filepath.Join(dir, trace.Events))
		w, err := trace.NewPartWriter[tps.Event](root, "live", trace.Events, trace.WriterOptions{WriterID: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(evs); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	start := tps.Event{Job: "live", Kind: tps.EventAttemptStart, Rank: -1, StartUnixNs: tracetest.T0 - 1e9, EndUnixNs: tracetest.T0 - 1e9}
	end := tps.Event{Job: "live", Kind: tps.EventAttemptEnd, Rank: -1, StartUnixNs: tracetest.T0 + 31e9, EndUnixNs: tracetest.T0 + 31e9}

	write(start)
	rep, err := analyzeChecked(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	notes := strings.Join(rep.Notes, "\n")
	if !rep.Running || !strings.Contains(notes, "running: this report covers steps 0-29, written so far (attempt 0 recorded no end") {
		t.Errorf("running %v, notes:\n%s", rep.Running, notes)
	}
	jobs, err := Jobs(root)
	if err != nil || len(jobs) != 1 || !jobs[0].Running || !strings.Contains(jobs[0].RunningWhy, "recorded no end") {
		t.Errorf("jobs %+v (%v)", jobs, err)
	}
	// an ongoing episode of a running job is not "to the end"
	if got := episodeText(StragglerEpisode{Ranks: []int64{1}, Ongoing: true}, 10, true); strings.Contains(got, "to the end") {
		t.Errorf("a running job's episode: %s", got)
	}

	write(start, end)
	if rep, err = analyzeChecked(dir, Options{}); err != nil || rep.Running {
		t.Errorf("an ended attempt: running %v (%v) %v", rep.Running, err, rep.Notes)
	}

	write(start)
	old := time.Now().Add(-RunningQuiet - time.Minute)
	files, _ := trace.PartFiles(filepath.Join(dir, trace.ClusterSteps))
	for _, f := range files {
		os.Chtimes(f, old, old)
	}
	if rep, err = analyzeChecked(dir, Options{}); err != nil || rep.Running {
		t.Errorf("steps quiet for %v: running %v (%v)", RunningQuiet+time.Minute, rep.Running, err)
	}
}
