package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
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

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tpsprof")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/tpsprof/tpsprof/cmd/tpsprof")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// rankRowsOnce checks that a job's rank_steps hold want rows, each
// (step, rank) once.
func rankRowsOnce(t *testing.T, jobDir string, want int) {
	t.Helper()
	ranks, err := trace.ReadAll[tps.StepRecord](filepath.Join(jobDir, trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]int{}
	for _, r := range ranks {
		seen[[2]int64{r.Step, r.Rank}]++
	}
	if len(ranks) != want || len(seen) != want {
		t.Errorf("rank_steps: %d rows, %d distinct (step, rank); want %d of each", len(ranks), len(seen), want)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("step %d rank %d written %d times", k[0], k[1], n)
		}
	}
}

// kill -9 of a durable collector at a random moment, twice, while a job
// publishes: after the restarts every record is in rank_steps exactly once,
// every step has exactly one complete cluster row, and no torn part exists.
func TestDurableCollectorSurvivesKill9(t *testing.T) {
	bin := buildBinary(t)
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "collector", "--durable", "--nats", srv.URL(), "--out", out, "--grace", "30s",
			"--part-age", "150ms", "--live", "0", "--http", "")
		logf, _ := os.Create(filepath.Join(out, fmt.Sprintf("collector-%d.log", time.Now().UnixNano())))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	col := start()
	// wait for the stream
	waitStream(t, srv.URL())
	const steps, world = 300, 4
	rng := rand.New(rand.NewPCG(7, 7))
	kills := map[int]bool{60 + rng.IntN(60): true, 180 + rng.IntN(60): true}
	t0 := time.Now().Add(-time.Hour).UnixNano()
	for s := 0; s < steps; s++ {
		// each rank sends its own message; rank order shuffled
		for _, r := range rng.Perm(world) {
			rec := tps.StepRecord{Job: "dur", Step: int64(s), Rank: int64(r), WorldSize: world, Tokens: 100,
				StartUnixNs: t0 + int64(s)*1e9, EndUnixNs: t0 + int64(s)*1e9 + 5e8, DurationNs: 5e8}
			if err := nc.Publish(wire.StepsSubject("dur", "n"+fmt.Sprint(r)), wire.AppendSteps(nil, []tps.StepRecord{rec})); err != nil {
				t.Fatal(err)
			}
			if kills[s] && r == 1 { // mid-step: some ranks of this step are in, some not
				nc.Flush()
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
				col.Process.Kill() // SIGKILL
				col.Wait()
				col = start()
			}
		}
		if s%10 == 0 {
			nc.Flush()
			time.Sleep(40 * time.Millisecond) // about 1.2 s of publishing in all
		}
	}
	nc.Flush()
	// Let it consume and checkpoint: the job sends no run metadata, so a
	// restarted collector holds its steps for --meta-wait (2 s) first.
	time.Sleep(4 * time.Second)
	col.Process.Signal(syscall.SIGTERM)
	if err := col.Wait(); err != nil {
		logs, _ := filepath.Glob(filepath.Join(out, "collector-*.log"))
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			t.Logf("%s:\n%s", l, b)
		}
		t.Fatalf("collector exit: %v", err)
	}
	defer func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(out, "collector-*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", filepath.Base(l), b)
			}
		}
	}()
	rankRowsOnce(t, filepath.Join(out, "dur"), steps*world)
	cluster, err := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "dur", trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[int64]tps.ClusterStep{}
	for _, c := range cluster {
		if _, dup := rows[c.Step]; dup {
			t.Errorf("step %d has two cluster rows", c.Step)
		}
		rows[c.Step] = c
	}
	if len(rows) != steps {
		t.Errorf("got %d cluster rows, want %d", len(rows), steps)
		for s := int64(0); s < steps; s++ {
			if _, ok := rows[s]; !ok {
				t.Errorf("no cluster row for step %d", s)
			}
		}
	}
	for s, c := range rows {
		if c.RanksReported != world || c.Tokens != 400 {
			t.Errorf("step %d: %d ranks, %d tokens; want %d and 400", s, c.RanksReported, c.Tokens, world)
		}
	}
}

