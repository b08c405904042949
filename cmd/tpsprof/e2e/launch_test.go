package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

func launchEnv(t *testing.T) (*natsconn.Embedded, *collector.Collector, string, string) {
	t.Helper()
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	out := t.TempDir()
	col, err := collectorOn(srv.URL(), out)
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := os.MkdirTemp("", "tpsprof-launch")
	t.Cleanup(func() { os.RemoveAll(dir) })
	return srv, col, out, filepath.Join(dir, "agent.sock")
}

// tpsprof launch runs the Python training loop as a real subprocess with an
// agent it starts itself; the steps, the metadata and the attempt events
// reach Parquet, and the command's exit code comes back.
func TestLaunchRunsCommandWithAgent(t *testing.T) {
	srv, col, out, sock := launchEnv(t)
	var stdout bytes.Buffer
	code, err := launch.Run(context.Background(), launch.Config{
		Job: "launched", Attempt: 2,
		Meta:    tps.RunMeta{Topology: tps.Topology{DP: 1}, ModelPreset: "llama3-8b", GPU: "h100-sxm"},
		Agent:   agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "launch-node"},
		Command: []string{python(t), filepath.Join(repoRoot(t), "examples", "pytorch", "train.py"), "--steps", "12", "--synthetic"},
		Stdout:  &stdout, Stderr: &stdout,
	})
	if err != nil || code != 0 {
		t.Fatalf("launch: code %d err %v\n%s", code, err, stdout.String())
	}
	if !strings.Contains(stdout.String(), "12 steps sent, 0 dropped") {
		t.Fatalf("the command did not find the agent through TPSPROF_SOCKET:\n%s", stdout.String())
	}
	col.Sync(5 * time.Second)
	col.Close()
	rows, _ := trace.ReadAll[tps.StepRecord](filepath.Join(out, "launched", trace.RankSteps))
	if len(rows) != 12 || rows[0].Attempt != 2 || rows[0].Node != "launch-node" {
		t.Fatalf("rank rows: %d, first %+v", len(rows), rows)
	}
	events, _ := trace.ReadAll[tps.Event](filepath.Join(out, "launched", trace.Events))
	kinds := map[string]tps.Event{}
	for _, e := range events {
		kinds[e.Kind] = e
	}
	if _, ok := kinds[tps.EventAttemptStart]; !ok {
		t.Errorf("no attempt_start event: %+v", events)
	}
	if e, ok := kinds[tps.EventAttemptEnd]; !ok || e.ExitCode != 0 || e.Attempt != 2 {
		t.Errorf("attempt_end: %+v", e)
	}
	cluster, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "launched", trace.ClusterSteps))
	// The model and GPU from launch apply (FLOPs counted); 2,048 tokens a
	// millisecond on one H100 would be ~11,000% MFU with llama3-8b, so it
	// is unknown with the reason, never printed.
	if len(cluster) != 12 || cluster[0].FLOPs <= 0 {
		t.Fatalf("cluster rows %d, FLOPs %v: metadata from launch not applied", len(cluster), cluster[0].FLOPs)
	}
	if c := cluster[0]; c.MFU != 0 || !strings.Contains(c.MFUUnknown, "above 100%") {
		t.Errorf("impossible MFU %g shown (unknown: %q)", c.MFU, c.MFUUnknown)
	}
}

func TestLaunchExitCodeAndSignals(t *testing.T) {
	srv, col, _, sock := launchEnv(t)
	defer col.Close()
	cfg := launch.Config{Job: "codes", Agent: agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}}}
	cfg.Command = []string{"sh", "-c", "exit 7"}
	if code, _ := launch.Run(context.Background(), cfg); code != 7 {
		t.Errorf("exit code: got %d, want 7", code)
	}
	cfg.Command = []string{"/nonexistent/binary"}
	if code, err := launch.Run(context.Background(), cfg); code != 127 || err == nil {
		t.Errorf("missing command: got %d %v, want 127 and an error", code, err)
	}
	// SIGTERM to the launcher is forwarded: the child dies of it (128+15).
	sigtermDuringLaunch(t, cfg)
	cfg.Job = "bad job"
	if code, err := launch.Run(context.Background(), cfg); code != 2 || err == nil {
		t.Errorf("bad job id: got %d %v", code, err)
	}
}

func collectorOn(url, out string) (*collector.Collector, error) {
	// cluster figures for rank 0 every 300 ms: a test job lasts seconds
	return collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: url}, Grace: time.Second, FiguresEvery: 300 * time.Millisecond})
}

