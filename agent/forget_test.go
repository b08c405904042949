package agent

import (
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// A job's metadata is republished every MetaInterval while the job is
// active and no longer once it has sent nothing for ForgetAfter (the
// agent's --forget-after; it used to be an hour, with no flag).
func TestMetadataForgottenAfterQuiet(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: 5 * time.Millisecond, ResubscribeGrace: time.Millisecond,
		MetaInterval: 20 * time.Millisecond, ForgetAfter: 300 * time.Millisecond})
	var got atomic.Int64
	nc.Subscribe(wire.MetaSubject("fj"), func(*nats.Msg) { got.Add(1) })
	nc.Flush()
	if err := a.SubmitMeta(tps.RunMeta{Job: "fj", Topology: tps.Topology{DP: 2, TP: 1, PP: 1}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); got.Load() < 3 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := got.Load(); n < 3 {
		t.Fatalf("%d metadata messages in 5 s at a 20 ms interval", n)
	}
	time.Sleep(time.Second) // well past ForgetAfter
	before := got.Load()
	time.Sleep(500 * time.Millisecond)
	if after := got.Load(); after != before {
		t.Errorf("%d more metadata messages after the job was forgotten", after-before)
	}
}

// startWithNATS starts an agent on a socket of a temporary folder, talking
// to an embedded NATS server, and a connection of the test's own to that
// server; all are stopped when the test ends.
func startWithNATS(t *testing.T, cfg Config) (*Agent, *nats.Conn) {
	t.Helper()
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := natsconn.Connect(natsconn.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(t.TempDir(), "a.sock")
	}
	cfg.NATS = natsconn.Options{URL: srv.URL()}
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, nc
}

// A burst of metadata lines (3,000 for one job, as a rank re-sending it
// every step, or a hostile one) publishes at most about one a second,
// not one a line (it made 6,000 publishes in 21 s), and the last of them
// still reaches NATS.
func TestMetaRepublishBounded(t *testing.T) {
	a, nc := startWithNATS(t, Config{FlushInterval: 10 * time.Millisecond, MetaInterval: time.Hour})
	var got atomic.Int64
	var last atomic.Pointer[string]
	if _, err := nc.Subscribe(wire.MetaSubject("burst"), func(m *nats.Msg) {
		got.Add(1)
		s := string(m.Data)
		last.Store(&s)
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	start := time.Now()
	for i := range 3000 {
		if err := a.SubmitMeta(tps.RunMeta{Job: "burst", MicroBatches: 1 + i%7}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SubmitMeta(tps.RunMeta{Job: "burst", MicroBatches: 42}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond)
	secs := time.Since(start).Seconds()
	if n := got.Load(); n < 1 || float64(n) > secs+2 {
		t.Errorf("%d publishes of a job's metadata in %.1f s, want about one a second", n, secs)
	}
	if p := last.Load(); p == nil || !strings.Contains(*p, `"micro_batches":42`) {
		t.Errorf("the last metadata did not reach NATS: %v", p)
	}
}

// Metadata changed within metaMinGap of the last publish reaches NATS
// when the agent closes, not only with a later drain: a one-process job of
// a second lost its token source and steps that way.
func TestMetaChangeSentAtClose(t *testing.T) {
	a, nc := startWithNATS(t, Config{FlushInterval: 10 * time.Millisecond, MetaInterval: time.Hour})
	var last atomic.Pointer[string]
	if _, err := nc.Subscribe(wire.MetaSubject("short"), func(m *nats.Msg) {
		s := string(m.Data)
		last.Store(&s)
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	if err := a.SubmitMeta(tps.RunMeta{Job: "short", MicroBatches: 2}); err != nil {
		t.Fatal(err)
	}
	if err := a.SubmitMeta(tps.RunMeta{Job: "short", Steps: tps.StepsLoop, DataSource: "before_forward"}); err != nil {
		t.Fatal(err)
	}
	a.Close()
	nc.Flush()
	deadline := time.Now().Add(2 * time.Second)
	for {
		p := last.Load()
		if p != nil && strings.Contains(*p, `"steps":"loop"`) && strings.Contains(*p, `"micro_batches":2`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last metadata did not reach NATS at close: %v", p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A token source outside tps.TokenSourceText is rejected with its count; a
// known one merges into the job's metadata.
func TestMetaTokenSource(t *testing.T) {
	a, nc := startWithNATS(t, Config{FlushInterval: 10 * time.Millisecond, MetaInterval: time.Hour})
	got := make(chan string, 4)
	if _, err := nc.Subscribe(wire.MetaSubject("src"), func(m *nats.Msg) { got <- string(m.Data) }); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	if err := a.SubmitMeta(tps.RunMeta{Job: "src", TokenSource: strings.Repeat("x", 5000)}); err == nil || len(err.Error()) > 200 {
		t.Fatalf("unknown token source: %v", err)
	}
	if n := a.Stats().Rejected["meta:token_source"]; n != 1 {
		t.Errorf("meta:token_source rejections %d, want 1", n)
	}
	if err := a.SubmitMeta(tps.RunMeta{Job: "src", TokenSource: "forward", MicroBatches: 3}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if !strings.Contains(m, `"token_source":"forward"`) || !strings.Contains(m, `"micro_batches":3`) {
			t.Errorf("metadata %s", m)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no metadata published")
	}
}
