package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// NATS goes away mid-run and comes back on the same address: the agent
// holds what the ranks send meanwhile and delivers it after reconnecting;
// the collector resubscribes; nothing inside the buffer bound is lost.
func TestNATSOutageBufferedAndDelivered(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Server().Addr().String()
	url := srv.URL()
	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: url}, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := os.MkdirTemp("", "tpsprof-outage")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: url}, Node: "n0", FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	send := func(from, to int64) {
		for s := from; s < to; s++ {
			for r := int64(0); r < 4; r++ {
				if err := a.SubmitStep(stepRec("outage", s, r, 4, 100, 1e9)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	send(0, 50)
	a.Flush(5 * time.Second)
	col.Sync(5 * time.Second)

	srv.Shutdown() // NATS is gone
	// Records published before the client notices the closed connection go
	// into a dead socket (core NATS loses them; durable mode is the answer,
	// docs/reliability.md). This test is about what the agent does once it
	// knows: wait for that, as a loaded machine may take a moment.
	for deadline := time.Now().Add(10 * time.Second); a.Stats().NATSConnected; {
		if time.Now().After(deadline) {
			t.Fatal("the agent did not notice the server going away")
		}
		time.Sleep(10 * time.Millisecond)
	}
	send(50, 100)
	time.Sleep(500 * time.Millisecond)
	if st := a.Stats(); st.NATSConnected || st.BufferedBytes == 0 {
		t.Fatalf("during the outage: %+v", st)
	}
	host, portNum, _ := splitAddr(addr)
	srv2, err := natsconn.StartEmbedded(host, portNum, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Shutdown()
	deadline := time.Now().Add(15 * time.Second)
	for a.Stats().BufferedBytes > 0 || !a.Stats().NATSConnected {
		if time.Now().After(deadline) {
			t.Fatalf("agent did not deliver after reconnect: %+v", a.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// the collector must have resubscribed before the agent's batches arrive;
	// give it the same reconnect window
	a.Flush(5 * time.Second)
	if err := col.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	col.Close()
	t.Logf("collector: %+v", col.Stats())
	if st := a.Stats(); st.Dropped != 0 || st.Published != 400 {
		t.Errorf("agent: %+v", st)
	}
	rows, _ := trace.ReadAll[tps.StepRecord](filepath.Join(out, "outage", trace.RankSteps))
	if len(rows) != 400 {
		t.Errorf("got %d rank rows after the outage, want 400", len(rows))
	}
}

// Past the buffer bound the oldest batches are dropped and counted; memory
// does not grow.
func TestNATSOutageBoundedBuffer(t *testing.T) {
	dir, _ := os.MkdirTemp("", "tpsprof-bound")
	defer os.RemoveAll(dir)
	// Nothing listens on this port: NATS is down from the start.
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: "nats://127.0.0.1:1"},
		Node: "n0", FlushInterval: 5 * time.Millisecond, BatchRecords: 16, BufferBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	for s := int64(0); s < 500; s++ {
		a.SubmitStep(stepRec("bound", s, 0, 1, 100, 1e9))
		if s%50 == 0 {
			time.Sleep(10 * time.Millisecond) // let batches form
		}
	}
	time.Sleep(50 * time.Millisecond)
	st := a.Stats()
	if st.BufferedBytes > 8<<10 {
		t.Errorf("buffer %d bytes over its bound", st.BufferedBytes)
	}
	if st.Dropped == 0 {
		t.Errorf("nothing dropped past the bound: %+v", st)
	}
	start := time.Now()
	a.Close() // gives NATS a few seconds, then counts the rest as dropped
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("close took %v", took)
	}
	if st := a.Stats(); st.Dropped+st.Published != 500 || st.Records != 500 {
		t.Errorf("records %d = published %d + dropped %d?", st.Records, st.Published, st.Dropped)
	}
}

func splitAddr(a string) (string, int, error) {
	for i := len(a) - 1; i >= 0; i-- {
		if a[i] == ':' {
			var p int
			for _, c := range a[i+1:] {
				p = p*10 + int(c-'0')
			}
			return a[:i], p, nil
		}
	}
	return a, 0, nil
}

// An unwritable output directory in durable mode: the error is counted and
// logged, no part is left half-written, and the data waits in the stream.
func TestDurableUnwritableOutputKeepsData(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	notDir := filepath.Join(t.TempDir(), "a-file")
	os.WriteFile(notDir, []byte("x"), 0o644)
	col, err := collector.New(collector.Config{OutDir: notDir, NATS: natsconn.Options{URL: srv.URL()}, Durable: true,
		Writer: trace.WriterOptions{PartAge: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := os.MkdirTemp("", "tpsprof-full")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Durable: true, FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for r := int64(0); r < 4; r++ {
		a.SubmitStep(stepRec("full", 0, r, 4, 10, 1e9))
	}
	a.Flush(5 * time.Second)
	time.Sleep(100 * time.Millisecond)
	col.Sync(5 * time.Second)
	time.Sleep(300 * time.Millisecond) // a few checkpoints
	if st := col.Stats(); st.WriteErrors == 0 {
		t.Errorf("no write error counted: %+v", st)
	}
	col.Close()
	// the batch is still in the stream for a collector that can write
	out := t.TempDir()
	col2, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for col2.Stats().Records < 4 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	col2.Close()
	rows, _ := trace.ReadAll[tps.StepRecord](filepath.Join(out, "full", trace.RankSteps))
	if len(rows) != 4 {
		t.Errorf("after fixing the output, %d rank rows, want the 4 that waited in the stream", len(rows))
	}
}

// A wrong NATS URL is said while the job runs (within a few seconds, then
// every 10 s), with the URL (no credentials), what is buffered and what
// was dropped; the agent's metrics say it is not connected.
func TestNATSUnreachableSaidAtStart(t *testing.T) {
	dir, _ := os.MkdirTemp("", "tpsprof-down")
	defer os.RemoveAll(dir)
	var logs syncBuffer
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: "nats://user:secret@127.0.0.1:1"},
		Node: "n0", FlushInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.SubmitStep(stepRec("down", 0, 0, 1, 100, 1e9))
	deadline := time.Now().Add(6 * time.Second)
	for !strings.Contains(logs.String(), "NATS unreachable") {
		if time.Now().After(deadline) {
			t.Fatalf("nothing said about NATS within 6 s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for !strings.Contains(logs.String(), "nothing listens on that port") {
		if time.Now().After(deadline) {
			t.Fatalf("the cause not said within 6 s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	out := logs.String()
	if !strings.Contains(out, "127.0.0.1:1") || strings.Contains(out, "secret") || !strings.Contains(out, "buffered_bytes") {
		t.Errorf("warning: %s", out)
	}
	if body := metricsOf(t, a.Handler()); !bytes.Contains(body, []byte("tpsprof_agent_nats_connected 0")) {
		t.Errorf("metrics do not say disconnected:\n%.1500s", body)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// stallProxy relays TCP to a NATS server and can stop relaying while
// keeping the connections open: a network that stalls.
type stallProxy struct {
	ln      net.Listener
	stalled atomic.Bool
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go p.relay(c, s)
			go p.relay(s, c)
		}
	}()
	return p
}

func (p *stallProxy) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for p.stalled.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A durable agent whose NATS stalls (the link stays up, nothing gets
// through, each publish waits its 2 s for the stream's acknowledgement)
// keeps taking records at once: intake never waits on the network.
func TestDurableAgentIntakeWhileNATSStalls(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Durable: true})
	if err != nil {
		t.Fatal(err) // creates the stream
	}
	defer col.Close()
	proxy := newStallProxy(t, strings.TrimPrefix(srv.URL(), "nats://"))
	dir, _ := os.MkdirTemp("", "tpsprof-stall")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: "nats://" + proxy.ln.Addr().String()},
		Durable: true, FlushInterval: 5 * time.Millisecond, BatchRecords: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.SubmitStep(stepRec("stall", 0, 0, 1, 10, 1e9))
	if err := a.Flush(5 * time.Second); err != nil {
		t.Fatalf("first flush through the proxy: %v", err)
	}
	proxy.stalled.Store(true)
	var worst time.Duration
	for s := int64(1); s <= 300; s++ {
		t0 := time.Now()
		a.SubmitStep(stepRec("stall", s, 0, 1, 10, 1e9))
		worst = max(worst, time.Since(t0))
		time.Sleep(5 * time.Millisecond)
	}
	if worst > 200*time.Millisecond {
		t.Errorf("a record waited %v to be taken while NATS stalled", worst)
	}
	if st := a.Stats(); st.Dropped != 0 || st.Records != 301 {
		t.Errorf("stats while stalled: %+v", st)
	}
	// Past the window's wait the acknowledgements time out: the batches
	// go back to the head of the queue and are published again.
	deadline := time.Now().Add(15 * time.Second)
	for a.Stats().PublishErrors == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if st := a.Stats(); st.PublishErrors == 0 {
		t.Errorf("no publish timed out during a 15 s stall: %+v", st)
	}
	proxy.stalled.Store(false)
	if err := a.Flush(20 * time.Second); err != nil {
		t.Errorf("flush after the stall: %v", err)
	}
	if st := a.Stats(); st.Published != 301 || st.Dropped != 0 {
		t.Errorf("after the stall: %+v", st)
	}
	// Every record reaches Parquet once, however often it was published.
	if err := col.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := col.Close(); err != nil {
		t.Fatal(err)
	}
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(out, "stall", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	steps := map[int64]int{}
	for _, r := range rows {
		steps[r.Step]++
	}
	if len(rows) != 301 || len(steps) != 301 {
		t.Errorf("%d rank rows, %d distinct steps; want 301 once each", len(rows), len(steps))
	}
}

// A durable collector finding an unreadable part at start-up sets it aside
// (renamed *.unreadable) and starts, instead of panicking in a crash loop
// while the stream holds messages.
func TestDurableStartWithUnreadablePart(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := os.MkdirTemp("", "tpsprof-unread")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Durable: true, FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.SubmitStep(stepRec("unread", 0, 0, 2, 10, 1e9)) // one rank of two: the step stays open, its message in the stream
	a.Flush(5 * time.Second)
	col.Sync(5 * time.Second)
	col.Close()
	bad := filepath.Join(out, "unread", trace.RankSteps, "part-zz-broken.parquet")
	if err := os.WriteFile(bad, []byte("PAR1 and then nothing"), 0o644); err != nil {
		t.Fatal(err)
	}
	col2, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Durable: true})
	if err != nil {
		t.Fatalf("durable start with an unreadable part: %v", err)
	}
	defer col2.Close()
	if _, err := os.Stat(bad + ".unreadable"); err != nil || col2.Stats().Quarantined != 1 {
		t.Errorf("not set aside: %v, quarantined %d", err, col2.Stats().Quarantined)
	}
}

// The agent forgets a job that went quiet: its metadata is no longer
// republished every interval (3,000 jobs gave 6,000 messages in 21 s,
// forever).
func TestAgentForgetsQuietJobs(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var metas atomic.Int64
	sub, _ := nc.Subscribe(wire.AllMeta, func(*nats.Msg) { metas.Add(1) })
	defer sub.Unsubscribe()
	nc.Flush()
	dir, _ := os.MkdirTemp("", "tpsprof-forget")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()},
		MetaInterval: 50 * time.Millisecond, ForgetAfter: 300 * time.Millisecond, FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for i := 0; i < 30; i++ {
		a.SubmitMeta(tps.RunMeta{Job: fmt.Sprintf("q%d", i)})
	}
	time.Sleep(250 * time.Millisecond)
	if n := metas.Load(); n < 60 {
		t.Fatalf("%d metadata messages while the jobs were fresh, want them republished", n)
	}
	time.Sleep(300 * time.Millisecond) // past ForgetAfter
	before := metas.Load()
	time.Sleep(300 * time.Millisecond)
	if n := metas.Load() - before; n != 0 {
		t.Errorf("%d metadata messages for jobs quiet past ForgetAfter", n)
	}
}

// With a low open-files limit the collector holds fewer jobs (each may
// keep five part files open: rank_steps, cluster_steps, events,
// gpu_samples, rank_windows) instead of running out of descriptors: 700
// jobs under nofile=1024 stopped its HTTP server and every new part.
// Here: 300 jobs under 512 open files, (512 - 256 reserved) / 5 = 51 held;
// the rest are rejected (job:limit) and the collector keeps serving.
func TestOpenFilesLimitBoundsJobs(t *testing.T) {
	bin := buildBinary(t)
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	port := freePort(t)
	cmd := exec.Command("bash", "-c", fmt.Sprintf("ulimit -n 512 && exec %s collector --out %s --nats %s --http 127.0.0.1:%d --live 0", bin, out, srv.URL(), port))
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if resp, err := http.Get(base + "/metrics"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector not up:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	now := time.Now().Add(-time.Minute).UnixNano()
	for i := range 300 {
		job := fmt.Sprintf("j%03d", i)
		// one rank of two: the step stays open, the job active
		r := tps.StepRecord{Job: job, Step: 0, Rank: 0, WorldSize: 2, Tokens: 1, StartUnixNs: now, EndUnixNs: now + 1e9}
		nc.Publish(wire.StepsSubject(job, "n0"), wire.AppendSteps(nil, []tps.StepRecord{r}))
	}
	nc.Flush()
	var sum struct {
		Stats collector.Stats `json:"stats"`
	}
	for {
		resp, err := http.Get(base + "/api/summary")
		if err != nil {
			t.Fatalf("the collector stopped serving: %v\n%s", err, log.String())
		}
		json.NewDecoder(resp.Body).Decode(&sum)
		resp.Body.Close()
		if int64(sum.Stats.Jobs)+sum.Stats.Rejected["job:limit"] >= 300 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v\n%s", sum.Stats, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sum.Stats.Jobs != 51 || sum.Stats.Rejected["job:limit"] != 249 || sum.Stats.WriteErrors != 0 {
		t.Errorf("jobs %d, job:limit %d, write errors %d; want 51, 249, 0", sum.Stats.Jobs, sum.Stats.Rejected["job:limit"], sum.Stats.WriteErrors)
	}
	if !strings.Contains(log.String(), "open-files limit too low") {
		t.Errorf("no warning about the open-files limit:\n%s", log.String())
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
	if len(fds) >= 512 {
		t.Errorf("%d open files", len(fds))
	}
}

// A wrong NATS token is said as refused credentials, not as an outage: the
// agent keeps the records (a fixed token would deliver them), and the log
// says what to fix.
func TestWrongTokenSaidAsRefused(t *testing.T) {
	srv, err := natsconn.StartEmbeddedAuth("127.0.0.1", -1, "", natsconn.Auth{Token: "right-token"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	dir, _ := os.MkdirTemp("", "tpsprof-token")
	defer os.RemoveAll(dir)
	var logs syncBuffer
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL(), Token: "wrong-token"},
		Node: "n0", FlushInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.SubmitStep(stepRec("tok", 0, 0, 1, 100, 1e9))
	deadline := time.Now().Add(8 * time.Second)
	for !strings.Contains(logs.String(), "refused") && !strings.Contains(logs.String(), "unreachable") {
		if time.Now().After(deadline) {
			t.Fatalf("nothing said about NATS within 8 s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	out := logs.String()
	if !strings.Contains(out, "refused this agent's credentials") || strings.Contains(out, "NATS unreachable") || strings.Contains(out, "wrong-token") {
		t.Errorf("warning: %s", out)
	}
	if body := metricsOf(t, a.Handler()); !bytes.Contains(body, []byte("tpsprof_agent_nats_credentials_refused 1")) {
		t.Errorf("metrics do not say the credentials were refused:\n%.1500s", body)
	}
}

// A clean exit says nothing alarming: the agent's own Close used to log
// `WARN "NATS disconnected; buffering" err=<nil>`.
func TestCleanExitIsQuiet(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	dir, _ := os.MkdirTemp("", "tpsprof-quiet")
	defer os.RemoveAll(dir)
	var logs syncBuffer
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()},
		Node: "n0", FlushInterval: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a.SubmitStep(stepRec("quiet", 0, 0, 1, 100, 1e9))
	a.Flush(5 * time.Second)
	a.Close()
	if out := logs.String(); strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
		t.Errorf("a clean exit logged:\n%s", out)
	}
}