// kill -9 of one of two durable rank writers while a job publishes: the
// messages it held come back to the pool when their acknowledgement wait
// runs out (30 s at this part age), so every rank row reaches Parquet (at
// least once: the dead writer may have written some before dying) and the
// stream ends empty.
func TestDurableRankWriterSurvivesKill9(t *testing.T) {
	bin := buildBinary(t)
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	start := func(id string) *exec.Cmd {
		cmd := exec.Command(bin, "collector", "--role", "rank-writer", "--durable", "--nats", srv.URL(), "--out", out,
			"--part-age", "150ms", "--live", "0", "--http", "")
		logf, _ := os.Create(filepath.Join(out, "writer-"+id+".log"))
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	defer func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(out, "writer-*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", filepath.Base(l), b)
			}
		}
	}()
	// One after the other: nats-server has a data race between a stream
	// update and a consumer creation arriving at once, which -race reports
	// here since the server runs in the test process.
	a := start("a")
	waitStream(t, srv.URL())
	waitConsumer(t, srv.URL(), collector.RankWriterConsumer)
	b := start("b")
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const steps, world = 200, 8
	t0 := time.Now().Add(-time.Hour).UnixNano()
	for s := 0; s < steps; s++ {
		for r := 0; r < world; r++ {
			rec := tps.StepRecord{Job: "rw", Step: int64(s), Rank: int64(r), WorldSize: world, Tokens: 100,
				StartUnixNs: t0 + int64(s)*1e9, EndUnixNs: t0 + int64(s)*1e9 + 5e8, DurationNs: 5e8}
			if err := nc.Publish(wire.StepsSubject("rw", fmt.Sprint("n", r)), wire.AppendSteps(nil, []tps.StepRecord{rec})); err != nil {
				t.Fatal(err)
			}
		}
		if s%20 == 0 {
			nc.Flush()
			time.Sleep(30 * time.Millisecond)
		}
		if s == steps/2 {
			a.Process.Kill() // SIGKILL: what it held unacknowledged waits out its AckWait
			a.Wait()
			a = start("a2")
		}
	}
	nc.Flush()
	waitStreamEmpty(t, srv.URL(), 90*time.Second)
	for _, w := range []*exec.Cmd{a, b} {
		w.Process.Signal(syscall.SIGTERM)
		if err := w.Wait(); err != nil {
			t.Fatalf("writer exit: %v", err)
		}
	}
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(out, "rw", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]int{}
	for _, r := range rows {
		seen[[2]int64{r.Step, r.Rank}]++
	}
	if len(seen) != steps*world {
		t.Errorf("%d distinct (step, rank) in rank_steps, want %d: rows lost", len(seen), steps*world)
	}
	t.Logf("%d rank rows for %d records: %d written twice (at least once in this mode)", len(rows), steps*world, len(rows)-len(seen))
	if tmp, _ := filepath.Glob(filepath.Join(out, "rw", trace.RankSteps, ".*.tmp")); len(tmp) > 0 {
		t.Logf("%d temporary parts left by the killed writer (never read: hidden names)", len(tmp))
	}
}

