// Package e2e tests the whole path with real parts: simulated ranks write
// JSON lines to real agents' unix sockets, agents publish to the real
// nats-server (in process, random port), the collector aggregates and
// writes Parquet, and the test reads the files back.
package e2e

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

type env struct {
	srv    *natsconn.Embedded
	col    *collector.Collector
	agents []*agent.Agent
	out    string
}

func startEnv(t *testing.T, nodes int, grace time.Duration) *env {
	t.Helper()
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	e := &env{srv: srv, out: t.TempDir()}
	e.col, err = collector.New(collector.Config{OutDir: e.out, NATS: natsconn.Options{URL: srv.URL()}, Grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "tpsprof-e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	for n := 0; n < nodes; n++ {
		a, err := agent.Start(agent.Config{Socket: filepath.Join(sockDir, "n"+string(rune('0'+n))+".sock"),
			NATS: natsconn.Options{URL: srv.URL()}, Node: "node-" + string(rune('0'+n)), FlushInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		e.agents = append(e.agents, a)
	}
	return e
}

// accounted is how many intake lines an agent has fully handled: accepted
// as a record, event or metadata, or rejected.
func accounted(a *agent.Agent) int64 {
	s := a.Stats()
	n := s.Records + s.Events + s.Metas
	for _, v := range s.Rejected {
		n += v
	}
	return n
}

// waitLines waits until the agents together have handled n intake lines.
func (e *env) waitLines(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var got int64
		for _, a := range e.agents {
			got += accounted(a)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agents read %d lines, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// finish waits until the agents have read lines intake lines, flushes
// them, waits for the collector to have everything and closes it
// (finalising the Parquet parts).
func (e *env) finish(t *testing.T, lines int64) {
	t.Helper()
	e.waitLines(t, lines)
	for _, a := range e.agents {
		if err := a.Flush(5 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.col.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := e.col.Close(); err != nil {
		t.Fatal(err)
	}
}

// stepT0 is where stepRec's steps start: one time base for every record,
// so consecutive steps' periods are exactly 2 s.
var stepT0 = time.Now().Add(-time.Hour).UnixNano()

func stepRec(job string, step, rank, world, tokens, durNs int64) tps.StepRecord {
	start := stepT0 + step*2e9
	return tps.StepRecord{Job: job, Step: step, Rank: rank, WorldSize: world, Tokens: tokens,
		StartUnixNs: start, EndUnixNs: start + durNs, DurationNs: durNs}
}

func TestEndToEndClusterTPS(t *testing.T) {
	e := startEnv(t, 2, 5*time.Second)
	topo := tps.Topology{DP: 2, TP: 2, PP: 2} // 8 ranks, 4 per node
	meta := tps.RunMeta{Job: "e2e", Topology: topo, ModelPreset: "llama3-8b", GPU: "h100-sxm"}
	if err := e.agents[0].SubmitMeta(meta); err != nil {
		t.Fatal(err)
	}
	e.agents[0].Flush(time.Second)
	e.col.Sync(time.Second)
	clients := make([]*client.Client, 8)
	for r := range clients {
		clients[r] = client.New(e.agents[r/4].Socket(), client.Options{})
	}
	const steps = 20
	for s := int64(0); s < steps; s++ {
		for r := int64(0); r < 8; r++ {
			dur := int64(1e9)
			if r == 5 {
				dur = 2e9 // slowest rank: step time 2 s
			}
			clients[r].RecordStep(stepRec("e2e", s, r, 8, 65536, dur))
		}
	}
	// a duplicate of rank 3's step 4 through another connection
	dup := client.New(e.agents[0].Socket(), client.Options{})
	dup.RecordStep(stepRec("e2e", 4, 3, 8, 65536, 1e9))
	for _, c := range append(clients, dup) {
		c.Close(5 * time.Second)
		if sent, dropped, _ := c.Counts(); dropped != 0 {
			t.Fatalf("client dropped %d (sent %d)", dropped, sent)
		}
	}
	e.finish(t, 162) // 161 record lines and the metadata

	st := e.col.Stats()
	if st.Records != 160 || st.Duplicates != 1 || st.StepsClosed != steps || st.Incomplete != 0 {
		t.Errorf("stats: %+v", st)
	}
	rows, err := trace.ReadAll[tps.ClusterStep](filepath.Join(e.out, "e2e", trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != steps {
		t.Fatalf("got %d cluster rows, want %d", len(rows), steps)
	}
	for _, c := range rows {
		// 2 replicas × 65536 tokens in 2 s, never × TP×PP
		if c.Tokens != 131072 || c.TPS != 65536 || c.RanksReported != 8 || c.SlowestRank != 5 {
			t.Fatalf("step %d: tokens %d TPS %g ranks %d slowest %d", c.Step, c.Tokens, c.TPS, c.RanksReported, c.SlowestRank)
		}
		if c.MFU <= 0 {
			t.Fatalf("step %d: no MFU although the metadata names model and GPU", c.Step)
		}
	}
	ranks, err := trace.ReadAll[tps.StepRecord](filepath.Join(e.out, "e2e", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	if len(ranks) != 160 {
		t.Errorf("got %d rank rows, want 160 (the duplicate written once)", len(ranks))
	}
	for _, r := range ranks {
		want := "node-0"
		if r.Rank >= 4 {
			want = "node-1"
		}
		if r.Node != want {
			t.Fatalf("rank %d: node %q, want %q (filled by the agent)", r.Rank, r.Node, want)
		}
	}
}

// A rank that never reports: the step closes after the grace period with the
// missing rank counted; its record arriving later is written to rank_steps
// as late and does not change the closed row.
func TestEndToEndMissingAndLateRanks(t *testing.T) {
	e := startEnv(t, 1, 300*time.Millisecond)
	c := client.New(e.agents[0].Socket(), client.Options{})
	for r := int64(0); r < 3; r++ { // rank 3 of 4 is missing
		c.RecordStep(stepRec("miss", 0, r, 4, 100, 1e9))
	}
	c.Close(5 * time.Second)
	e.waitLines(t, 3)
	e.agents[0].Flush(5 * time.Second)
	e.col.Sync(5 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for e.col.Stats().StepsClosed == 0 {
		if time.Now().After(deadline) {
			t.Fatal("step not closed after the grace period")
		}
		time.Sleep(20 * time.Millisecond)
	}
	late := client.New(e.agents[0].Socket(), client.Options{})
	late.RecordStep(stepRec("miss", 0, 3, 4, 100, 1e9))
	late.RecordStep(stepRec("miss", 0, 3, 4, 100, 1e9)) // and its duplicate
	late.Close(5 * time.Second)
	e.finish(t, 5)

	st := e.col.Stats()
	if st.Late != 1 || st.Duplicates != 1 || st.Incomplete != 1 {
		t.Errorf("got late=%d duplicates=%d incomplete=%d, want 1 1 1", st.Late, st.Duplicates, st.Incomplete)
	}
	rows, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(e.out, "miss", trace.ClusterSteps))
	if len(rows) != 1 || rows[0].RanksMissing != 1 || rows[0].RanksReported != 3 || rows[0].Tokens != 300 {
		t.Fatalf("cluster rows: %+v", rows)
	}
	ranks, _ := trace.ReadAll[tps.StepRecord](filepath.Join(e.out, "miss", trace.RankSteps))
	if len(ranks) != 4 {
		t.Errorf("got %d rank rows, want 4 (the late one included, its duplicate not)", len(ranks))
	}
}

// Garbage on the socket is counted by reason and everything else goes on.
func TestEndToEndBadLinesCounted(t *testing.T) {
	e := startEnv(t, 1, 5*time.Second)
	conn, err := net.Dial("unix", e.agents[0].Socket())
	if err != nil {
		t.Fatal(err)
	}
	good := stepRec("bad", 0, 0, 1, 10, 1e9)
	goodLine, _ := json.Marshal(good)
	lines := []string{
		"not json at all",
		`{"job":"bad","step":"zero"}`,
		`{"job":"bad","step":0,"rank":0,"world_size":1,"tokens":-1,"start_unix_ns":1760000000000000000,"end_unix_ns":1760000001000000000}`,
		`{"job":"no spaces allowed","step":0,"rank":0,"world_size":1,"tokens":1,"start_unix_ns":1760000000000000000,"end_unix_ns":1760000001000000000}`,
		`{"type":"mystery"}`,
		"\x00\x01\x02\xff\xfe",
		`{"job":"bad","step":0,"rank":0,"world_size":1,"tokens":1,"start_unix_ns":1,"end_unix_ns":2}`,
		strings.Repeat("x", 100<<10), // over the 64 KiB cap
		`{"job":"bad","step":1,"rank":0,"world_size":1,"TOKENS":1,"start_unix_ns":1760000000000000000,"end_unix_ns":1760000001000000000}`,
		string(goodLine),
	}
	for _, l := range lines {
		if _, err := conn.Write([]byte(l + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	e.waitLines(t, int64(len(lines)))
	st := e.agents[0].Stats()
	want := map[string]int64{"line:not_json_object": 2, "line:json": 1, "tokens:negative": 1, "job:invalid": 1,
		"line:unknown_type": 1, "start_unix_ns:out_of_range": 1, "line:oversized": 1, "line:key_case": 1}
	for k, v := range want {
		if st.Rejected[k] != v {
			t.Errorf("rejected[%s] = %d, want %d (all: %v)", k, st.Rejected[k], v, st.Rejected)
		}
	}
	if st.Records != 1 {
		t.Errorf("accepted %d records, want the 1 good one", st.Records)
	}
	e.finish(t, int64(len(lines)))
	if got := e.col.Stats().Records; got != 1 {
		t.Errorf("collector got %d records, want 1", got)
	}
}

// A rank that floods the socket is rate-limited and counted; the other
// ranks on the node are not affected.
func TestFloodingRankIsLimited(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	dir, _ := os.MkdirTemp("", "tpsprof-flood")
	defer os.RemoveAll(dir)
	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, MaxLinesPerSec: 500,
		FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	line, _ := json.Marshal(stepRec("flood", 0, 0, 2, 1, 1e9))
	var flood []byte
	for i := 0; i < 5000; i++ {
		flood = append(append(flood, line...), '\n')
	}
	c, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(flood)
	c.Close()
	calm := client.New(a.Socket(), client.Options{})
	for s := int64(0); s < 10; s++ {
		calm.RecordStep(stepRec("calm", s, 0, 1, 1, 1e9))
	}
	calm.Close(5 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for accounted(a) < 5010 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := a.Stats()
	limited := st.Rejected["line:rate_limited"]
	if limited < 4000 || st.Records+limited != 5010 {
		t.Errorf("flood: %d accepted, %d rate-limited of 5010 lines", st.Records, limited)
	}
	a.Flush(5 * time.Second)
	col.Sync(5 * time.Second)
	col.Close()
	rows, _ := trace.ReadAll[tps.StepRecord](filepath.Join(out, "calm", trace.RankSteps))
	if len(rows) != 10 {
		t.Errorf("the calm rank's records were crowded out: %d of 10 reached Parquet", len(rows))
	}
}
