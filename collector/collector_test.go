package collector

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tpsprof/tpsprof/internal/browser"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

func startCollector(t *testing.T) (*Collector, *nats.Conn) {
	t.Helper()
	return startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: time.Minute})
}

// startCollectorWith starts an embedded NATS server and a collector with
// cfg on it (cfg.NATS is filled in), and a client connection to publish.
func startCollectorWith(t *testing.T, cfg Config) (*Collector, *nats.Conn) {
	t.Helper()
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	cfg.NATS = natsconn.Options{URL: srv.URL()}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return c, nc
}

// get fetches path from the collector's HTTP handler.
func get(t *testing.T, c *Collector, path string) string {
	t.Helper()
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// publishSteps sends steps [from, to) of a 4-rank pure-DP job, 1000 tokens
// per rank, 1 s per step, 10% exposed communication.
func publishSteps(t *testing.T, nc *nats.Conn, job string, from, to int64) {
	t.Helper()
	t0 := time.Now().Add(-time.Hour).UnixNano()
	var recs []tps.StepRecord
	for s := from; s < to; s++ {
		for r := int64(0); r < 4; r++ {
			recs = append(recs, tps.StepRecord{Job: job, Step: s, Rank: r, WorldSize: 4, Tokens: 1000,
				StartUnixNs: t0 + s*2e9, EndUnixNs: t0 + s*2e9 + 1e9, DurationNs: 1e9, ExposedCommNs: 1e8, CommNs: 2e8})
		}
	}
	if err := nc.Publish(wire.StepsSubject(job, "n0"), wire.AppendSteps(nil, recs)); err != nil {
		t.Fatal(err)
	}
	nc.Publish(wire.StepsSubject(job, "n0"), []byte("garbage")) // counted as batch:decode
	nc.Flush()
}

func TestMetricsExposition(t *testing.T) {
	c, nc := startCollector(t)
	publishSteps(t, nc, "m1", 0, 5)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP tpsprof_cluster_tokens_per_second Training tokens per second of the job's last 10 closed steps: their tokens over their step time (tokens counted once per data-parallel replica); absent while they counted no token. Over any range: rate(tpsprof_tokens_total) / rate(tpsprof_step_seconds_total).
# TYPE tpsprof_cluster_tokens_per_second gauge
tpsprof_cluster_tokens_per_second{job="m1"} 4000
# HELP tpsprof_cluster_tokens_per_second_per_gpu tpsprof_cluster_tokens_per_second divided by the world size.
# TYPE tpsprof_cluster_tokens_per_second_per_gpu gauge
tpsprof_cluster_tokens_per_second_per_gpu{job="m1"} 1000
# HELP tpsprof_exposed_comm_ratio Exposed communication as a fraction of step time, mean over ranks, last closed step.
# TYPE tpsprof_exposed_comm_ratio gauge
tpsprof_exposed_comm_ratio{job="m1"} 0.1
# HELP tpsprof_last_step Step number of the last closed step.
# TYPE tpsprof_last_step gauge
tpsprof_last_step{job="m1"} 4
# HELP tpsprof_records_accepted_total Step records accepted (first copies).
# TYPE tpsprof_records_accepted_total counter
tpsprof_records_accepted_total 20
# HELP tpsprof_records_rejected_total Records and messages rejected, by reason.
# TYPE tpsprof_records_rejected_total counter
tpsprof_records_rejected_total{reason="batch:decode"} 1
# HELP tpsprof_step_time_seconds Step time of the last closed step: its period on the critical path (docs/report.md).
# TYPE tpsprof_step_time_seconds gauge
tpsprof_step_time_seconds{job="m1"} 1
# HELP tpsprof_step_seconds_total Step time of all closed steps (the period of each on the critical path): rate(tpsprof_tokens_total) / rate(tpsprof_step_seconds_total) is tokens over step time over any range.
# TYPE tpsprof_step_seconds_total counter
tpsprof_step_seconds_total{job="m1"} 5
# HELP tpsprof_step_time_share_ratio Where the last 10 closed steps' time went, by part (compute, exposed_comm, waiting_for_peers, bubble, data_stall, checkpoint, host_other): each part's time, mean over ranks, over their step time; the parts add up to 1.
# TYPE tpsprof_step_time_share_ratio gauge
tpsprof_step_time_share_ratio{job="m1",part="bubble"} 0
tpsprof_step_time_share_ratio{job="m1",part="checkpoint"} 0
tpsprof_step_time_share_ratio{job="m1",part="compute"} 0.9
tpsprof_step_time_share_ratio{job="m1",part="data_stall"} 0
tpsprof_step_time_share_ratio{job="m1",part="exposed_comm"} 0.1
tpsprof_step_time_share_ratio{job="m1",part="host_other"} 0
tpsprof_step_time_share_ratio{job="m1",part="waiting_for_peers"} 0
# HELP tpsprof_steps_closed_total Cluster steps closed.
# TYPE tpsprof_steps_closed_total counter
tpsprof_steps_closed_total{job="m1"} 5
# HELP tpsprof_stragglers Ranks whose recent own time (compute, data wait and host work) is more than 1/0.75 of the fastest rank's.
# TYPE tpsprof_stragglers gauge
tpsprof_stragglers{job="m1"} 0
# HELP tpsprof_tokens_total Training tokens of all closed steps.
# TYPE tpsprof_tokens_total counter
tpsprof_tokens_total{job="m1"} 20000
# HELP tpsprof_nats_connected 1 when the collector is connected to NATS.
# TYPE tpsprof_nats_connected gauge
tpsprof_nats_connected 1
`
	names := []string{"tpsprof_cluster_tokens_per_second", "tpsprof_cluster_tokens_per_second_per_gpu", "tpsprof_exposed_comm_ratio",
		"tpsprof_last_step", "tpsprof_records_accepted_total", "tpsprof_records_rejected_total", "tpsprof_step_time_seconds",
		"tpsprof_step_seconds_total", "tpsprof_step_time_share_ratio", "tpsprof_steps_closed_total", "tpsprof_stragglers", "tpsprof_tokens_total", "tpsprof_nats_connected"}
	if err := testutil.CollectAndCompare(metricsCollector{c}, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	// The same through HTTP, with a linter pass over every metric.
	if problems, err := testutil.CollectAndLint(metricsCollector{c}); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
	body := get(t, c, "/metrics")
	if !strings.Contains(body, `tpsprof_cluster_tokens_per_second{job="m1"} 4000`) || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics:\n%.2000s", body)
	}
}

// The live page in a real headless browser: it loads, draws a non-empty
// chart, and shows new steps as they arrive.
func TestLivePageInBrowser(t *testing.T) {
	c, nc := startCollector(t)
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	publishSteps(t, nc, "live", 0, 30)
	c.Sync(5 * time.Second)
	dump := func() string { return dumpDOM(t, srv.URL+"/") }
	dom := dump()
	if !strings.Contains(dom, `id="job-live"`) {
		t.Fatalf("the page shows no job:\n%.3000s", dom)
	}
	path := regexp.MustCompile(`<path d="M([0-9.,L]+)"[^>]*class="series"`).FindStringSubmatch(dom)
	if path == nil || strings.Count(path[1], "L") < 20 {
		t.Fatalf("no chart line with the steps' points:\n%.3000s", dom)
	}
	// x labels at round steps, evenly spaced
	var xt []int
	for _, m := range regexp.MustCompile(`class="xtick"[^>]*>(\d+)<`).FindAllStringSubmatch(dom, -1) {
		v, _ := strconv.Atoi(m[1])
		xt = append(xt, v)
	}
	if len(xt) < 4 {
		t.Errorf("x labels %v", xt)
	} else if d := xt[1] - xt[0]; d <= 0 || xt[0]%d != 0 || (d != 1 && d%5 != 0 && d != 2) {
		t.Errorf("x labels not round: %v", xt)
	}
	stepOf := func(dom string) int {
		m := regexp.MustCompile(`<b class="v-step">(\d+)</b>`).FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("no step figure:\n%.3000s", dom)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if got := stepOf(dom); got != 29 {
		t.Errorf("page shows step %d, want 29", got)
	}
	publishSteps(t, nc, "live", 30, 45)
	c.Sync(5 * time.Second)
	// The summary is shared for summaryCacheFor: the first page's last
	// poll may have built it less than that ago.
	time.Sleep(summaryCacheFor + 100*time.Millisecond)
	if got := stepOf(dump()); got != 44 {
		t.Errorf("after more steps the page shows step %d, want 44", got)
	}
}

// TestBigBatchHandOff sends batches large enough to go to the rank writer
// without a copy, with invalid, duplicate and late records among them:
// exactly the accepted and late rows are written, each once, and the
// cluster rows count only the accepted ones.
func TestBigBatchHandOff(t *testing.T) {
	const world = 600 // over directHandOff
	c, nc := startCollector(t)
	t0 := time.Now().Add(-time.Hour).UnixNano()
	rec := func(step, rank int64) tps.StepRecord {
		return tps.StepRecord{Job: "big", Step: step, Rank: rank, WorldSize: world, Tokens: 10, Node: fmt.Sprintf("n%d", rank/8),
			StartUnixNs: t0 + step*2e9, EndUnixNs: t0 + step*2e9 + 1e9, DurationNs: 1e9}
	}
	var b1 []tps.StepRecord
	for r := int64(0); r < world; r++ {
		b1 = append(b1, rec(0, r))
		if r%100 == 7 {
			bad := rec(0, r)
			bad.Tokens = -1 // rejected: tokens:negative
			b1 = append(b1, bad)
		}
		if r%50 == 3 {
			b1 = append(b1, rec(0, r)) // duplicate within the batch
		}
	}
	// Step 1 lacks rank 5; it comes after step 1 closed by age (late).
	var b2 []tps.StepRecord
	for r := int64(0); r < world; r++ {
		if r != 5 {
			b2 = append(b2, rec(1, r))
		}
	}
	b2 = append(b2, rec(0, 42)) // duplicate of a closed step
	for _, b := range [][]tps.StepRecord{b1, b2} {
		if err := nc.Publish(wire.StepsSubject("big", "n0"), wire.AppendSteps(nil, b)); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	j := c.jobs["big"]
	c.mu.Unlock()
	tl := tally{now: time.Now()}
	j.mu.Lock()
	j.st.closeAll(&tl)
	j.writeRows(false, &tl)
	j.settle(&tl)
	j.mu.Unlock()
	c.apply(&tl)
	late := rec(1, 5)
	nc.Publish(wire.StepsSubject("big", "n0"), wire.AppendSteps(nil, []tps.StepRecord{late}))
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Records != 2*world-1 || st.Duplicates != 13 || st.Late != 1 || st.Rejected["tokens:negative"] != 6 {
		t.Errorf("stats %+v", st)
	}
	// the job's own count, on /metrics: never silent
	if m := get(t, c, "/metrics"); !strings.Contains(m, `tpsprof_job_records_duplicate_total{job="big"} 13`) {
		t.Errorf("/metrics lacks the job's 13 duplicates")
	}
	if s := get(t, c, "/api/summary"); !strings.Contains(s, `"records_duplicate":13`) || !strings.Contains(s, "two processes may report one rank") {
		t.Errorf("the live summary does not say the job's 13 duplicates: %.600s", s)
	}
	out := c.cfg.OutDir
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(out, "big", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]int{}
	for _, r := range rows {
		seen[[2]int64{r.Step, r.Rank}]++
		if r.Tokens != 10 || r.Node != fmt.Sprintf("n%d", r.Rank/8) {
			t.Errorf("row %+v", r)
		}
	}
	if len(rows) != 2*world || len(seen) != 2*world {
		t.Errorf("%d rank rows, %d distinct, want %d", len(rows), len(seen), 2*world)
	}
	cluster, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "big", trace.ClusterSteps))
	if len(cluster) != 2 || cluster[0].RanksReported != world || cluster[1].RanksReported != world-1 {
		t.Errorf("cluster rows %+v", cluster)
	}
}

// A closed step waits for the GPUs of every node its job's records name,
// not only for the GPUs heard from so far: a node whose sampler speaks
// late would otherwise be missing from the first steps' energy.
func TestGPUJoinWaitsForEveryNode(t *testing.T) {
	j := newJobState("g", limits{maxOpenSteps: 8}, nil, nil)
	var tl tally
	j.nodes["a"], j.nodes["b"] = struct{}{}, struct{}{}
	power := 600.0
	sample := func(node string, at int64) tps.GPUSample {
		return tps.GPUSample{Node: node, UUID: "GPU-" + node, UnixNs: at, PowerW: &power}
	}
	j.addGPU([]tps.GPUSample{sample("a", 100), sample("a", 300)}, &tl)
	if len(j.gpuSeries) != 1 {
		t.Fatalf("%d GPU series", len(j.gpuSeries))
	}
	if j.gpuCovered(200) {
		t.Fatal("covered with node b's GPUs not heard from")
	}
	j.addGPU([]tps.GPUSample{sample("b", 300)}, &tl)
	if !j.gpuCovered(200) {
		t.Fatal("not covered once both nodes reported past the step")
	}
	if j.gpuCovered(400) {
		t.Fatal("covered past the last sample")
	}
}

// When a job's folders cannot be created, its rank rows are counted as
// lost rather than buffered without bound, and the collector keeps going.
func TestUncreatableFoldersCountRowsLost(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{OutDir: notDir, NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nc, _ := nats.Connect(srv.URL())
	defer nc.Close()
	publishSteps(t, nc, "lost", 0, 100) // 400 records in one batch: the big-batch path
	publishSteps(t, nc, "lost", 100, 101)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Records != 404 || st.RowsLost != 404 || st.WriteErrors == 0 || st.StepsClosed != 101 {
		t.Errorf("stats %+v", st)
	}
}

// A job whose topology (dp 4 × tp 8 × pp 2) does not match its 4 ranks:
// MFU is unknown everywhere it is shown, with the reason; no figure, and no
// 0 standing for it.
func TestImpossibleMFUShownUnknown(t *testing.T) {
	c, nc := startCollector(t)
	meta, _ := json.Marshal(tps.RunMeta{Job: "mm", Topology: tps.Topology{DP: 4, TP: 8, PP: 2}, ModelPreset: "llama3-8b", GPU: "h100-sxm"})
	if err := nc.Publish(wire.MetaSubject("mm"), meta); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	publishSteps(t, nc, "mm", 0, 5)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if m := get(t, c, "/metrics"); strings.Contains(m, `tpsprof_mfu_ratio{`) || !strings.Contains(m, `tpsprof_last_step{job="mm"} 4`) {
		t.Errorf("/metrics has an MFU sample or no steps:\n%.3000s", m)
	}
	var sum struct {
		Jobs []struct {
			MFU        *float64 `json:"mfu"`
			MFUUnknown string   `json:"mfu_unknown"`
			Steps      []struct {
				MFU *float64 `json:"mfu"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal([]byte(get(t, c, "/api/summary")), &sum); err != nil {
		t.Fatal(err)
	}
	if len(sum.Jobs) != 1 || sum.Jobs[0].MFU != nil || !strings.Contains(sum.Jobs[0].MFUUnknown, "topology") || sum.Jobs[0].Steps[0].MFU != nil {
		t.Errorf("/api/summary: %+v", sum.Jobs)
	}
	c.mu.Lock()
	j := c.jobs["mm"]
	c.mu.Unlock()
	j.mu.Lock()
	j.st.newSinceLog = true
	line := j.st.liveLine(time.Now())
	j.mu.Unlock()
	if !strings.Contains(line, "MFU n/a (the run's topology") {
		t.Errorf("live line: %s", line)
	}
}

// Parts are finalised when an attempt ends (once its last step closes) and
// when a job goes quiet, not a PartAge later: a report works at once.
func TestPartsFinalisedAtAttemptEndAndWhenQuiet(t *testing.T) {
	out := t.TempDir()
	cfg := Config{OutDir: out, Grace: time.Minute, QuietAfter: time.Hour}
	cfg.Writer.PartAge = time.Hour
	c, nc := startCollectorWith(t, cfg)
	parts := func(job, table string) int {
		files, _ := trace.PartFiles(filepath.Join(out, job, table))
		return len(files)
	}
	publishSteps(t, nc, "ended", 0, 5)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	if n := parts("ended", trace.ClusterSteps); n != 0 {
		t.Fatalf("%d cluster parts before the attempt ended (PartAge and QuietAfter are an hour)", n)
	}
	ev, _ := json.Marshal(tps.Event{Job: "ended", Kind: tps.EventAttemptEnd, Rank: -1, StartUnixNs: time.Now().UnixNano(), EndUnixNs: time.Now().UnixNano()})
	nc.Publish(wire.EventsSubject("ended"), ev)
	nc.Flush()
	deadline := time.Now().Add(5 * time.Second)
	for parts("ended", trace.ClusterSteps) == 0 || parts("ended", trace.RankSteps) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("parts not finalised after attempt_end: cluster %d rank %d", parts("ended", trace.ClusterSteps), parts("ended", trace.RankSteps))
		}
		time.Sleep(50 * time.Millisecond)
	}
	rows, err := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "ended", trace.ClusterSteps))
	if err != nil || len(rows) != 5 {
		t.Fatalf("%d cluster rows after the attempt ended (%v), want 5", len(rows), err)
	}

	// quiet: a second collector with QuietAfter 300 ms and no event
	out2 := t.TempDir()
	cfg.OutDir, cfg.QuietAfter = out2, 300*time.Millisecond
	_, nc2 := startCollectorWith(t, cfg)
	publishSteps(t, nc2, "quiet", 0, 3)
	deadline = time.Now().Add(5 * time.Second)
	for {
		files, _ := trace.PartFiles(filepath.Join(out2, "quiet", trace.ClusterSteps))
		if len(files) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("parts of a quiet job not finalised")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// publishTracked publishes recs, waits until the collector has them and
// for a tick of its loop, which tracks the episodes.
func publishTracked(t *testing.T, c *Collector, nc *nats.Conn, subject string, recs []tps.StepRecord) {
	t.Helper()
	if err := nc.Publish(subject, wire.AppendSteps(nil, recs)); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
}

// A rank that slows down mid-run opens a live straggler episode at about
// the step it started, on its node, and closes it when it recovers.
func TestLiveStragglerEpisode(t *testing.T) {
	c, nc := startCollector(t)
	t0 := time.Now().Add(-time.Hour).UnixNano()
	send := func(from, to int64, slow bool) {
		var recs []tps.StepRecord
		for s := from; s < to; s++ {
			for r := int64(0); r < 4; r++ {
				comp := int64(5e8)
				if slow && r == 2 {
					comp = 9e8
				}
				d := int64(1e9)
				recs = append(recs, tps.StepRecord{Job: "ep", Step: s, Rank: r, WorldSize: 4, Tokens: 1000, Node: fmt.Sprintf("n%d", r/2),
					StartUnixNs: t0 + s*2e9, EndUnixNs: t0 + s*2e9 + d, DurationNs: d, ExposedCommNs: d - comp})
			}
		}
		publishTracked(t, c, nc, wire.StepsSubject("ep", "n0"), recs)
	}
	send(0, 20, false)
	send(20, 40, true)
	eps := c.Summary().Jobs[0].StragglerEpisodes
	// it starts where rank 2 slowed down, not where its average crossed
	if len(eps) != 1 || eps[0].Node != "n1" || eps[0].EndStep != nil || eps[0].StartStep != 20 || !slices.Contains(eps[0].Ranks, 2) {
		t.Fatalf("open episode: %+v", eps)
	}
	send(40, 80, false)
	eps = c.Summary().Jobs[0].StragglerEpisodes
	// it ends at rank 2's last slow step, once it kept pace for a window
	if len(eps) != 1 || eps[0].EndStep == nil || *eps[0].EndStep != 39 || eps[0].WorstScore > 0.6 {
		t.Fatalf("closed episode: %+v", eps)
	}
}

// A finished job's open episode is closed at its last step when its
// attempt ends, and its straggler count reads 0: the episode read
// "ongoing" and tpsprof_stragglers stayed 1, firing the shipped alert for a
// job that was over.
func TestEpisodeClosedWhenTheJobEnds(t *testing.T) {
	c, nc := startCollector(t)
	t0 := time.Now().Add(-time.Hour).UnixNano()
	for _, span := range [][2]int64{{0, 20}, {20, 40}} {
		var recs []tps.StepRecord
		for s := span[0]; s < span[1]; s++ {
			for r := int64(0); r < 4; r++ {
				comp := int64(5e8)
				if s >= 20 && r == 2 {
					comp = 9e8
				}
				d := int64(1e9)
				recs = append(recs, tps.StepRecord{Job: "fin", Step: s, Rank: r, WorldSize: 4, Tokens: 1000, Node: fmt.Sprintf("n%d", r/2),
					StartUnixNs: t0 + s*2e9, EndUnixNs: t0 + s*2e9 + d, DurationNs: d, ExposedCommNs: d - comp})
			}
		}
		publishTracked(t, c, nc, wire.StepsSubject("fin", "n0"), recs)
	}
	stragglers := func() int {
		for _, j := range c.jobList() {
			if j.st.id == "fin" {
				return j.live.Load().stragglers
			}
		}
		return -1
	}
	j := c.Summary().Jobs[0]
	if len(j.StragglerEpisodes) != 1 || j.StragglerEpisodes[0].EndStep != nil || stragglers() != 1 {
		t.Fatalf("before the end: episodes %+v, stragglers %d", j.StragglerEpisodes, stragglers())
	}
	ev, _ := json.Marshal(tps.Event{Job: "fin", Kind: tps.EventAttemptEnd, Rank: -1, StartUnixNs: time.Now().UnixNano(), EndUnixNs: time.Now().UnixNano()})
	nc.Publish(wire.EventsSubject("fin"), ev)
	nc.Flush()
	c.Sync(5 * time.Second)
	time.Sleep(400 * time.Millisecond)
	j = c.Summary().Jobs[0]
	if len(j.StragglerEpisodes) != 1 || j.StragglerEpisodes[0].EndStep == nil || *j.StragglerEpisodes[0].EndStep != 39 || stragglers() != 0 {
		t.Errorf("after the end: episodes %+v, stragglers %d", j.StragglerEpisodes, stragglers())
	}
}

// A rank that waits for data (its compute as the others') makes everyone
// wait as a slow GPU would: the live episode opens on its node and says
// why, from the moving averages; likewise a rank with host time outside its
// forward, backward and optimizer, and one that computes more.
func TestLiveStragglerEpisodeCause(t *testing.T) {
	for _, tc := range []struct {
		kind, want string
	}{{"data", "waiting for data: 400.0 ms"}, {"host", "host time outside forward, backward and optimizer: 400.0 ms"}, {"compute", "slow compute: 400.0 ms"}} {
		t.Run(tc.kind, func(t *testing.T) {
			c, nc := startCollector(t)
			t0 := time.Now().Add(-time.Hour).UnixNano()
			var recs []tps.StepRecord
			if tc.kind == "compute" {
				// the slow rank's node runs hot and throttled: the live cause
				// joins its GPU samples against the other node's
				for _, node := range []string{"n0", "n1"} { // each node's agent on its own subject
					var gs []tps.GPUSample
					for i := range 10 {
						clk, temp, why := int64(1980), int64(68), int64(0)
						if node == "n1" {
							clk, temp, why = 1500, 89, 0x40
						}
						gs = append(gs, tps.GPUSample{Node: node, UUID: "GPU-" + node, Name: "H100", UnixNs: time.Now().Add(time.Duration(i-10) * time.Second).UnixNano(),
							SMClockMHz: &clk, TempC: &temp, ClockEventReason: &why})
					}
					nc.Publish(wire.GPUSubject("why", node), wire.AppendGPUSamples(nil, gs))
				}
			}
			send := func() {
				publishTracked(t, c, nc, wire.StepsSubject("why", "n0"), recs)
				recs = recs[:0]
			}
			for s := int64(0); s < 40; s++ {
				if s == 20 {
					send() // the steady steps first: the fastest rank is known
				}
				for r := int64(0); r < 4; r++ {
					data, fwd, host := int64(1e7), int64(3e8), int64(5e7)
					if s >= 20 && r == 2 {
						switch tc.kind {
						case "data":
							data += 4e8
						case "host":
							host += 4e8
						case "compute":
							fwd += 4e8
						}
					}
					own := data + fwd + 1e8 + host
					d := int64(1e9)
					recs = append(recs, tps.StepRecord{Job: "why", Step: s, Rank: r, WorldSize: 4, Tokens: 1000, Node: fmt.Sprintf("n%d", r/2),
						StartUnixNs: t0 + s*1e9, EndUnixNs: t0 + s*1e9 + d, DurationNs: d, DataWaitNs: data, FwdNs: fwd, BwdNs: 1e8,
						ExposedCommNs: d - own, CommNs: d - own})
				}
			}
			send()
			var eps []LiveEpisode
			for i := 0; i < 20; i++ {
				time.Sleep(100 * time.Millisecond) // a tick of the loop tracks episodes
				if eps = c.Summary().Jobs[0].StragglerEpisodes; len(eps) > 0 {
					break
				}
			}
			if len(eps) != 1 || eps[0].Node != "n1" || eps[0].StartStep != 20 || !slices.Contains(eps[0].Ranks, 2) {
				t.Fatalf("episodes %+v, want one on n1 from step 20", eps)
			}
			// the averages have not reached the full 400 ms 20 steps on: the
			// figure is the moving average's; the kind is what matters
			if !strings.HasPrefix(eps[0].Cause, strings.SplitN(tc.want, ":", 2)[0]+":") {
				t.Errorf("cause %q, want %q", eps[0].Cause, tc.want)
			}
			if hot := "GPU clocks 1500 MHz against 1980 MHz on the other nodes (hardware thermal slowdown), 89 °C against 68 °C"; tc.kind == "compute" && !strings.HasSuffix(eps[0].Cause, hot) {
				t.Errorf("cause %q, want it to end %q", eps[0].Cause, hot)
			}
			// what it costs: the 20 one-second steps since it began, each
			// shorter by the excess had rank 2 kept pace, on 4 GPUs
			e := eps[0]
			x := e.ExcessMs / 1e3
			if e.ExcessMs < 200 || e.ExcessMs > 400 || math.Abs(e.TPSIfFixed/e.TPSDuring-1/(1-x)) > 0.01 ||
				math.Abs(e.GPUHoursLost-20*x*4/3600) > 1e-3*e.GPUHoursLost {
				t.Errorf("excess %.1f ms, TPS %.0f during and %.0f had it kept pace, %.5f GPU-hours lost; want %.5f", e.ExcessMs, e.TPSDuring, e.TPSIfFixed, e.GPUHoursLost, 20*x*4/3600)
			}
		})
	}
}

// Parts rotate on the writers' goroutines while metadata keeps arriving:
// the writers read a snapshot, never the job's live fields (run under
// -race: reading j.meta from the writer goroutine was a data race).
func TestRotationWhileMetadataArrives(t *testing.T) {
	cfg := Config{OutDir: t.TempDir(), Grace: time.Minute}
	cfg.Writer.PartAge = time.Millisecond
	c, nc := startCollectorWith(t, cfg)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 300; i++ {
			m, _ := json.Marshal(tps.RunMeta{Job: "rot", ModelPreset: "llama3-8b", GPU: []string{"h100-sxm", "a100-sxm"}[i%2], GPUHourUSD: float64(i + 1)})
			nc.Publish(wire.MetaSubject("rot"), m)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	for s := int64(0); s < 60; s += 5 {
		publishSteps(t, nc, "rot", s, s+5)
		time.Sleep(120 * time.Millisecond)
	}
	<-done
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(cfg.OutDir, "rot", trace.RankSteps))
	if err != nil || len(rows) != 240 {
		t.Fatalf("%d rank rows (%v), want 240", len(rows), err)
	}
}

// Close while batches keep arriving: no panic (a callback running during
// Close used to send on closed writer channels), no job re-created after
// Close, every row handled before it on disk.
func TestCloseDuringPublish(t *testing.T) {
	for round := 0; round < 3; round++ {
		c, nc := startCollector(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := int64(0); ; s++ {
				select {
				case <-stop:
					return
				default:
				}
				var recs []tps.StepRecord
				for r := int64(0); r < 4; r++ {
					recs = append(recs, tps.StepRecord{Job: fmt.Sprintf("cl%d", s%3), Step: s, Rank: r, WorldSize: 4, Tokens: 10,
						StartUnixNs: time.Now().UnixNano() - 2e9, EndUnixNs: time.Now().UnixNano() - 1e9, DurationNs: 1e9})
				}
				nc.Publish(wire.StepsSubject(recs[0].Job, "n0"), wire.AppendSteps(nil, recs))
				nc.Publish(wire.GPUSubject(recs[0].Job, "n0"), []byte("junk"))
			}
		}()
		time.Sleep(100 * time.Millisecond)
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		close(stop)
		wg.Wait()
		c.mu.Lock()
		n := len(c.jobs)
		c.mu.Unlock()
		if n > 3 {
			t.Errorf("%d jobs after close", n)
		}
	}
}

// 10,000 job ids through one collector: it holds at most MaxJobs, rejects
// what it cannot hold as job:limit, and its memory and goroutines stay
// bounded (each job held to be 2 writers and 9.5 MiB, never evicted: 2,000
// jobs took 1.5 GB).
func TestManyJobsBounded(t *testing.T) {
	c, nc := startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: time.Minute, MaxJobs: 64})
	base := runtime.NumGoroutine()
	t0 := time.Now().Add(-time.Hour).UnixNano()
	const n = 10000
	for i := 0; i < n; i++ {
		job := fmt.Sprintf("j%05d", i)
		rec := []tps.StepRecord{{Job: job, Step: 0, Rank: 0, WorldSize: 1, Tokens: 100, StartUnixNs: t0, EndUnixNs: t0 + 1e9, DurationNs: 1e9}}
		nc.Publish(wire.StepsSubject(job, "n0"), wire.AppendSteps(nil, rec))
	}
	nc.Flush()
	if err := c.Sync(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	g := runtime.NumGoroutine()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if st.Jobs != 64 || st.Records != 64 || st.Rejected["job:limit"] != n-64 {
		t.Errorf("jobs %d, accepted %d, job:limit %d", st.Jobs, st.Records, st.Rejected["job:limit"])
	}
	if g > base+64*filesPerJob+16 || ms.HeapInuse > 256<<20 {
		t.Errorf("%d goroutines (base %d), heap %d MiB", g, base, ms.HeapInuse>>20)
	}
	t.Logf("10,000 job ids: %d held, %d goroutines over the base, heap %d MiB", st.Jobs, g-base, ms.HeapInuse>>20)
}

