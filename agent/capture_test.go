package agent

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/capture"
	"github.com/tpsprof/tpsprof/kineto"
	"github.com/tpsprof/tpsprof/wire"
)

// The agent's part of a capture, over a real socket and a real NATS server,
// with a Go client in the rank's place: a probe is answered with the rank
// the connection carries; a start is written on that connection as one
// line; the rank's accepted line and its trace note come back as reports,
// the trace's figures and calls with it, and the kept trace in chunks,
// gzipped, with distributedInfo added to the legacy profiler's bare array.
// Bad requests, a second capture of the job and lines for no capture are
// refused and counted.
func TestCaptureThroughAgent(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0"})
	conn, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(v any) {
		b, _ := json.Marshal(v)
		if _, err := conn.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UnixNano()
	for step := int64(0); step < 3; step++ {
		send(map[string]any{"job": "cj", "rank": 5, "world_size": 8, "step": step, "tokens": 10,
			"start_unix_ns": now + step*1e8, "end_unix_ns": now + step*1e8 + 5e7})
		time.Sleep(50 * time.Millisecond) // at a pace (about 20 steps/s): the agent reads it off the arrivals
	}
	ask := func(req capture.Request) []capture.Ack {
		t.Helper()
		b, _ := json.Marshal(req)
		inbox := nc.NewInbox()
		sub, _ := nc.SubscribeSync(inbox)
		defer sub.Unsubscribe()
		nc.PublishRequest(wire.CaptureSubject(req.Job), inbox, b)
		var acks []capture.Ack
		for {
			m, err := sub.NextMsg(500 * time.Millisecond)
			if err != nil {
				return acks
			}
			var ack capture.Ack
			json.Unmarshal(m.Data, &ack)
			acks = append(acks, ack)
		}
	}
	// the records reach the agent before the probe does
	deadline := time.Now().Add(5 * time.Second)
	var acks []capture.Ack
	for time.Now().Before(deadline) {
		if acks = ask(capture.Request{Op: "probe", ID: "p1", Job: "cj"}); len(acks) == 1 && len(acks[0].Ranks) == 1 && acks[0].Ranks[0].Step == 2 {
			break
		}
	}
	if len(acks) != 1 || acks[0].Node != "n0" || len(acks[0].Ranks) != 1 || acks[0].Ranks[0].Rank != 5 || acks[0].Ranks[0].WorldSize != 8 {
		t.Fatalf("probe: %+v", acks)
	}
	if acks := ask(capture.Request{Op: "probe", ID: "p2", Job: "other"}); len(acks) != 0 {
		t.Errorf("another job's probe answered: %+v", acks)
	}
	if acks := ask(capture.Request{Op: "start", ID: "bad id!", Job: "cj"}); len(acks) != 1 || acks[0].Err == "" {
		t.Errorf("bad request: %+v", acks)
	}
	// a start no rank can reach (step 2^40 with an hour's timeout held every
	// other capture of the job for the hour) is refused, and holds nothing
	far := capture.Request{Op: "start", ID: "far", Job: "cj", AtStep: 1 << 40, Steps: 1, Reply: nc.NewInbox(), TimeoutMs: 3_600_000}
	if acks := ask(far); len(acks) != 1 || !strings.Contains(acks[0].Err, "steps past where the job's ranks are") {
		t.Errorf("a start at step 2^40: %+v", acks)
	}
	// nor one further than a minute at the ranks' pace (3,000 steps ahead
	// with a 10-minute timeout held the job's slot for 300 s, renewable)
	ahead := capture.Request{Op: "start", ID: "ahead", Job: "cj", AtStep: 2 + 3000, Steps: 1, Reply: nc.NewInbox(), TimeoutMs: 600_000}
	if acks := ask(ahead); len(acks) != 1 || !strings.Contains(acks[0].Err, "ask for a nearer step") {
		t.Errorf("a start 3,000 steps ahead: %+v", acks)
	}

	reply := nc.NewInbox()
	reports, _ := nc.SubscribeSync(reply)
	start := capture.Request{Op: "start", ID: "c1", Job: "cj", AtStep: 4, Steps: 1, Keep: true, Reply: reply, TimeoutMs: 10_000}
	if acks := ask(start); len(acks) != 1 || len(acks[0].Ranks) != 1 || acks[0].Err != "" {
		t.Fatalf("start: %+v", acks)
	}
	second := start
	second.ID = "c2"
	if acks := ask(second); len(acks) != 1 || !strings.Contains(acks[0].Err, "in progress") {
		t.Errorf("second capture of the job: %+v", acks)
	}
	// the request, as the rank reads it
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var got captureLine
	if json.Unmarshal(line, &got) != nil || got != (captureLine{Type: "capture", ID: "c1", AtStep: 4, Steps: 1}) {
		t.Fatalf("line to the rank: %s", line)
	}

	// the rank accepts and traces step 4 (the legacy profiler's array)
	send(map[string]any{"type": "capture", "id": "c1", "job": "cj", "rank": 5, "state": "accepted", "step": 3})
	send(map[string]any{"type": "capture", "id": "nope", "job": "cj", "rank": 5, "state": "accepted", "step": 3})
	td := DefaultTraceDir(a.Socket())
	path := filepath.Join(td, "cj.0.5.4.pt.trace.json")
	trace := `[{"name": "ProfilerStep#4", "ph": "X", "ts": 100, "dur": 50000, "tid": 1, "pid": "CPU functions", "args": {}},
{"name": "aten::mm", "ph": "X", "ts": 200, "dur": 20000, "tid": 1, "pid": "CPU functions", "args": {}},
{"name": "gloo:all_reduce", "ph": "X", "ts": 21000, "dur": 9000, "tid": 2, "pid": "CPU functions", "args": {}},
{"name": "gloo:broadcast", "ph": "X", "ts": 31000, "dur": 1000, "tid": 2, "pid": "CPU functions", "args": {}}]`
	if err := os.WriteFile(path, []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	send(map[string]any{"type": "trace", "job": "cj", "rank": 5, "step": 4, "path": path, "capture": "c1", "world_size": 8,
		"coords": map[string]int64{"dp_rank": 1, "tp_rank": 1}})
	// the step's record comes after the analysis (a rank sends it once its
	// collectives completed): the report waits for it, for the verdict
	time.Sleep(300 * time.Millisecond)
	send(map[string]any{"job": "cj", "rank": 5, "world_size": 8, "step": 4, "tokens": 10,
		"start_unix_ns": now + 4e8, "end_unix_ns": now + 4e8 + 6e7, "fwd_ns": 2e7})
	var states []string
	var traced capture.Report
	var kept bytes.Buffer
	for traced.Chunks == 0 || kept.Len() == 0 {
		m, err := reports.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("reports so far %v: %v", states, err)
		}
		if c := m.Header.Get(capture.HeaderChunk); c != "" {
			if c != "5/4/0" || m.Header.Get(capture.HeaderID) != "c1" {
				t.Errorf("chunk header %q", c)
			}
			kept.Write(m.Data)
			continue
		}
		var r capture.Report
		json.Unmarshal(m.Data, &r)
		states = append(states, r.State)
		if r.State == capture.StateTraced {
			traced = r
		}
	}
	if len(states) != 2 || states[0] != capture.StateAccepted {
		t.Errorf("reports %v", states)
	}
	if traced.Rank != 5 || traced.Step != 4 || traced.Node != "n0" || traced.Device != "cpu" || len(traced.Calls) != 2 ||
		traced.Calls[0].Kind != "all_reduce" || traced.Calls[0].EndNs-traced.Calls[0].StartNs != 9e6 || traced.Figures.CommUs != 10_000 ||
		traced.Record == nil || traced.Record.DurationNs != 6e7 || traced.Record.FwdNs != 2e7 {
		t.Errorf("traced report %+v", traced)
	}
	zr, err := gzip.NewReader(&kept)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(zr)
	var doc struct {
		DistributedInfo struct{ Rank, WorldSize int64 } `json:"distributedInfo"`
		Capture         struct {
			ID     string
			Coords map[string]int64
		} `json:"tpsprofCapture"`
		TraceEvents []json.RawMessage `json:"traceEvents"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("kept trace: %v\n%s", err, body)
	}
	if doc.DistributedInfo.Rank != 5 || doc.Capture.ID != "c1" || doc.Capture.Coords["tp_rank"] != 1 || len(doc.TraceEvents) != 4 {
		t.Errorf("kept trace metadata: %s", body[:min(len(body), 300)])
	}
	r, err := kineto.Analyze(bytes.NewReader(body))
	if err != nil || r.Rank == nil || *r.Rank != 5 || r.WorldSize == nil || *r.WorldSize != 8 {
		t.Errorf("kept trace as kineto reads it: %v %+v", err, r)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the trace was left in the agent's folder")
			break
		}
	}
	// over (its one rank traced its one step): the next capture of the
	// job waits out the gap, said
	third := start
	third.ID = "c3"
	if acks := ask(third); len(acks) != 1 || !strings.Contains(acks[0].Err, "the next may start 5s after it") {
		t.Errorf("capture right after the last: %+v", acks)
	}
	st := a.Stats()
	if st.Rejected["capture:invalid"] != 3 || st.Rejected["capture:busy"] != 2 || st.Rejected["capture:unknown"] != 1 { // (invalid: a bad id, 2^40, 3,000 ahead)
		t.Errorf("rejections %v", st.Rejected)
	}
}

// A rank whose process does not take capture requests (here a client
// that only writes records) is named once the accept wait passes, long
// before the capture's timeout.
func TestCaptureSilentRank(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0"})
	conn, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	now := time.Now().UnixNano()
	for step := int64(0); step < 3; step++ {
		b, _ := json.Marshal(map[string]any{"job": "silent", "rank": 0, "world_size": 1, "step": step, "tokens": 10,
			"start_unix_ns": now + step*1e8, "end_unix_ns": now + step*1e8 + 5e7})
		conn.Write(append(b, '\n'))
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		acks, err := capture.Probe(context.Background(), nc, "silent", 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(acks) == 1 && len(acks[0].Ranks) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rank never reached the agent: %+v", a.Stats())
		}
	}
	start := time.Now()
	v, err := capture.Run(context.Background(), nc, capture.Options{Job: "silent", Steps: 1, AtStep: -1, Timeout: time.Minute, AcceptWait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Ranks) != 0 || len(v.Missing) != 1 || !strings.Contains(v.Missing[0].Why, "did not accept the request within 500ms") {
		t.Fatalf("%+v", v)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the capture waited %s for a rank that never accepts", d)
	}
}

// Cluster figures reach a job's rank 0 at most once a second, the rest
// dropped and counted; figures the job cannot have (tokens a second beyond
// its GPUs, more stragglers than ranks, a step far from rank 0's) are
// refused: 600,000 forged messages at 20,000/s filled a 1,500-step job's
// TensorBoard with 327,506 points, tokens/s = inf at step 2^40.
func TestClusterFiguresBounded(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0"})
	conn, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	now := time.Now().UnixNano()
	for step := int64(0); step < 3; step++ {
		b, _ := json.Marshal(map[string]any{"job": "fj", "rank": 0, "world_size": 2, "step": step, "tokens": 10,
			"start_unix_ns": now + step*1e8, "end_unix_ns": now + step*1e8 + 5e7})
		conn.Write(append(b, '\n'))
	}
	var lines atomic.Int64
	var got atomic.Pointer[string]
	go func() {
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			if s := sc.Text(); strings.Contains(s, `"type":"cluster"`) {
				lines.Add(1)
				got.Store(&s)
			}
		}
	}()
	publish := func(tps float64, step, stragglers int) {
		b, _ := json.Marshal(wire.ClusterFigures{Job: "fj", Step: int64(step), TPS: &tps, Stragglers: stragglers})
		nc.Publish(wire.FiguresSubject("fj"), b)
	}
	// the subscription is made once the job has a rank here: wait for the first line through
	deadline := time.Now().Add(5 * time.Second)
	for lines.Load() == 0 && time.Now().Before(deadline) {
		publish(1000, 2, 0)
		nc.Flush()
		time.Sleep(50 * time.Millisecond)
	}
	if lines.Load() == 0 {
		t.Fatal("no cluster figures reached rank 0")
	}
	time.Sleep(1100 * time.Millisecond)
	start, before := time.Now(), lines.Load()
	for i := range 2000 {
		publish(1000+float64(i), 2, 0)
	}
	publish(3e8, 2, 0)  // beyond 2 GPUs × 10^8
	publish(1000, 2, 3) // 3 stragglers among 2 ranks
	publish(1000, 1<<40, 0)
	nc.Flush()
	time.Sleep(1500 * time.Millisecond)
	secs := time.Since(start).Seconds()
	if n := lines.Load() - before; n < 1 || float64(n) > secs+1 {
		t.Errorf("%d cluster lines in %.1f s of 2,000 messages: want about one a second", n, secs)
	}
	st := a.Stats()
	if st.Rejected["figures:rate"] < 1900 || st.Rejected["figures:implausible"] != 3 {
		t.Errorf("rejections %v", st.Rejected)
	}
	if p := got.Load(); p == nil || strings.Contains(*p, "1099511627776") || strings.Contains(*p, "3e+08") {
		t.Errorf("a forged figure passed: %v", p)
	}
}
