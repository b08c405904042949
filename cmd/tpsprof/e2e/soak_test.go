package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// TestSoak runs a compressed-time job through durable agents, a JetStream
// stream and a durable collector subprocess, with the NATS server
// restarted, the collector killed with SIGKILL, and malformed traffic on the
// socket and on the subjects, and ends with counts that prove every
// accepted record is in Parquet exactly once.
//
// The short version runs in CI. The long one (256 ranks × 20,000 steps):
//
//	TPSPROF_SOAK=long go test -run TestSoak -timeout 2h -v ./cmd/tpsprof/e2e/
func TestSoak(t *testing.T) {
	nodes, perNode, steps := 8, 16, 150
	if os.Getenv("TPSPROF_SOAK") == "long" {
		nodes, perNode, steps = 32, 8, 20000
	}
	world := nodes * perNode
	bin := buildBinary(t)
	store := t.TempDir()
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, store)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := splitAddr(srv.Server().Addr().String())
	url := srv.URL()
	defer func() { srv.Shutdown() }()
	out := t.TempDir()
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "collector", "--durable", "--nats", url, "--out", out, "--grace", "60s",
			"--part-age", "300ms", "--live", "0", "--http", "")
		logf, _ := os.Create(filepath.Join(out, fmt.Sprintf("collector-%d.log", time.Now().UnixNano())))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	col := start()
	defer func() {
		col.Process.Kill()
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(out, "collector-*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%.4000s", filepath.Base(l), b)
			}
		}
	}()
	waitStream(t, url)

	dir, _ := os.MkdirTemp("", "tpsprof-soak")
	defer os.RemoveAll(dir)
	agents := make([]*agent.Agent, nodes)
	for n := range agents {
		a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, fmt.Sprintf("n%d.sock", n)), NATS: natsconn.Options{URL: url},
			Node: fmt.Sprintf("node-%d", n), FlushInterval: 20 * time.Millisecond, Durable: true, BufferBytes: 512 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		agents[n] = a
	}
	garbage, _ := nats.Connect(url)
	defer garbage.Close()
	t0 := time.Now().Add(-time.Duration(steps+60) * time.Second).UnixNano()
	var invalid int64
	for s := 0; s < steps; s++ {
		for r := 0; r < world; r++ {
			rec := tps.StepRecord{Job: "soak", Step: int64(s), Rank: int64(r), WorldSize: int64(world), Tokens: 2048,
				StartUnixNs: t0 + int64(s)*1e9, EndUnixNs: t0 + int64(s)*1e9 + 9e8, DurationNs: 9e8 - int64(r%7)*1e6, ExposedCommNs: 1e8}
			agents[r/perNode].SubmitStep(rec)
		}
		switch s {
		case steps / 3: // NATS restarts; agents hold and resend
			srv.Shutdown()
			time.Sleep(300 * time.Millisecond)
			if srv, err = natsconn.StartEmbedded(host, port, store); err != nil {
				t.Fatal(err)
			}
		case 2 * steps / 3: // the collector dies mid-run
			col.Process.Kill()
			col.Wait()
			col = start()
		}
		if s%10 == 5 { // malformed traffic
			garbage.Publish(wire.StepsSubject("soak", "evil"), []byte("\x00not a batch"))
			garbage.Publish(wire.EventsSubject("soak"), []byte("{broken"))
			c, err := net.Dial("unix", agents[0].Socket())
			if err == nil {
				c.Write([]byte("garbage\n{\"job\":\"soak\",\"step\":1,\"rank\":0,\"world_size\":1,\"tokens\":-9,\"start_unix_ns\":1760000000000000000,\"end_unix_ns\":1760000001000000000}\n"))
				c.Close()
				invalid += 2
			}
		}
		if s%25 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Deliver everything, then wait until the stream holds nothing unacknowledged.
	for _, a := range agents {
		deadline := time.Now().Add(60 * time.Second)
		for a.Stats().BufferedBytes > 0 || a.Stats().Published+a.Stats().Dropped < a.Stats().Records {
			a.Flush(time.Second)
			if time.Now().After(deadline) {
				t.Fatalf("agent did not deliver: %+v", a.Stats())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var rejected, dropped int64
	for _, a := range agents {
		st := a.Stats()
		dropped += st.Dropped
		for _, v := range st.Rejected {
			rejected += v
		}
	}
	if dropped != 0 {
		t.Errorf("agents dropped %d records", dropped)
	}
	if rejected < invalid {
		t.Errorf("agents rejected %d lines, want at least the %d malformed ones", rejected, invalid)
	}
	waitStreamEmpty(t, url, 120*time.Second)
	col.Process.Signal(syscall.SIGTERM)
	if err := col.Wait(); err != nil {
		t.Fatalf("collector: %v", err)
	}
	// Exactly once: every accepted record, once; every step, one complete row.
	keys := map[[2]int64]int{}
	var rows int
	err = trace.Each(filepath.Join(out, "soak", trace.RankSteps), func(rs []tps.StepRecord) error {
		for _, r := range rs {
			keys[[2]int64{r.Step, r.Rank}]++
			rows++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := steps * world; rows != want || len(keys) != want {
		t.Errorf("rank_steps: %d rows, %d distinct, want %d", rows, len(keys), want)
	}
	cluster, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "soak", trace.ClusterSteps))
	perStep := map[int64]int{}
	for _, c := range cluster {
		perStep[c.Step]++
		if c.RanksReported != int64(world) || c.Tokens != int64(world)*2048 {
			t.Errorf("step %d: %d ranks %d tokens", c.Step, c.RanksReported, c.Tokens)
		}
	}
	if len(perStep) != steps || len(cluster) != steps {
		t.Errorf("cluster_steps: %d rows for %d steps, want %d", len(cluster), len(perStep), steps)
	}
	t.Logf("soak: %d ranks × %d steps = %d records exactly once; %d malformed lines rejected by agents", world, steps, rows, rejected)
}

func waitStream(t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.Stream(ctx, collector.StreamName)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream not created: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitStreamEmpty(t *testing.T, url string, timeout time.Duration) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := js.Stream(ctx, collector.StreamName)
		var n uint64 = 1
		if err == nil {
			if info, err := st.Info(ctx); err == nil {
				n = info.State.Msgs
			}
		}
		cancel()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream still holds %d unacknowledged messages", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
