package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/capture"
	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/cli"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/kineto"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
)

type stragglerTruth struct {
	Rank        int64 `json:"rank"`
	Step        int64 `json:"step"`
	StartUnixNs int64 `json:"start_unix_ns"`
	ArriveNs    int64 `json:"arrive_unix_ns"`
	DoneNs      int64 `json:"done_unix_ns"`
	ExtraNs     int64 `json:"extra_ns"`
}

// tpsprof trace against a running 4-rank DDP job (torchrun, gloo) whose
// rank 2 does 40 ms of extra work before each backward: every rank is
// traced for the same two steps, rank 2 is named as the one the others
// waited for, the others' wait per step is close to its extra work as the
// job measured it, and the kept traces are readable by the kineto
// analyser with the rank in their metadata. On both torches.
func TestCaptureNamesStraggler(t *testing.T) {
	t.Run("torch1", func(t *testing.T) { captureRun(t, torchPython(t)) })
	t.Run("torch2", func(t *testing.T) { captureRun(t, modernTorchPython(t)) })
}

func captureRun(t *testing.T, py string) {
	const slowRank, slowMs = 2, 40.0
	srv, col, _, sock := launchEnv(t)
	defer col.Close()
	dir := t.TempDir()
	stop, truth := filepath.Join(dir, "stop"), filepath.Join(dir, "truth")
	job := "capture-" + strconv.Itoa(torchMajor(py))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	j, nc := startJob(ctx, t, srv.URL(), 4, stop, launch.Config{Job: job, PythonDir: t.TempDir(),
		Agent: agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "cap-node"},
		Command: torchrun(py, 4, filepath.Join(repoRoot(t), "examples", "pytorch", "straggler_train.py"),
			"--slow-rank", strconv.Itoa(slowRank), "--slow-ms", strconv.FormatFloat(slowMs, 'f', -1, 64),
			"--stop", stop, "--truth", truth)})
	defer nc.Close()
	log := &j.log

	// bad requests: said, not hung on
	for _, bad := range []struct {
		args []string
		rc   int
		says string
	}{
		{[]string{"trace", "no-such-job", "--nats", srv.URL()}, 1, "no agent serves a rank of the job"},
		{[]string{"trace", job, "--nats", "nats://127.0.0.1:1"}, 1, "nothing listens on that port"},
		{[]string{"trace", job, "--nats", srv.URL(), "--at-step", "0"}, 1, "step 0 is already past"},
		{[]string{"trace", job, "--nats", srv.URL(), "--steps", "0"}, 2, "--steps 0"},
		{[]string{"trace", job, "--nats", srv.URL(), "--ranks", "3-1"}, 2, "not a rank range"},
	} {
		var o, e bytes.Buffer
		if rc := cli.Main(bad.args, &o, &e); rc != bad.rc || !strings.Contains(e.String(), bad.says) {
			t.Errorf("%v: exit %d, %s", bad.args[1:], rc, e.String())
		}
	}

	keep := filepath.Join(dir, "kept")
	var out, errOut bytes.Buffer
	rc := cli.Main([]string{"trace", job, "--nats", srv.URL(), "--steps", "2", "--keep", keep, "--json", "--timeout", "60s"}, &out, &errOut)
	code, lerr := j.end()
	if rc != 0 {
		t.Fatalf("tpsprof trace: exit %d\n%s\n%s\njob:\n%s", rc, errOut.String(), out.String(), log.String())
	}
	if lerr != nil || code != 0 {
		t.Fatalf("launch: %d %v\n%s", code, lerr, log.String())
	}
	var v capture.View
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Logf("progress:\n%s", errOut.String())
	for _, c := range v.Collectives {
		t.Logf("step %d %s #%d %s: ranks %v arrivals %v µs; last %d, held back %.1f ms", c.Step, c.Group, c.Seq, c.Kind, c.Ranks, c.ArrivalUs, c.Last, c.HeldBackUs/1e3)
	}

	// every rank traced, for the same two steps
	if len(v.Ranks) != 4 || len(v.Steps) != 2 || v.Steps[1] != v.Steps[0]+1 || len(v.Missing) != 0 {
		t.Fatalf("ranks %d, steps %v, missing %v\n%s", len(v.Ranks), v.Steps, v.Missing, out.String())
	}

	// the job's own clocks (one node: one clock): at each captured step's
	// all-reduce, each rank's arrival; want is the others' wait for the
	// slow rank, summed over the steps and averaged over the others; leads
	// is how long after the latest other rank the slow one came (negative
	// where another came later still), slowWaitUs what the slow rank waited
	arrive := map[[2]int64]int64{}
	var extra float64
	for _, tr := range readTruthLines[stragglerTruth](t, truth) {
		arrive[[2]int64{tr.Rank, tr.Step}] = tr.ArriveNs
		if tr.Rank == slowRank && (tr.Step == v.Steps[0] || tr.Step == v.Steps[1]) {
			extra += float64(tr.ExtraNs) / 1e3
		}
	}
	var want, slowWaitUs float64
	leads := map[int64]float64{}
	for _, step := range v.Steps {
		last := arrive[[2]int64{slowRank, step}]
		latestOther := int64(0)
		for r := int64(0); r < 4; r++ {
			a, ok := arrive[[2]int64{r, step}]
			if !ok || last == 0 {
				t.Fatalf("the job logged no arrival of rank %d at step %d", r, step)
			}
			if r != slowRank {
				want += float64(last-a) / 1e3 / 3
				latestOther = max(latestOther, a)
			}
		}
		leads[step] = float64(last-latestOther) / 1e3
		slowWaitUs += max(0, -leads[step])
	}
	t.Logf("by the job's clocks the slow rank came after the latest other by %v µs", leads)
	for _, r := range v.Ranks {
		if r.Steps != 2 || r.CommUs <= 0 || r.ComputeUs <= 0 || r.ExposedCommUs > r.CommUs || r.Node != "cap-node" {
			t.Errorf("rank %d: %+v", r.Rank, r)
		}
		// time in collectives = waiting for the last rank + transfer: the
		// slow rank waits for no one (but for what the job's own clocks
		// say it waited, where a loaded machine slowed another rank more);
		// the others mostly wait
		if r.Rank == slowRank && (r.WaitUs > slowWaitUs+5e3 || r.TransferUs > r.CommUs-r.WaitUs+1) {
			t.Errorf("slow rank %d: waited %.1f ms (%.1f ms by the job's clocks), transfer %.1f of %.1f ms", r.Rank, r.WaitUs/1e3, slowWaitUs/1e3, r.TransferUs/1e3, r.CommUs/1e3)
		}
		if r.Rank != slowRank && r.WaitUs < 0.5*r.CommUs {
			t.Errorf("rank %d: waited %.1f ms of %.1f ms in collectives", r.Rank, r.WaitUs/1e3, r.CommUs/1e3)
		}
	}
	// the slow rank named
	if v.Culprit == nil || v.Culprit.Rank != slowRank {
		t.Fatalf("culprit %+v, want rank %d\n%s", v.Culprit, slowRank, out.String())
	}
	// where the job's own clocks say the slow rank came last by a clear
	// margin, the capture says so too (on a loaded machine another rank
	// can be slower still at a step)
	for _, c := range v.Collectives {
		if lead := leads[c.Step]; lead > 5e3 && c.Last != slowRank {
			t.Errorf("step %d: rank %d last by the capture; by the job's clocks rank %d came %.1f ms after the others", c.Step, c.Last, slowRank, lead/1e3)
		}
	}
	clearSteps := 0
	for _, step := range v.Steps {
		if leads[step] > 5e3 {
			clearSteps++
		}
	}
	if v.Culprit.LastArrivals < clearSteps {
		t.Errorf("rank %d last at %d collectives, the job's clocks say %d", slowRank, v.Culprit.LastArrivals, clearSteps)
	}
	ratio := v.Culprit.OthersWaitUs / want
	t.Logf("others waited %.1f ms each for rank %d over steps %v; by the job's clocks %.1f ms (ratio %.2f); its extra work %.1f ms; held back %.1f ms; offsets %v µs",
		v.Culprit.OthersWaitUs/1e3, slowRank, v.Steps, want/1e3, ratio, extra/1e3, v.Culprit.HeldBackUs/1e3, offsets(v))
	if ratio < 0.8 || ratio > 1.25 {
		os.WriteFile(filepath.Join(os.TempDir(), "capture-fail-"+job+".json"), out.Bytes(), 0o644)
		t.Errorf("others' wait %.1f ms vs %.1f ms by the job's own clocks (ratio %.2f)", v.Culprit.OthersWaitUs/1e3, want/1e3, ratio)
	}
	if want < 0.5*extra {
		t.Errorf("the job's own clocks say the others waited %.1f ms, under half the slow rank's extra work (%.1f ms): the job did not straggle as set up", want/1e3, extra/1e3)
	}
	// the kept traces: one per rank and step, readable, with the rank
	if len(v.Kept) != 8 {
		t.Fatalf("kept %d traces, want 8: %v", len(v.Kept), v.Kept)
	}
	// beside them the ranks' reports, merged again to the same verdict
	b, err := os.ReadFile(filepath.Join(filepath.Dir(v.Kept[0]), capture.ReportsFile))
	if err != nil {
		t.Fatal(err)
	}
	var reports []capture.Report
	if err := json.Unmarshal(b, &reports); err != nil {
		t.Fatal(err)
	}
	if again := capture.Merge(v.ID, v.Job, reports); len(reports) != 8 || again.Culprit == nil || again.Culprit.Rank != v.Culprit.Rank || again.Culprit.OthersWaitUs != v.Culprit.OthersWaitUs {
		t.Errorf("the kept reports (%d) merge to %+v, the capture said %+v", len(reports), again.Culprit, v.Culprit)
	}
	for _, p := range v.Kept {
		r, err := kineto.AnalyzeFile(p)
		if err != nil {
			t.Fatalf("kept trace: %v", err)
		}
		var rank, step int64
		if _, err := fmt.Sscanf(filepath.Base(p), "rank%d.step%d.pt.trace.json.gz", &rank, &step); err != nil {
			t.Fatal(err)
		}
		if r.Rank == nil || *r.Rank != rank || len(r.Steps) != 1 || r.Steps[0].Step != step || r.Total.CommUs <= 0 {
			t.Errorf("%s: rank %v steps %+v", p, r.Rank, r.Steps)
		}
	}
}

