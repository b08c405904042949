package agent

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// Only regular files directly in the trace folder are analysed: a path
// elsewhere, a relative one, a link or a folder is refused and counted.
func TestTraceNotesAreChecked(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	dir, _ := os.MkdirTemp("", "tpsprof-tr")
	defer os.RemoveAll(dir)
	a, err := Start(Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	td := DefaultTraceDir(filepath.Join(dir, "a.sock"))
	if fi, err := os.Stat(td); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("trace folder %s: %v %v", td, fi, err)
	}
	outside := filepath.Join(dir, "x.json")
	os.WriteFile(outside, []byte("{}"), 0o600)
	link := filepath.Join(td, "link.json")
	os.Symlink(outside, link)
	os.Mkdir(filepath.Join(td, "sub.json"), 0o700)
	for _, p := range []string{outside, "rel.json", link, filepath.Join(td, "sub.json"), filepath.Join(td, "missing.json"),
		filepath.Join(td, "..", "x.json")} {
		if err := a.SubmitTrace(TraceNote{Job: "j", Path: p}); err == nil {
			t.Errorf("%s: accepted", p)
		}
	}
	if n := a.Stats().Rejected["trace:path"]; n != 6 {
		t.Errorf("trace:path rejections %d, want 6", n)
	}
	if err := a.SubmitTrace(TraceNote{Job: "bad job", Path: filepath.Join(td, "a.json")}); err == nil {
		t.Error("invalid job accepted")
	}
	// An unreadable trace in the folder is analysed, counted and deleted.
	bad := filepath.Join(td, "j.0.0.1.pt.trace.json")
	os.WriteFile(bad, []byte(`{"traceEvents":[{"ph":"X"`), 0o600)
	if err := a.SubmitTrace(TraceNote{Job: "j", Step: 1, Path: bad}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.Stats().Rejected["trace:unreadable"] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("unreadable trace not counted: %v", a.Stats().Rejected)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// deleted once its analysis returns, just after the count
	for _, err := os.Stat(bad); !os.IsNotExist(err); _, err = os.Stat(bad) {
		if time.Now().After(deadline) {
			t.Fatalf("the unreadable trace was not deleted: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A traced step's record waits for its analysis and goes on with the
// trace's figures; the rank measured no communication, so comm and exposed
// comm come from the trace.
func TestTraceFiguresJoinTheRecord(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: 5 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	msgs := make(chan *nats.Msg, 16)
	nc.ChanSubscribe(wire.StepsSubject("tj", "n0"), msgs)
	nc.Flush()
	// step 7: compute 0-60 µs, an all-reduce 40-100 µs: comm 60, exposed 40
	tr := `{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#7","ts":0,"dur":200},
{"ph":"X","cat":"kernel","name":"gemm","ts":0,"dur":60,"args":{"stream":7}},
{"ph":"X","cat":"kernel","name":"ncclDevKernel_AllReduce_Sum_f32_RING_LL","ts":40,"dur":60,"args":{"stream":20}}]}`
	path := filepath.Join(a.cfg.TraceDir, "tj.0.3.7.pt.trace.json")
	os.WriteFile(path, []byte(tr), 0o600)
	now := time.Now().UnixNano()
	rec := tps.StepRecord{Job: "tj", Step: 7, Rank: 3, WorldSize: 4, StartUnixNs: now - 1e6, EndUnixNs: now, Tokens: 10}
	if err := a.SubmitTrace(TraceNote{Job: "tj", Step: 7, Rank: 3, Path: path}); err != nil {
		t.Fatal(err)
	}
	if err := a.SubmitStep(rec); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		recs, err := wire.DecodeSteps(m.Data, nil)
		if err != nil || len(recs) != 1 {
			t.Fatalf("%v %v", recs, err)
		}
		r := recs[0]
		if r.TraceComputeNs != 60_000 || r.TraceCommNs != 60_000 || r.TraceExposedCommNs != 40_000 || r.CommNs != 60_000 || r.ExposedCommNs != 40_000 {
			t.Fatalf("record: trace compute %d comm %d exposed %d; comm %d exposed %d", r.TraceComputeNs, r.TraceCommNs,
				r.TraceExposedCommNs, r.CommNs, r.ExposedCommNs)
		}
	case <-time.After(traceHold / 3): // the hold's own end would send it without figures
		t.Fatal("the held record was not published")
	}
}

// A trace folder someone else made first (a shared /tmp, XDG_RUNTIME_DIR
// unset) is not adopted: the agent refuses every trace note for it, and a
// link planted there is never followed. chown needs root, which CI has.
func TestForeignTraceFolderRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test gives a folder to uid 4242 and needs root (CI runs as root)")
	}
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	td := DefaultTraceDir(sock)
	os.Mkdir(td, 0o777)
	os.Chmod(td, 0o777)
	victim := filepath.Join(dir, "victim")
	os.WriteFile(victim, []byte("root's"), 0o600)
	link := filepath.Join(td, "j.0.0.0.pt.trace.json")
	os.Symlink(victim, link)
	plant := filepath.Join(td, "j.0.0.1.pt.trace.json")
	os.WriteFile(plant, []byte(`{"traceEvents":[]}`), 0o644)
	filepath.Walk(td, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 4242, 4242) })
	a, err := Start(Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, plant} {
		if err := a.SubmitTrace(TraceNote{Job: "j", Step: 1, Path: p}); err == nil {
			t.Errorf("%s in another user's folder accepted", p)
		}
	}
	if n := a.Stats().Rejected["trace:path"]; n != 2 {
		t.Errorf("trace:path rejections %d, want 2", n)
	}
	a.Close()
	if b, _ := os.ReadFile(victim); string(b) != "root's" {
		t.Errorf("the link's target changed: %q", b)
	}
	if _, err := os.Stat(td); err != nil {
		t.Errorf("the agent removed a folder that is not its own: %v", err)
	}
}