// Idle jobs are evicted (after EvictAfter, or to make room for a new one
// once quiet): their parts are finalised, their writers stopped, and a job
// that comes back starts new parts; every accepted row is on disk once.
func TestIdleJobsEvicted(t *testing.T) {
	out := t.TempDir()
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute, MaxJobs: 8,
		QuietAfter: 5 * time.Millisecond, EvictAfter: 100 * time.Millisecond})
	base := runtime.NumGoroutine()
	t0 := time.Now().Add(-time.Hour).UnixNano()
	maxG := 0
	for i := 0; i < 48; i++ {
		job := fmt.Sprintf("e%d", i%16) // each id comes back three times
		rec := []tps.StepRecord{{Job: job, Step: int64(i), Rank: 0, WorldSize: 1, Tokens: 100, StartUnixNs: t0 + int64(i)*1e9, EndUnixNs: t0 + int64(i)*1e9 + 1e8, DurationNs: 1e8}}
		nc.Publish(wire.StepsSubject(job, "n0"), wire.AppendSteps(nil, rec))
		if i%8 == 7 {
			nc.Flush()
			c.Sync(5 * time.Second)
			time.Sleep(300 * time.Millisecond) // rows written at the tick, then quiet
			maxG = max(maxG, runtime.NumGoroutine())
		}
	}
	st := c.Stats()
	if st.Evicted < 32 || st.Records+st.Rejected["job:limit"] != 48 || st.Jobs > 8 {
		t.Errorf("evicted %d, accepted %d + job:limit %d, jobs %d", st.Evicted, st.Records, st.Rejected["job:limit"], st.Jobs)
	}
	if maxG > base+(8+64)*4+16 {
		t.Errorf("%d goroutines at most (base %d): writers of evicted jobs not stopped", maxG, base)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	rows := 0
	for i := 0; i < 16; i++ {
		r, err := trace.ReadAll[tps.StepRecord](filepath.Join(out, fmt.Sprintf("e%d", i), trace.RankSteps))
		if err != nil {
			t.Fatal(err)
		}
		rows += len(r)
	}
	if int64(rows) != st.Records {
		t.Errorf("%d rank rows on disk, %d accepted", rows, st.Records)
	}
}