func waitConsumer(t *testing.T, url, name string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	for deadline := time.Now().Add(20 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.Consumer(ctx, collector.StreamName, name)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer %s not created: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Someone holding a credential that may deletes the durable stream while a
// job runs: the collector creates it again with its consumer, the durable
// agent's retries then land, and every step sent after the deletion and
// every one the collector had handled before reaches Parquet once. Or
// changes its configuration in place (its subjects elsewhere, a message
// limit of one: 0 of 80 records landed, and the watch never repaired it):
// the collector puts it back, with the same outcome.
func TestDurableStreamDeletedIsCreatedAgain(t *testing.T) {
	t.Run("deleted", func(t *testing.T) {
		streamAttackSurvived(t, 100*time.Millisecond, func(ctx context.Context, js jetstream.JetStream, _ func()) error {
			return js.DeleteStream(ctx, collector.StreamName)
		})
	})
	t.Run("changed in place", func(t *testing.T) {
		streamAttackSurvived(t, 100*time.Millisecond, func(ctx context.Context, js jetstream.JetStream, _ func()) error {
			st, err := js.Stream(ctx, collector.StreamName)
			if err != nil {
				return err
			}
			cfg := st.CachedInfo().Config
			cfg.Subjects, cfg.MaxMsgs = []string{"elsewhere.>"}, 1
			_, err = js.UpdateStream(ctx, cfg)
			return err
		})
	})
	// the durable consumer changed in place (a filter that takes none of
	// the records, one message pending at most): 0 of 80 records, or 32,
	// until the collector restarted; it is put back as the stream is. The
	// rest of the records are stored while the filter is elsewhere, the
	// window where a consumer may step over them (the server does not
	// rewind it when its filter comes back): CI once waited 10 s there for
	// a record with a collector that updated the filter in place ("messages
	// up to 3 not handled (at 2)"; not reproduced here in 30 runs).
	t.Run("consumer changed in place", func(t *testing.T) {
		streamAttackSurvived(t, time.Second, func(ctx context.Context, js jetstream.JetStream, sendRest func()) error {
			cons, err := js.Consumer(ctx, collector.StreamName, collector.ConsumerName)
			if err != nil {
				return err
			}
			for { // the records so far acknowledged (a checkpoint): the consumer is free to step
				ci, err := cons.Info(ctx)
				if err != nil {
					return err
				}
				if ci.NumAckPending == 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			cfg := cons.CachedInfo().Config
			cfg.FilterSubject, cfg.FilterSubjects, cfg.MaxAckPending = "tpsprof.elsewhere.>", nil, 1
			if _, err = js.UpdateConsumer(ctx, collector.StreamName, cfg); err != nil {
				return err
			}
			sendRest()
			return nil
		})
	})
}

// streamAttackSurvived runs a job through a durable collector that checks
// its stream every check, attacked half way.
func streamAttackSurvived(t *testing.T, check time.Duration, attack func(ctx context.Context, js jetstream.JetStream, sendRest func()) error) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Durable: true,
		StreamCheck: check, Writer: trace.WriterOptions{PartAge: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			col.Close()
		}
	}()
	dir, _ := os.MkdirTemp("", "tpsprof-streamdel")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Durable: true, FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const world = 2
	if err := a.SubmitMeta(tps.RunMeta{Job: "streamdel", Topology: tps.DataParallel(world)}); err != nil {
		t.Fatal(err)
	}
	send := func(from, to int64) {
		for s := from; s < to; s++ {
			for r := range int64(world) {
				if err := a.SubmitStep(stepRec("streamdel", s, r, world, 100, 1e9)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	send(0, 20)
	if err := a.Flush(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := col.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// published while the stream is gone or elsewhere (the agent retries),
	// or inside the attack, flushed
	rest := sync.OnceFunc(func() { send(20, 40) })
	sendRest := func() {
		rest()
		if err := a.Flush(15 * time.Second); err != nil {
			t.Errorf("the durable agent's records after the attack: %v", err)
		}
	}
	if err := attack(ctx, js, sendRest); err != nil {
		t.Fatal(err)
	}
	rest()
	deadline := time.Now().Add(15 * time.Second)
	for col.Stats().StreamRecreated == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the stream was not put back: %+v", col.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := a.Flush(15 * time.Second); err != nil {
		t.Fatalf("the durable agent's records after the deletion: %v", err)
	}
	if err := col.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	closed = true
	if err := col.Close(); err != nil {
		t.Fatal(err)
	}
	rankRowsOnce(t, filepath.Join(out, "streamdel"), 40*world)
	cluster, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "streamdel", trace.ClusterSteps))
	if len(cluster) != 40 {
		t.Errorf("%d cluster rows, want 40", len(cluster))
	}
}