// A FIFO swapped in for a trace after its note was checked does not block
// the trace worker: it is counted unreadable at once and the agent closes.
func TestTraceFIFOSwappedIn(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	dir := t.TempDir()
	a, err := Start(Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(DefaultTraceDir(filepath.Join(dir, "a.sock")), "j.0.0.1.pt.trace.json")
	os.WriteFile(p, []byte(`{"traceEvents":[]}`), 0o600)
	// the check passes on the regular file; the worker then meets a FIFO
	if _, err := analyseFile(p, false, DefaultTraceMaxEvents, nil); err != nil {
		t.Fatalf("regular trace: %v", err)
	}
	os.Remove(p)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := analyseFile(p, false, DefaultTraceMaxEvents, nil); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a FIFO analysed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the trace worker blocked on a FIFO")
	}
	// announced while a FIFO, or a link: refused and removed from the folder
	// (the link's target untouched)
	if err := a.SubmitTrace(TraceNote{Job: "j", Step: 1, Path: p}); err == nil {
		t.Error("a FIFO's note accepted")
	}
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep"), 0o600)
	link := filepath.Join(filepath.Dir(p), "j.0.0.2.pt.trace.json")
	os.Symlink(target, link)
	if err := a.SubmitTrace(TraceNote{Job: "j", Step: 2, Path: link}); err == nil {
		t.Error("a link's note accepted")
	}
	for _, q := range []string{p, link} {
		if _, err := os.Lstat(q); !os.IsNotExist(err) {
			t.Errorf("%s left in the trace folder (%v)", q, err)
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep" {
		t.Errorf("the link's target: %q %v", b, err)
	}
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not close")
	}
}