// Hostile or unlucky values that used to move or freeze a job: a step number
// of 2^62 from one rank (every later step was late), a GPU sample stamped an
// hour ahead (every later sample looked stale); each is a counted
// rejection, and the job's rows keep coming.
func TestAbsurdStepAndFutureGPUSample(t *testing.T) {
	c, nc := startCollector(t)
	publishSteps(t, nc, "ab", 0, 5)
	c.Sync(5 * time.Second)
	t0 := time.Now().Add(-time.Hour).UnixNano()
	bad := []tps.StepRecord{{Job: "ab", Step: 1 << 62, Rank: 0, WorldSize: 4, Tokens: 1000, StartUnixNs: t0, EndUnixNs: t0 + 1e9, DurationNs: 1e9}}
	nc.Publish(wire.StepsSubject("ab", "n0"), wire.AppendSteps(nil, bad))
	future := []tps.GPUSample{{Node: "n0", UUID: "GPU-1", Name: "NVIDIA H100", UnixNs: time.Now().Add(time.Hour).UnixNano()}}
	nc.Publish(wire.GPUSubject("ab", "n0"), wire.AppendGPUSamples(nil, future))
	publishSteps(t, nc, "ab", 5, 10)
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	// 2^62 is past tps.MaxStep: rejected as out of range before the
	// jump check sees it
	if st.Rejected["step:out_of_range"] != 1 || st.Rejected["unix_ns:out_of_range"] != 1 {
		t.Errorf("rejections: %v", st.Rejected)
	}
	if st.StepsClosed != 10 || st.Late != 0 {
		t.Errorf("steps closed %d, late %d: the absurd step moved the window", st.StepsClosed, st.Late)
	}
	if s := c.Summary(); s.OutDir != filepath.Base(s.OutDir) {
		t.Errorf("/api/summary gives the output path %q", s.OutDir)
	}
}