// waitForRanks connects to NATS and waits (2 minutes at most) until the
// agents serve want ranks of job: the job is up once every rank is at some
// step. The connection is the caller's to close.
func waitForRanks(ctx context.Context, t *testing.T, url, job string, want int, log *syncBuffer) *nats.Conn {
	t.Helper()
	nc, err := natsconn.Connect(natsconn.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		acks, err := capture.Probe(ctx, nc, job, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, a := range acks {
			n += len(a.Ranks)
		}
		if n == want {
			return nc
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job's ranks never reached the agent (%d of %d)\n%s", n, want, log.String())
		}
	}
}

// bgJob is a training job launch.Run keeps running in the background
// until its stop file exists (the examples' --stop).
type bgJob struct {
	log  syncBuffer
	stop string
	wg   sync.WaitGroup
	once sync.Once
	code int
	err  error
}

// startJob runs cfg (its output and its agent's warnings into the job's
// log) until end, and waits until the agents serve its ranks; the NATS
// connection is the caller's to close. The job is ended at the test's
// cleanup at the latest.
func startJob(ctx context.Context, t *testing.T, url string, ranks int, stop string, cfg launch.Config) (*bgJob, *nats.Conn) {
	t.Helper()
	j := &bgJob{stop: stop}
	cfg.Stdout, cfg.Stderr = &j.log, &j.log
	if cfg.Agent.Logger == nil {
		cfg.Agent.Logger = slog.New(slog.NewTextHandler(&j.log, nil))
	}
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		j.code, j.err = launch.Run(ctx, cfg)
	}()
	t.Cleanup(func() { j.end() })
	return j, waitForRanks(ctx, t, url, cfg.Job, ranks, &j.log)
}

