// Package e2e tests the whole path with real parts: simulated ranks write
// JSON lines to real agents' unix sockets, agents publish to the real
// nats-server (in process, random port), the collector aggregates and
// writes Parquet, and the test reads the files back.
package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/internal/natsconn"
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

// finish flushes agents, waits for the collector to have everything and
// closes it (finalising the Parquet parts).
func (e *env) finish(t *testing.T) {
	t.Helper()
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

func stepRec(job string, step, rank, world, tokens, durNs int64) tps.StepRecord {
	t0 := time.Now().Add(-time.Hour).UnixNano()
	start := t0 + step*2e9
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
	clients := make([]*agent.Client, 8)
	for r := range clients {
		clients[r] = agent.NewClient(e.agents[r/4].Socket(), agent.ClientOptions{})
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
	dup := agent.NewClient(e.agents[0].Socket(), agent.ClientOptions{})
	dup.RecordStep(stepRec("e2e", 4, 3, 8, 65536, 1e9))
	for _, c := range append(clients, dup) {
		c.Close(5 * time.Second)
		if sent, dropped, _ := c.Counts(); dropped != 0 {
			t.Fatalf("client dropped %d (sent %d)", dropped, sent)
		}
	}
	e.finish(t)

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