// A collector that died (kill -9) left unfinished parts: the next one
// removes those older than two part ages and counts them, and
// /metrics exports rows lost, slow-consumer drops and stale parts.
func TestStalePartsRemovedAndLossesExported(t *testing.T) {
	out := t.TempDir()
	dir := filepath.Join(out, "dead", trace.RankSteps)
	os.MkdirAll(dir, 0o755)
	old := filepath.Join(dir, ".part-20260101T000000.000000000Z-h-1-00001.parquet.tmp")
	fresh := filepath.Join(dir, ".part-20260101T000000.000000000Z-h-2-00001.parquet.tmp")
	os.WriteFile(old, []byte("PAR1"), 0o644)
	os.WriteFile(fresh, []byte("PAR1"), 0o644)
	past := time.Now().Add(-time.Hour)
	os.Chtimes(old, past, past)
	c, _ := startCollectorWith(t, Config{OutDir: out})
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the stale part is still there: %v", err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh part (maybe another writer's) was removed: %v", err)
	}
	if st := c.Stats(); st.StaleParts != 1 {
		t.Errorf("stale parts %d", st.StaleParts)
	}
	body := get(t, c, "/metrics")
	for _, m := range []string{"tpsprof_stale_parts_removed_total 1", "tpsprof_rows_lost_total 0", "tpsprof_nats_slow_consumer_drops_total 0"} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
}