// A trace without a ProfilerStep of the noted step gives the record no
// figures (the whole trace's totals are another span of time); the record
// is released at once, not after the 30 s hold.
func TestTraceWithoutTheNotedStep(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: 5 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	msgs := make(chan *nats.Msg, 16)
	nc.ChanSubscribe(wire.StepsSubject("tn", "n0"), msgs)
	nc.Flush()
	tr := `{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#6","ts":0,"dur":200},
{"ph":"X","cat":"kernel","name":"gemm","ts":0,"dur":60,"args":{"stream":7}}]}`
	path := filepath.Join(a.cfg.TraceDir, "tn.0.3.7.pt.trace.json")
	os.WriteFile(path, []byte(tr), 0o600)
	now := time.Now().UnixNano()
	rec := tps.StepRecord{Job: "tn", Step: 7, Rank: 3, WorldSize: 4, StartUnixNs: now - 1e6, EndUnixNs: now, Tokens: 10}
	if err := a.SubmitTrace(TraceNote{Job: "tn", Step: 7, Rank: 3, Path: path}); err != nil {
		t.Fatal(err)
	}
	if err := a.SubmitStep(rec); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		recs, err := wire.DecodeSteps(m.Data, nil)
		if err != nil || len(recs) != 1 {
			t.Fatalf("%v %v", recs, err)
		}
		if r := recs[0]; r.TraceComputeNs != 0 || r.TraceCommNs != 0 {
			t.Fatalf("step 7 got step 6's trace figures: %+v", r)
		}
	case <-time.After(traceHold / 3): // released by the analysis, not by the hold's end
		t.Fatal("the held record was not released")
	}
	if got := a.Stats().Rejected["trace:no_step"]; got != 1 {
		t.Errorf("trace:no_step %d, want 1", got)
	}
}

