package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Agents that publish node partials feed an aggregator whose cluster rows
// are identical to those of a collector aggregating every record.
func TestAgentPartialsMatchFullAggregation(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nopt := natsconn.Options{URL: srv.URL()}
	outFull, outAgg := t.TempDir(), t.TempDir()
	full, err := collector.New(collector.Config{OutDir: outFull, NATS: nopt, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	agg, err := collector.New(collector.Config{OutDir: outAgg, NATS: nopt, Grace: time.Minute, Role: "aggregator"})
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := os.MkdirTemp("", "tpsprof-part")
	defer os.RemoveAll(dir)
	topo := tps.Topology{DP: 2, TP: 2, PP: 2}
	var agents []*agent.Agent
	for n := 0; n < 2; n++ {
		a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, string(rune('a'+n))+".sock"), NATS: nopt, Node: "node-" + string(rune('0'+n)),
			FlushInterval: 5 * time.Millisecond, Partials: true, ResubscribeGrace: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		// a model and GPU: MFU, and packed batches' FLOPs from their Σ
		// document length² (the aggregator computes them: agents do not
		// know the model)
		if err := a.SubmitMeta(tps.RunMeta{Job: "part", Topology: topo, ModelPreset: "llama3-8b", GPU: "h100-sxm"}); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	for _, a := range agents {
		a.Flush(5 * time.Second)
	}
	full.Sync(5 * time.Second)
	agg.Sync(5 * time.Second)
	for s := int64(0); s < 20; s++ {
		for r := int64(0); r < 8; r++ {
			x := stepRec("part", s, r, 8, 1000, 1e9+r*1e6)
			x.ExposedCommNs, x.CommNs = 1e8+r*1e6, 3e8
			x.SeqSqSum = 4 * 250 * 250 // four documents of 250 tokens
			if s == 7 && r == 3 {
				x.Tokens = 999 // a disagreeing rank
			}
			agents[r/4].SubmitStep(x)
			if r == 5 { // a resend lands in a later batch: counted once
				time.Sleep(10 * time.Millisecond)
				agents[r/4].SubmitStep(x)
			}
		}
	}
	for _, a := range agents {
		a.Flush(5 * time.Second)
	}
	for _, c := range []*collector.Collector{full, agg} {
		if err := c.Sync(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	want, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(outFull, "part", trace.ClusterSteps))
	got, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(outAgg, "part", trace.ClusterSteps))
	if len(want) != 20 || len(got) != 20 {
		t.Fatalf("%d rows from records, %d from partials; want 20 each", len(want), len(got))
	}
	tps.SortSteps(want)
	tps.SortSteps(got)
	for i := range want {
		w, g := want[i], got[i]
		w.DuplicateRecords, g.DuplicateRecords = 0, 0 // counted where each path sees the resend
		if w != g {
			t.Errorf("step %d:\nfrom partials %+v\nfrom records  %+v", w.Step, g, w)
		}
	}
	m, _ := mfu.Preset("llama3-8b")
	c, _ := m.Count(mfu.Attention(""), mfu.Recompute(""))
	if g := got[3]; g.MFU <= 0 || g.FLOPs >= float64(g.Tokens)*c.FLOPsPerToken || g.FLOPs <= float64(g.Tokens)*c.DenseFLOPsPerToken {
		t.Errorf("step 3's FLOPs %g: want the packed batches' (between %g dense and %g for full sequences), with MFU (%g)",
			g.FLOPs, float64(g.Tokens)*c.DenseFLOPsPerToken, float64(g.Tokens)*c.FLOPsPerToken, g.MFU)
	}
	if got[7].TokenMismatchReplicas != 1 {
		t.Errorf("mismatch lost in the partials: %+v", got[7])
	}
}
