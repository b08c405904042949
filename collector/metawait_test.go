package collector

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// Records that reach the collector before their job's metadata (it travels
// on a subject of its own) are held, not aggregated without the topology:
// a 4-rank job of 2 tensor-parallel pairs whose records carry no
// coordinates sends 5 steps, then its metadata. The steps close when it
// arrives, each pair's tokens counted once and MFU known. Before, these
// steps were summed over the tensor-parallel peers (tokens doubled) with
// no model. A job that never sends metadata closes its steps MetaWait
// after its first record, under pure data parallelism.
func TestStepsHeldForLateMetadata(t *testing.T) {
	out := t.TempDir()
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute, MetaWait: 1500 * time.Millisecond})
	t0 := time.Now().Add(-time.Hour).UnixNano()
	send := func(job string) {
		var recs []tps.StepRecord
		for s := int64(0); s < 5; s++ {
			for r := int64(0); r < 4; r++ {
				recs = append(recs, tps.StepRecord{Job: job, Step: s, Rank: r, WorldSize: 4, Tokens: 1000, Node: "n0",
					StartUnixNs: t0 + s*2e9, EndUnixNs: t0 + s*2e9 + 1e9, DurationNs: 1e9})
			}
		}
		if err := nc.Publish(wire.StepsSubject(job, "n0"), wire.AppendSteps(nil, recs)); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	send("late")
	send("never")
	waitFor := func(what string, ok func(Stats) bool) Stats {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st := c.Stats()
			if ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v", what, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	st := waitFor("the 10 steps open", func(s Stats) bool { return s.OpenSteps+int(s.StepsClosed) == 10 })
	if st.StepsClosed != 0 && time.Since(began) < 1500*time.Millisecond {
		t.Fatalf("before the metadata: %d steps closed; want them held", st.StepsClosed)
	}
	meta, _ := json.Marshal(tps.RunMeta{Job: "late", Topology: tps.Topology{DP: 2, TP: 2}, ModelPreset: "llama3-8b", GPU: "h100-sxm", DType: "bf16"})
	if err := nc.Publish(wire.MetaSubject("late"), meta); err != nil {
		t.Fatal(err)
	}
	waitFor("the late job's steps closed", func(s Stats) bool { return s.StepsClosed >= 5 })
	if held := time.Since(began); held < 1500*time.Millisecond {
		if st := c.Stats(); st.StepsClosed != 5 {
			t.Errorf("after %v: %d steps closed, want the 5 of the job whose metadata came", held, st.StepsClosed)
		}
	}
	waitFor("every step closed", func(s Stats) bool { return s.StepsClosed == 10 })
	if d := time.Since(began); d < 1500*time.Millisecond {
		t.Errorf("the job without metadata closed its steps after %v, want 1.5 s", d)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for job, want := range map[string]struct{ tokens, replicas int64 }{"late": {2000, 2}, "never": {4000, 4}} {
		rows, err := trace.ReadAll[tps.ClusterStep](filepath.Join(out, job, trace.ClusterSteps))
		if err != nil || len(rows) != 5 {
			t.Fatalf("%s: %d rows, %v", job, len(rows), err)
		}
		for _, r := range rows {
			if r.Tokens != want.tokens || r.Replicas != want.replicas || r.TokenMismatchReplicas != 0 {
				t.Errorf("%s step %d: %d tokens over %d replicas, want %d over %d", job, r.Step, r.Tokens, r.Replicas, want.tokens, want.replicas)
			}
			if job == "late" && (r.MFU <= 0 || r.MFUUnknown != "") {
				t.Errorf("late step %d: MFU %g unknown %q, want it computed from the late model", r.Step, r.MFU, r.MFUUnknown)
			}
		}
	}
}

// A job whose 64 declared ranks never all report (2 do) says so at the
// top of its live page: its figures count only the ranks that reported.
func TestNeverCompleteSaysSoLive(t *testing.T) {
	c, nc := startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: 100 * time.Millisecond})
	t0 := time.Now().Add(-time.Hour).UnixNano()
	var recs []tps.StepRecord
	for s := int64(0); s < 3; s++ {
		for r := int64(0); r < 2; r++ {
			recs = append(recs, tps.StepRecord{Job: "few", Step: s, Rank: r, WorldSize: 64, Tokens: 1000,
				StartUnixNs: t0 + s*2e9, EndUnixNs: t0 + s*2e9 + 1e9, DurationNs: 1e9})
		}
	}
	if err := nc.Publish(wire.StepsSubject("few", "n0"), wire.AppendSteps(nil, recs)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().StepsClosed < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(summaryCacheFor)
	var sum LiveSummary
	if err := json.Unmarshal([]byte(get(t, c, "/api/summary")), &sum); err != nil {
		t.Fatal(err)
	}
	if len(sum.Jobs) != 1 || sum.Jobs[0].Note != "no step has had all 64 declared ranks (at most 2 reported): the figures count only the ranks that reported" {
		t.Errorf("/api/summary: %+v", sum.Jobs)
	}
}

// A collector whose clock is 15 minutes behind the nodes' accepts their
// records (the agents checked them against the clock they were measured
// on); a record two days ahead is still a broken clock, refused.
func TestCollectorClockBehindTheNodes(t *testing.T) {
	c, nc := startCollector(t)
	ahead := time.Now().Add(15 * time.Minute).UnixNano()
	var recs []tps.StepRecord
	for s := int64(0); s < 3; s++ {
		for r := int64(0); r < 2; r++ {
			recs = append(recs, tps.StepRecord{Job: "behind", Step: s, Rank: r, WorldSize: 2, Tokens: 1000,
				StartUnixNs: ahead + s*2e9, EndUnixNs: ahead + s*2e9 + 1e9, DurationNs: 1e9})
		}
	}
	far := time.Now().Add(48 * time.Hour).UnixNano()
	recs = append(recs, tps.StepRecord{Job: "behind", Step: 3, Rank: 0, WorldSize: 2, Tokens: 1000, StartUnixNs: far, EndUnixNs: far + 1e9, DurationNs: 1e9})
	if err := nc.Publish(wire.StepsSubject("behind", "n0"), wire.AppendSteps(nil, recs)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.Stats().StepsClosed < 3 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := c.Stats(); st.StepsClosed != 3 || st.Rejected["end_unix_ns:out_of_range"] != 1 {
		t.Errorf("%d steps closed, rejections %v; want 3 and the two-day-ahead record refused", st.StepsClosed, st.Rejected)
	}
}

// A silent job is told from a running one on /metrics: the last step's
// timestamp stays, the throughput gauges go once it is silent past
// StaleAfter (a hung job's last TPS no longer looks current), and
// tpsprof_job_running turns 0 when its attempt ends.
func TestSilentJobMetrics(t *testing.T) {
	c, nc := startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: time.Minute, StaleAfter: 2 * time.Second})
	before := float64(time.Now().UnixNano()) / 1e9
	publishSteps(t, nc, "s1", 0, 3)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	m := get(t, c, "/metrics")
	ts := regexp.MustCompile(`tpsprof_last_step_timestamp_seconds\{job="s1"\} (\S+)`).FindStringSubmatch(m)
	if ts == nil || !strings.Contains(m, `tpsprof_cluster_tokens_per_second{job="s1"}`) || !strings.Contains(m, `tpsprof_job_running{job="s1"} 1`) {
		t.Fatalf("a running job's metrics:\n%s", m)
	}
	if v, _ := strconv.ParseFloat(ts[1], 64); v < before-1 || v > float64(time.Now().UnixNano())/1e9+1 {
		t.Errorf("last step timestamp %s, want about now (%f)", ts[1], before)
	}
	time.Sleep(2200 * time.Millisecond)
	m = get(t, c, "/metrics")
	if strings.Contains(m, `tpsprof_cluster_tokens_per_second{job="s1"}`) || !strings.Contains(m, `tpsprof_last_step_timestamp_seconds{job="s1"}`) {
		t.Errorf("a job silent past StaleAfter still exports its TPS, or lost its timestamp:\n%s", m)
	}
	ev, _ := json.Marshal(tps.Event{Job: "s1", Kind: tps.EventAttemptEnd, Rank: 0, StartUnixNs: time.Now().UnixNano()})
	nc.Publish(wire.EventsSubject("s1"), ev)
	// The collector's Sync waits for what the server has sent it; the
	// event must have left this connection first.
	nc.Flush()
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if m = get(t, c, "/metrics"); !strings.Contains(m, `tpsprof_job_running{job="s1"} 0`) {
		t.Errorf("an ended job still running:\n%s", m)
	}
}

// The live summary lists running jobs first (most recent step first),
// then silent, ended and empty ones with their state, whatever their names.
func TestSummaryRunningFirst(t *testing.T) {
	c, nc := startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: time.Minute, StaleAfter: 2 * time.Second})
	publishSteps(t, nc, "a-old", 0, 3)
	c.Sync(5 * time.Second)
	time.Sleep(2200 * time.Millisecond)
	publishSteps(t, nc, "z-new", 0, 3)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	s := c.Summary()
	if len(s.Jobs) != 2 || s.Jobs[0].Job != "z-new" || s.Jobs[0].State != "running" || s.Jobs[1].State != "silent" || s.Jobs[1].LastStepUnixMs == 0 {
		var got []string
		for _, j := range s.Jobs {
			got = append(got, j.Job+":"+j.State)
		}
		t.Errorf("jobs %v, want z-new:running then a-old:silent", got)
	}
}