// A stray record with another world size (an older attempt's late record,
// a misconfigured rank) is rejected; it no longer closes the job's open
// steps. A new attempt at another size is a relaunch and is taken.
func TestStrayWorldSize(t *testing.T) {
	c, nc := startCollector(t)
	t0 := time.Now().Add(-time.Hour).UnixNano()
	rec := func(attempt, step, rank, world int64) tps.StepRecord {
		return tps.StepRecord{Job: "ws", Attempt: attempt, Step: step, Rank: rank, WorldSize: world, Tokens: 1000,
			StartUnixNs: t0 + step*2e9, EndUnixNs: t0 + step*2e9 + 1e9, DurationNs: 1e9}
	}
	pub := func(recs ...tps.StepRecord) {
		nc.Publish(wire.StepsSubject("ws", "n0"), wire.AppendSteps(nil, recs))
		nc.Flush()
		c.Sync(5 * time.Second)
	}
	attempt1 := func(step int64, ranks ...int64) (out []tps.StepRecord) {
		for _, r := range ranks {
			out = append(out, rec(1, step, r, 8))
		}
		return
	}
	pub(attempt1(0, 0, 1, 2, 3, 4, 5, 6)...)    // step 0: 7 of 8 ranks so far
	pub(rec(0, 99, 0, 16), rec(1, 1, 3, 16))    // stray: an older attempt's, and one of this attempt's at 16
	pub(attempt1(0, 7)...)                      // the eighth rank: step 0 closes whole
	pub(attempt1(1, 0, 1, 2, 3, 4, 5, 6, 7)...) // step 1
	rows := c.Recent("ws")
	st := c.Stats()
	if st.Rejected["world_size:mismatch"] != 2 || len(rows) != 2 {
		t.Fatalf("rejected %v, %d rows", st.Rejected, len(rows))
	}
	for _, r := range rows {
		if r.RanksReported != 8 || r.Tokens != 8000 || r.WorldSize != 8 {
			t.Errorf("step %d: %d ranks, %d tokens, world %d", r.Step, r.RanksReported, r.Tokens, r.WorldSize)
		}
	}
	pub(rec(2, 0, 0, 4), rec(2, 0, 1, 4), rec(2, 0, 2, 4), rec(2, 0, 3, 4)) // a relaunch at 4 ranks
	if rows := c.Recent("ws"); len(rows) != 3 || rows[2].WorldSize != 4 || rows[2].RanksReported != 4 {
		t.Errorf("relaunch at another size: %+v", rows[len(rows)-1])
	}
}