// launch --auto chains the site's own sitecustomize as Python would run
// it: what it adds to sys.path stays (the script imports from there), and
// an error inside it is shown on stderr while the script still runs.
func TestAutoChainsSiteCustomize(t *testing.T) {
	site, extra := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(extra, "sitemod.py"), []byte("X = 42\n"), 0o644)
	script := "import sys, sitemod, sitecustomize; print('sitemod', sitemod.X, sitecustomize.MARK)"
	for _, c := range []struct {
		name, body, want string
	}{
		{"adds a path", "import sys\nsys.path.append(%q)\nMARK = 'site'\n", "sitemod 42 site"},
		{"raises", "import sys\nsys.path.append(%q)\nMARK = 'site'\nraise RuntimeError('site broke')\n", "site broke"},
	} {
		os.WriteFile(filepath.Join(site, "sitecustomize.py"), []byte(strings.Replace(c.body, "%q", "'"+extra+"'", 1)), 0o644)
		t.Setenv("PYTHONPATH", site)
		srv, col, _, sock := launchEnv(t)
		var out bytes.Buffer
		cmd := []string{python(t), "-c", script}
		if c.name == "raises" {
			cmd = []string{python(t), "-c", "print('script ran')"}
		}
		code, err := launch.Run(context.Background(), launch.Config{Job: "site", Auto: true, PythonDir: t.TempDir(),
			Agent: agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "n"}, Command: cmd, Stdout: &out, Stderr: &out})
		if err != nil || code != 0 {
			t.Fatalf("%s: code %d err %v\n%s", c.name, code, err, out.String())
		}
		if !strings.Contains(out.String(), c.want) {
			t.Errorf("%s: output lacks %q:\n%s", c.name, c.want, out.String())
		}
		col.Close()
		if c.name == "raises" && !strings.Contains(out.String(), "script ran") {
			t.Errorf("the script did not run after the site's error:\n%s", out.String())
		}
	}
}

// Under Slurm, a SIGTERM the launch forwards is Slurm's (a requeue, a
// preemption, scancel): the attempt ends "stopped by Slurm", not
// "crashed" (a requeue's first attempt read "crashed (exit 1)"). Two
// launches started together on one node (srun, a task a rank) share one
// agent: the one that loses the race to serve the socket uses the
// winner's (3 of 4 runs one exited 1: "socket already served" or
// "address already in use").
func TestSlurmLaunches(t *testing.T) {
	srv, col, out, sock := launchEnv(t)
	cfg := launch.Config{Job: "slurm-9", Agent: agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}}, PythonDir: "-"}
	// two at once, each holding the socket a moment
	cfg.Command = []string{"sh", "-c", "sleep 0.5"}
	codes := make(chan error, 2)
	for range 2 {
		go func() {
			code, err := launch.Run(context.Background(), cfg)
			if err == nil && code != 0 {
				err = fmt.Errorf("exit %d", code)
			}
			codes <- err
		}()
	}
	for range 2 {
		if err := <-codes; err != nil {
			t.Errorf("a launch of two on one node: %v", err)
		}
	}
	t.Setenv("SLURM_JOB_ID", "9")
	cfg.Attempt = 1
	sigtermDuringLaunch(t, cfg) // as slurmd signals a requeued job's tasks
	if err := col.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := col.Close(); err != nil {
		t.Fatal(err)
	}
	events, err := trace.ReadAll[tps.Event](filepath.Join(out, "slurm-9", trace.Events))
	if err != nil {
		t.Fatal(err)
	}
	var ends []string
	for _, e := range events {
		if e.Kind == tps.EventAttemptEnd {
			ends = append(ends, fmt.Sprintf("%d:%d:%s", e.Attempt, e.ExitCode, e.Detail))
		}
	}
	slices.Sort(ends)
	if len(ends) != 3 || ends[0] != "0:0:" || ends[1] != "0:0:" || ends[2] != "1:143:"+tps.StoppedPrefix+"stopped by Slurm (preempted, requeued or cancelled)" {
		t.Errorf("attempt ends %q", ends)
	}
	row := report.AttemptRow{ExitCode: new(int64), Stopped: "stopped by Slurm (preempted, requeued or cancelled)"}
	*row.ExitCode = 143
	if got := row.Outcome(); got != "stopped by Slurm (preempted, requeued or cancelled) (exit 143)" {
		t.Errorf("outcome %q", got)
	}
}

// sigtermDuringLaunch runs cfg with a child that waits, sends this process
// SIGTERM once the child runs, and checks the launch forwarded it (the
// child's exit 128+15).
func sigtermDuringLaunch(t *testing.T, cfg launch.Config) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cfg.Command = []string{"sh", "-c", "touch " + ready + "; exec sleep 30"}
	done := make(chan int, 1)
	go func() {
		code, _ := launch.Run(context.Background(), cfg)
		done <- code
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("child did not start")
		}
	}
	time.Sleep(50 * time.Millisecond) // let sh exec into sleep
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 128+int(syscall.SIGTERM) {
			t.Errorf("signalled child: got exit %d, want %d", code, 128+int(syscall.SIGTERM))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM was not forwarded")
	}
}
