package collector

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/fleet"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
	"github.com/tpsprof/tpsprof/wire"
)

// lyingPart writes a part of many 4-row groups into OUT/job/table and
// makes its footer claim MaxGroupRows rows a group, its column chunks as
// many values (tracetest.LieRows): 256 rows' bytes claiming 256 Mi rows.
func lyingPart[T any](t *testing.T, out, job, table string, rows []T) {
	t.Helper()
	w, err := trace.NewPartWriter[T](out, job, table, trace.WriterOptions{RowsPerGroup: 4, WriterID: "liar"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	parts := w.Parts()
	if len(parts) != 1 {
		t.Fatalf("%d parts", len(parts))
	}
	if err := tracetest.LieRows(parts[0], trace.MaxGroupRows, true); err != nil {
		t.Fatal(err)
	}
}

// No file in OUT can stop the collector (issue: one lying Parquet file
// anywhere in OUT crash-looped it, "fatal error: runtime: out of memory"
// in its first second, every start): a lying events part, a lying
// gpu_samples part in other jobs, and a lying kept node file of a
// finished job are planted before a collector starts on OUT; its node
// pass reads every job, names the node file and recomputes it, in bounded
// memory; a neighbour's report, whose checkpoint advice reads the other
// jobs' events, is made.
func TestLyingFilesInOut(t *testing.T) {
	out := t.TempDir()
	if _, err := tracetest.Write(out, "good", tracetest.Run{World: 2, Steps: 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := tracetest.Write(out, "evlie", tracetest.Run{World: 2, Steps: 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := tracetest.Write(out, "gpulie", tracetest.Run{World: 2, Steps: 30}); err != nil {
		t.Fatal(err)
	}
	ev := make([]tps.Event, 256)
	for i := range ev {
		ev[i] = tps.Event{Job: "evlie", Kind: tps.EventRollout, Step: int64(i), StartUnixNs: tracetest.T0 + int64(i), EndUnixNs: tracetest.T0 + int64(i) + 1}
	}
	lyingPart(t, out, "evlie", trace.Events, ev)
	gs := make([]tps.GPUSample, 256)
	for i := range gs {
		gs[i] = tps.GPUSample{Job: "gpulie", Node: "n", UUID: "GPU-0", UnixNs: tracetest.T0 + int64(i)*1e9}
	}
	lyingPart(t, out, "gpulie", trace.GPUSamples, gs)
	// a node file kept for "good", made to lie, and newer than its job
	rows, err := fleet.JobNodes(filepath.Join(out, "good"), "good")
	if err != nil || len(rows) == 0 {
		t.Fatalf("good's node rows: %v %v", rows, err)
	}
	if err := os.MkdirAll(filepath.Join(out, fleet.Table), 0o755); err != nil {
		t.Fatal(err)
	}
	many := make([]fleet.JobNode, 256)
	for i := range many {
		many[i] = rows[0]
	}
	nodeFile := filepath.Join(out, fleet.Table, "good.parquet")
	w, err := trace.NewPartWriter[fleet.JobNode](t.TempDir(), "x", "nodes", trace.WriterOptions{RowsPerGroup: 4, WriterID: "liar"})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(many)
	w.Close()
	if err := os.Rename(w.Parts()[0], nodeFile); err != nil {
		t.Fatal(err)
	}
	if err := tracetest.LieRows(nodeFile, trace.MaxGroupRows, true); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	os.Chtimes(nodeFile, future, future)

	if s, err := fleet.ScanDir(out, false); err != nil || !strings.Contains(s.Unreadable["good"], "good.parquet") || s.Jobs != 3 {
		t.Errorf("one pass: %+v, %v; want 3 jobs and the lying node file named", s, err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, _ := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute, NodesEvery: time.Hour})
	if !c.RefreshNodes(60 * time.Second) {
		t.Fatal("no node pass")
	}
	v := c.Nodes()
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 512<<20 {
		t.Errorf("the collector's start and node passes allocated %d MiB", grew>>20)
	}
	if v.Jobs != 3 || len(v.Failed) != 0 {
		t.Errorf("the node view covers %d jobs (failed %v), want all 3", v.Jobs, v.Failed)
	}
	// (the pass at start found it; the view is the last pass's)
	if st := c.Stats(); st.NodeFilesUnreadable != 1 {
		t.Errorf("%d unreadable node files counted, want the 1 planted", st.NodeFilesUnreadable)
	}
	s, err := fleet.ScanDir(out, false)
	if err != nil || len(s.Unreadable) != 0 || s.Computed != 0 {
		t.Errorf("after the collector's passes: %+v, %v; want every node file readable, none computed", s, err)
	}
	if m := get(t, c, "/metrics"); !strings.Contains(m, "tpsprof_node_files_unreadable_total") {
		t.Error("/metrics lacks tpsprof_node_files_unreadable_total")
	}
	// recomputed and kept again: the next pass reads it back
	if kept, err := fleet.ReadTable(out); err != nil || len(kept) != len(rows)*3 {
		t.Errorf("kept node rows after the pass: %d, %v; want %d", len(kept), err, 3*len(rows))
	}
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := report.Analyze(filepath.Join(out, "good"), report.Options{}); err != nil {
		t.Errorf("the neighbour's report: %v", err)
	}
	if jobs, err := report.Jobs(out); err != nil || len(jobs) != 3 {
		t.Errorf("the jobs list: %d jobs, %v", len(jobs), err)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 512<<20 {
		t.Errorf("the neighbour's report allocated %d MiB", grew>>20)
	}
}

// GPU samples for a host come only on that host's subject (two forged
// samples, XID 0 then 3, drained victim-9): a sample naming another node
// than the subject it came on is refused, counted as gpu:node.
func TestGPUSampleOfAnotherNodeRefused(t *testing.T) {
	c, nc := startCollector(t)
	now := time.Now().UnixNano()
	x0, x3 := int64(0), int64(3)
	forged := []tps.GPUSample{{Job: "gj", Node: "victim-9", UUID: "GPU-v", UnixNs: now - 1e9, XIDEvents: &x0}, {Job: "gj", Node: "victim-9", UUID: "GPU-v", UnixNs: now, XIDEvents: &x3}}
	if err := nc.Publish(wire.GPUSubject("gj", "attacker"), wire.EncodeGPUSamples(forged)); err != nil {
		t.Fatal(err)
	}
	own := []tps.GPUSample{{Job: "gj", Node: "attacker", UUID: "GPU-a", UnixNs: now}}
	nc.Publish(wire.GPUSubject("gj", "attacker"), wire.EncodeGPUSamples(own))
	nc.Flush()
	for deadline := time.Now().Add(10 * time.Second); c.Stats().Rejected["gpu:node"] < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("forged samples not refused: %+v", c.Stats().Rejected)
		}
	}
}