// Close without a Sync first handles every message the server had sent
// before it (nats.go's drain: the client's pending messages go through
// their handlers, which have returned before the jobs are finished): all
// rows of 2,000 batches published and flushed just before are in Parquet.
func TestCloseDrainsWhatTheClientHolds(t *testing.T) {
	out := t.TempDir()
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute})
	const steps = 2000
	t0 := time.Now().Add(-time.Hour).UnixNano()
	for s := int64(0); s < steps; s++ {
		var recs []tps.StepRecord
		for r := int64(0); r < 4; r++ {
			recs = append(recs, tps.StepRecord{Job: "drain", Step: s, Rank: r, WorldSize: 4, Tokens: 1000,
				StartUnixNs: t0 + s*2e6, EndUnixNs: t0 + s*2e6 + 1e6, DurationNs: 1e6})
		}
		if err := nc.Publish(wire.StepsSubject("drain", "n0"), wire.AppendSteps(nil, recs)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Records != 4*steps || st.AfterClose != 0 {
		t.Errorf("records %d (want %d), dropped after close %d", st.Records, 4*steps, st.AfterClose)
	}
	count := func(table string) int {
		files, err := trace.PartFiles(filepath.Join(out, "drain", table))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range files {
			var rows int
			switch table {
			case trace.RankSteps:
				r, err := trace.ReadFile[tps.StepRecord](f)
				if err != nil {
					t.Fatal(err)
				}
				rows = len(r)
			default:
				r, err := trace.ReadFile[tps.ClusterStep](f)
				if err != nil {
					t.Fatal(err)
				}
				rows = len(r)
			}
			n += rows
		}
		return n
	}
	if n := count(trace.RankSteps); n != 4*steps {
		t.Errorf("rank_steps: %d rows, want %d", n, 4*steps)
	}
	if n := count(trace.ClusterSteps); n != steps {
		t.Errorf("cluster_steps: %d rows, want %d", n, steps)
	}
}

// dumpDOM loads url in headless Chromium and returns the DOM once its
// scripts ran.
func dumpDOM(t *testing.T, url string) string {
	t.Helper()
	dom, err := browser.DumpDOM(url, t.TempDir())
	if err != nil {
		t.Fatalf("the live page in a browser: %v", err)
	}
	return dom
}

// One stalled step (a rank descheduled for ten times its pace) lifts its
// moving average over the threshold but opens no episode and flags no
// straggler; three slow steps of five do.
func TestOneStalledStepIsNoEpisode(t *testing.T) {
	c, nc := startCollector(t)
	t0 := time.Now().Add(-time.Hour).UnixNano()
	send := func(from, to int64, comp func(s, r int64) int64) {
		var recs []tps.StepRecord
		for s := from; s < to; s++ {
			for r := int64(0); r < 4; r++ {
				d := int64(6e9)
				recs = append(recs, tps.StepRecord{Job: "stall", Step: s, Rank: r, WorldSize: 4, Tokens: 1000, Node: "n0",
					StartUnixNs: t0 + s*1e10, EndUnixNs: t0 + s*1e10 + d, DurationNs: d, ExposedCommNs: d - comp(s, r)})
			}
		}
		publishTracked(t, c, nc, wire.StepsSubject("stall", "n0"), recs)
	}
	send(0, 20, func(s, r int64) int64 { return 5e8 })
	// rank 0 stalls once at step 20 (5 s against 0.5 s), then keeps pace
	send(20, 24, func(s, r int64) int64 {
		if s == 20 && r == 0 {
			return 5e9
		}
		return 5e8
	})
	j := c.Summary().Jobs[0]
	if len(j.StragglerEpisodes) != 0 || len(j.SlowestRanks) == 0 || j.SlowestRanks[0].Straggler {
		t.Fatalf("one stalled step opened %+v, slowest %+v", j.StragglerEpisodes, j.SlowestRanks)
	}
	if j.SlowestRanks[0].Rank != 0 || j.SlowestRanks[0].Score >= tps.StragglerThreshold {
		t.Fatalf("rank 0's average should still be under the threshold (else the test shows nothing): %+v", j.SlowestRanks)
	}
	// rank 3 slow at steps 24, 26 and 27 of 24..28: an episode from 26 (its current run)
	send(24, 29, func(s, r int64) int64 {
		if r == 3 && (s == 24 || s == 26 || s == 27) {
			return 3e9
		}
		return 5e8
	})
	j = c.Summary().Jobs[0]
	if len(j.StragglerEpisodes) != 1 || !slices.Contains(j.StragglerEpisodes[0].Ranks, 3) || slices.Contains(j.StragglerEpisodes[0].Ranks, 0) {
		t.Fatalf("rank 3 slow 3 steps of 5: episodes %+v (slowest %+v)", j.StragglerEpisodes, j.SlowestRanks)
	}
}

// A job that declares no model but whose ranks count FLOPs with PyTorch
// (flop_count events) has MFU live, from the count, marked as counted: in
// the summary (mfu_source), the live line and the published figures. The
// report had it; the live views said "MFU n/a".
func TestLiveMFUFromCountedFLOPs(t *testing.T) {
	c, nc := startCollector(t)
	meta, _ := json.Marshal(tps.RunMeta{Job: "cnt", GPU: "h100-sxm"})
	if err := nc.Publish(wire.MetaSubject("cnt"), meta); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Add(-time.Hour).UnixNano()
	const perRankFLOPs, tokens, d = 3e14, 4096, int64(1e9) // 2 ranks: 6e14 / 4096 tokens, MFU 0.30 on H100s
	for s := int64(0); s < 12; s++ {
		if s == 4 {
			for r := int64(0); r < 2; r++ {
				ev, _ := json.Marshal(tps.Event{Job: "cnt", Kind: tps.EventFlopCount, Rank: r, Step: s, StartUnixNs: t0 + s*d, EndUnixNs: t0 + s*d + d,
					Detail: fmt.Sprintf(`{"flops":%g}`, perRankFLOPs)})
				nc.Publish(wire.EventsSubject("cnt"), ev)
			}
		}
		var recs []tps.StepRecord
		for r := int64(0); r < 2; r++ {
			recs = append(recs, tps.StepRecord{Job: "cnt", Step: s, Rank: r, WorldSize: 2, Tokens: tokens / 2, Node: "n0",
				StartUnixNs: t0 + s*d, EndUnixNs: t0 + s*d + d, DurationNs: d})
		}
		publishTracked(t, c, nc, wire.StepsSubject("cnt", "n0"), recs)
	}
	j := c.Summary().Jobs[0]
	peak, _ := (&tps.RunMeta{GPU: "h100-sxm"}).Peak("")
	want := float64(tokens) * (2 * perRankFLOPs / tokens) / (2 * peak) // TPS (4096/s) × FLOPs a token / (GPUs × peak)
	if j.MFU == nil || math.Abs(*j.MFU-want) > 1e-9*want || j.MFUSource != "counted" {
		t.Fatalf("live MFU %v (source %q), want %v from the count", j.MFU, j.MFUSource, want)
	}
	for _, jb := range c.jobList() {
		if jb.st.id == "cnt" {
			jb.mu.Lock()
			line := jb.st.liveLine(time.Now())
			jb.mu.Unlock()
			if !strings.Contains(line, "(counted FLOPs)") {
				t.Errorf("live line %q", line)
			}
			if f := clusterFigures("cnt", jb.live.Load()); !f.MFUCounted || f.MFU == nil || math.Abs(f.MFULost[tps.ComputeEfficiency]-100*(1-want)) > 1e-6 {
				t.Errorf("published figures %+v", f)
			}
		}
	}
	// where the MFU went: every step computes (no blocking part), so all
	// of the lost points are compute efficiency; in the summary, /metrics
	// and the page
	if l := j.MFULedger; l == nil || math.Abs(l.Sum()-100) > 1e-9 || math.Abs(l.MFU-100*want) > 1e-6 || math.Abs(l.Lost[len(l.Lost)-1].Points-100*(1-want)) > 1e-6 {
		t.Errorf("live MFU ledger %+v (%s)", l, j.MFULedgerUnknown)
	}
	if m := get(t, c, "/metrics"); !strings.Contains(m, fmt.Sprintf(`tpsprof_mfu_lost_points{bucket="compute_efficiency",job="cnt"} %g`, 100*(1-want))) {
		t.Errorf("/metrics: %q", regexp.MustCompile(`(?m)^tpsprof_mfu_lost_points.*$`).FindAllString(m, -1))
	}
	srv := httptest.NewServer(c.Handler())
	dom := dumpDOM(t, srv.URL+"/")
	srv.Close()
	if !strings.Contains(dom, fmt.Sprintf("MFU ledger: %.1f of 100 points; lost: compute efficiency %.1f", 100*want, 100*(1-want))) {
		t.Errorf("the live page does not show the MFU ledger:\n%.3000s", dom)
	}
}