// end asks the job to stop, waits for it, and gives its exit code and
// launch's error.
func (j *bgJob) end() (int, error) {
	j.once.Do(func() {
		os.WriteFile(j.stop, nil, 0o644)
		j.wg.Wait()
	})
	return j.code, j.err
}

func offsets(v capture.View) []float64 {
	var o []float64
	for _, r := range v.Ranks {
		o = append(o, r.OffsetUs)
	}
	return o
}

// collector --auto-capture: the same straggling job, with nothing asked:
// the collector's live straggler episode on the slow rank starts a
// capture of it and the fastest rank, the episode links to it (the live
// summary) with the slow rank as the one waited for, and the report puts
// the capture beside the episode.
func TestAutoCaptureOnEpisode(t *testing.T) {
	py := torchPython(t)
	const slowRank = 2
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Second, AutoCapture: true})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	sockDir, _ := os.MkdirTemp("", "tpsprof-auto")
	defer os.RemoveAll(sockDir)
	dir := t.TempDir()
	stop := filepath.Join(dir, "stop")
	const job = "auto-capture"
	var log syncBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		launch.Run(context.Background(), launch.Config{Job: job, PythonDir: t.TempDir(),
			Agent: agent.Config{Socket: filepath.Join(sockDir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Node: "auto-node"},
			Command: torchrun(py, 4, filepath.Join(repoRoot(t), "examples", "pytorch", "straggler_train.py"),
				"--slow-rank", strconv.Itoa(slowRank), "--slow-ms", "40", "--stop", stop, "--truth", filepath.Join(dir, "truth")),
			Stdout: &log, Stderr: &log})
	}()
	defer func() { os.WriteFile(stop, nil, 0o644); <-done }()

	var link *collector.CaptureLink
	deadline := time.Now().Add(2 * time.Minute)
	for link == nil || link.State == "running" {
		if time.Now().After(deadline) {
			t.Fatalf("no automatic capture finished: %+v\n%s", link, log.String())
		}
		time.Sleep(300 * time.Millisecond)
		for _, j := range col.Summary().Jobs {
			for _, e := range j.StragglerEpisodes {
				if e.Capture != nil {
					if !slices.Contains(e.Ranks, slowRank) {
						t.Fatalf("episode %+v captured, want rank %d's (ranks' own time now %v)", e, slowRank, j.SlowestRanks)
					}
					link = e.Capture
				}
			}
		}
	}
	if link.State != "done" || link.Culprit == nil || *link.Culprit != slowRank || link.OthersWaitUs <= 0 || len(link.Steps) != 1 {
		t.Fatalf("capture %+v", link)
	}
	// tpsprof trace --straggler: the collector names the episode's rank and
	// the fastest one; the agents took the automatic capture as over
	// once the gap after the automatic one has passed (said until then)
	var o, e bytes.Buffer
	gapSaid := false
	for try := 0; ; try++ {
		o.Reset()
		e.Reset()
		rc := cli.Main([]string{"trace", job, "--straggler", "--nats", srv.URL(), "--steps", "1", "--json"}, &o, &e)
		if rc == 0 {
			break
		}
		if !strings.Contains(e.String(), "the next may start 5s after it") || try > 10 {
			t.Fatalf("--straggler: exit %d\n%s\n%s", rc, e.String(), o.String())
		}
		gapSaid = true
		time.Sleep(time.Second)
	}
	t.Logf("the gap after the automatic capture said: %v", gapSaid)
	var v capture.View
	if err := json.Unmarshal(o.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Ranks) != 2 || v.Ranks[0].Rank == v.Ranks[1].Rank || (v.Ranks[0].Rank != slowRank && v.Ranks[1].Rank != slowRank) ||
		v.Culprit == nil || v.Culprit.Rank != slowRank {
		t.Errorf("--straggler captured %+v, culprit %+v\n%s", v.Ranks, v.Culprit, e.String())
	}
	if rc := cli.Main([]string{"trace", "no-such-job", "--straggler", "--nats", srv.URL()}, &o, &e); rc != 1 || !strings.Contains(e.String(), "the collector has no job") {
		t.Errorf("--straggler on an unknown job: exit %d, %s", rc, e.String())
	}
	os.WriteFile(stop, nil, 0o644)
	<-done
	col.Sync(10 * time.Second)
	col.Close()
	rep, err := report.Analyze(filepath.Join(out, job), report.Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	found := false
	for _, e := range rep.Episodes {
		for _, c := range e.Captures {
			found = found || (c.ID == link.ID && c.Culprit != nil && *c.Culprit == slowRank)
		}
	}
	if !found || rep.Events[tps.EventCapture] != 1 {
		t.Errorf("report: %d capture events, episodes %+v", rep.Events[tps.EventCapture], rep.Episodes)
	}
	t.Logf("automatic capture %s at step %v: rank %d waited for, %.1f ms", link.ID, link.Steps, *link.Culprit, link.OthersWaitUs/1e3)
}