// An agent told to stop while it analyses a large trace stops at once:
// the analysis is abandoned at its next read and the step's held record
// goes out without trace figures. The trace here (8.7 MB of gzip) took
// this machine 18.4 s to analyse to its end; Close waited for all of it.
func TestCloseDuringLargeTraceAnalysis(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: 5 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	msgs := make(chan *nats.Msg, 16)
	nc.ChanSubscribe(wire.StepsSubject("big", "n0"), msgs)
	nc.Flush()
	// The trace's opening in one gzip member, then one member of 64 MiB of
	// 2 KB events, repeated (Go's gzip reader reads concatenated members
	// as one stream): 3.75 GiB and 1.9 million events, under both bounds.
	gz := func(b []byte) []byte {
		var m bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&m, gzip.BestSpeed)
		zw.Write(b)
		zw.Close()
		return m.Bytes()
	}
	ev := []byte(`{"ph":"X","cat":"cpu_op","name":"op","ts":1,"dur":1,"args":{"pad":"` + strings.Repeat("a", 2000) + `"}},`)
	member := gz(bytes.Repeat(ev, (64<<20)/len(ev)))
	path := filepath.Join(a.cfg.TraceDir, "big.0.0.1.pt.trace.json.gz")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(gz([]byte(`{"traceEvents":[`)))
	for range 60 {
		f.Write(member)
	}
	f.Close()
	now := time.Now().UnixNano()
	if err := a.SubmitTrace(TraceNote{Job: "big", Step: 1, Rank: 0, Path: path}); err != nil {
		t.Fatal(err)
	}
	if err := a.SubmitStep(tps.StepRecord{Job: "big", Step: 1, Rank: 0, WorldSize: 1, StartUnixNs: now - 1e6, EndUnixNs: now, Tokens: 10}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the analysis is under way
	start := time.Now()
	a.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close took %v during an analysis", d)
	}
	select {
	case m := <-msgs:
		recs, err := wire.DecodeSteps(m.Data, nil)
		if err != nil || len(recs) != 1 || recs[0].Step != 1 {
			t.Fatalf("%v %v", recs, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the held record was not published on Close")
	}
	if n := a.Stats().Rejected["trace:unreadable"]; n != 0 {
		t.Errorf("an abandoned analysis counted as an unreadable trace (%d)", n)
	}
}

// The analysis's memory budget is the agent's to set: a trace with more
// events than --trace-max-events is not analysed, its step's record goes
// out at once without trace figures, and the refusal is counted.
func TestTraceMaxEvents(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", TraceMaxEvents: 100, FlushInterval: 5 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	msgs := make(chan *nats.Msg, 16)
	nc.ChanSubscribe(wire.StepsSubject("me", "n0"), msgs)
	nc.Flush()
	tr := `{"traceEvents":[{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","ts":0,"dur":2000}` +
		strings.Repeat(`,{"ph":"X","cat":"kernel","name":"gemm","ts":1,"dur":1,"args":{"stream":7}}`, 1000) + `]}`
	path := filepath.Join(a.cfg.TraceDir, "me.0.0.1.pt.trace.json")
	os.WriteFile(path, []byte(tr), 0o600)
	now := time.Now().UnixNano()
	if err := a.SubmitTrace(TraceNote{Job: "me", Step: 1, Path: path}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a.SubmitStep(tps.StepRecord{Job: "me", Step: 1, WorldSize: 1, StartUnixNs: now - 1e6, EndUnixNs: now, Tokens: 10})
	// released by the refusal, not by the hold's end (traceHold)
	select {
	case m := <-msgs:
		recs, _ := wire.DecodeSteps(m.Data, nil)
		if len(recs) != 1 || recs[0].TraceComputeNs != 0 || time.Since(start) > traceHold/3 {
			t.Errorf("record %+v after %v", recs, time.Since(start))
		}
	case <-time.After(traceHold / 3):
		t.Fatal("the held record was not released before the hold's end")
	}
	if n := a.Stats().Rejected["trace:unreadable"]; n != 1 {
		t.Errorf("trace:unreadable %d, want 1", n)
	}
}

// A trace analysed the moment it is queued (before SubmitTrace returns)
// still releases its step's record at once: the wait is registered before
// the worker can settle it. Each of many traced steps must come back well
// inside the hold. Before, the wait was registered after the note was
// queued: a worker that settled it first left the record held for the
// whole hold, sent without figures (under CI's load, the cause of records
// "released" only after 10-25 s in the tests above).
func TestTraceAnalysedAtOnceReleasesTheRecord(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: time.Millisecond, ResubscribeGrace: time.Millisecond})
	msgs := make(chan *nats.Msg, 1024)
	nc.ChanSubscribe(wire.StepsSubject("tq", "n0"), msgs)
	nc.Flush()
	// SubmitTrace returns only once the worker has settled the note's
	// analysis: the worst order there is
	queued := int64(0)
	testHookTraceQueued = func() {
		queued++
		deadline := time.Now().Add(10 * time.Second)
		for a.Stats().Rejected["trace:no_step"] < queued && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // the count comes just before the settling
	}
	defer func() { testHookTraceQueued = nil }()
	const steps = 20
	for step := int64(0); step < steps; step++ {
		// no ProfilerStep of the noted step: the quickest analysis there is
		path := filepath.Join(a.cfg.TraceDir, fmt.Sprintf("tq.0.0.%d.pt.trace.json", step))
		os.WriteFile(path, []byte(`{"traceEvents":[]}`), 0o600)
		if err := a.SubmitTrace(TraceNote{Job: "tq", Step: step, Rank: 0, Path: path}); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UnixNano()
		if err := a.SubmitStep(tps.StepRecord{Job: "tq", Step: step, WorldSize: 1, StartUnixNs: now - 1e6, EndUnixNs: now, Tokens: 1}); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-msgs:
			recs, err := wire.DecodeSteps(m.Data, nil)
			if err != nil || len(recs) != 1 || recs[0].Step != step {
				t.Fatalf("step %d: %v %v", step, recs, err)
			}
		case <-time.After(traceHold / 3):
			t.Fatalf("step %d: the record was held past %v after its trace was analysed", step, traceHold/3)
		}
	}
}
