package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/trace"
)

// The report of a job still running says so, with the steps it covers,
// and lists the job as running; once the job ended, its report covers
// every step and says nothing of running. A real job under tpsprof launch
// (the nanoGPT-style loop, one process), its collector finalising parts
// every half second. Before, 75 s into a run the report read 450 of ~900
// steps with running false and the job listed "finished".
func TestReportWhileTheJobRuns(t *testing.T) {
	py := torchPython(t)
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "nanogpt_train.py")
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Second,
		Writer: trace.WriterOptions{PartAge: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	sock := filepath.Join(t.TempDir(), "a.sock")
	const iters = 150
	var log bytes.Buffer
	done := make(chan error, 1)
	go func() {
		code, err := launch.Run(context.Background(), launch.Config{Job: "live", ChooseAttempt: true, Auto: true, PythonDir: t.TempDir(),
			Agent:   agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"},
			Command: []string{py, script, "--iters", "150", "--accum", "1", "--batch-delay", "0.03", "--fetch-first", "--truth", t.TempDir()},
			Stdout:  &log, Stderr: &log})
		if err == nil && code != 0 {
			err = context.Canceled
		}
		done <- err
	}()
	dir := filepath.Join(out, "live")
	var rep *report.Report
	for deadline := time.Now().Add(3 * time.Minute); ; {
		select {
		case err := <-done:
			t.Fatalf("the job ended before its report could be read while it ran (%v)\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no part finalised while the job ran\n%s", log.String())
		}
		if r, err := report.Analyze(dir, report.Options{}); err == nil && r.Summary.Steps >= 10 {
			rep = r
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	notes := strings.Join(rep.Notes, "\n")
	if !rep.Running || !strings.Contains(notes, "running: this report covers steps 0-") {
		t.Errorf("a running job's report: running %v, notes:\n%s", rep.Running, notes)
	}
	if jobs, err := report.Jobs(out); err != nil || len(jobs) != 1 || !jobs[0].Running {
		t.Errorf("the job list while it runs: %+v (%v)", jobs, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("launch: %v\n%s", err, log.String())
	}
	if err := col.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := col.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err = report.Analyze(dir, report.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	if rep.Running || rep.Summary.Steps != iters {
		t.Errorf("the ended job's report: running %v, %d steps of %d", rep.Running, rep.Summary.Steps, iters)
	}
	if jobs, _ := report.Jobs(out); len(jobs) != 1 || jobs[0].Running {
		t.Errorf("the job list once it ended: %+v", jobs)
	}
}
