package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
)

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// natsCluster runs three nats-server processes with routes and JetStream.
type natsCluster struct {
	t      *testing.T
	bin    string
	dir    string
	ports  [3]int
	cports [3]int
	procs  [3]*exec.Cmd
}

func (c *natsCluster) start(i int) {
	var routes []string
	for j := range 3 {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", c.cports[j]))
		}
	}
	cmd := exec.Command(c.bin, "-name", fmt.Sprintf("n%d", i), "-port", fmt.Sprint(c.ports[i]), "-cluster-port", fmt.Sprint(c.cports[i]),
		"-routes", strings.Join(routes, ","), "-store", filepath.Join(c.dir, fmt.Sprintf("n%d", i)))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.procs[i] = cmd
}

func (c *natsCluster) kill(i int) {
	c.procs[i].Process.Signal(syscall.SIGKILL)
	c.procs[i].Wait()
}

func (c *natsCluster) url() string {
	var u []string
	for _, p := range c.ports {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	return strings.Join(u, ",")
}

// A NATS cluster of three servers (routes, JetStream, the stream replicated
// on all three), durable agents and collector; one server is killed (-9)
// mid-job and restarted: every rank row and cluster row is in Parquet once.
func TestNATSClusterServerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three server processes")
	}
	dir := t.TempDir()
	c := &natsCluster{t: t, bin: filepath.Join(dir, "natsnode"), dir: dir}
	if out, err := exec.Command("go", "build", "-o", c.bin, "./testdata/natsnode").CombinedOutput(); err != nil {
		t.Fatalf("build natsnode: %v\n%s", err, out)
	}
	for i := range 3 {
		c.ports[i], c.cports[i] = freePort(t), freePort(t)
	}
	for i := range 3 {
		c.start(i)
	}
	defer func() {
		for i := range 3 {
			if c.procs[i] != nil && c.procs[i].ProcessState == nil {
				c.kill(i)
			}
		}
	}()
	// JetStream is ready when a stream of three replicas can be placed:
	// the meta leader elected is not enough (until every peer has reported
	// in, placement fails with "no suitable peers for placement")
	nc, err := nats.Connect(c.url(), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "READY_PROBE", Subjects: []string{"ready.probe"},
			Replicas: 3, Storage: jetstream.MemoryStorage})
		if err == nil {
			err = js.DeleteStream(ctx, "READY_PROBE")
		}
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream cluster not ready: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	nc.Close()

	out := t.TempDir()
	col, err := collector.New(collector.Config{OutDir: out, NATS: natsconn.Options{URL: c.url()}, Durable: true, StreamReplicas: 3,
		Grace: 20 * time.Second, Writer: trace.WriterOptions{PartAge: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "a.sock")
	a, err := agent.Start(agent.Config{Socket: sock, NATS: natsconn.Options{URL: c.url()}, Durable: true, Node: "n0", FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const steps, world = 30, 4
	for s := int64(0); s < steps; s++ {
		switch s {
		case 10:
			c.kill(1)
		case 20:
			c.start(1)
		}
		for r := int64(0); r < world; r++ {
			if err := a.SubmitStep(stepRec("cluster", s, r, world, 100, 1e8)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := a.Flush(60 * time.Second); err != nil {
		t.Fatalf("agent flush: %v", err)
	}
	a.Close()
	if err := col.Sync(60 * time.Second); err != nil {
		t.Fatalf("collector sync: %v", err)
	}
	if err := col.Close(); err != nil {
		t.Fatal(err)
	}
	ranks, err := trace.ReadAll[tps.StepRecord](filepath.Join(out, "cluster", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]int{}
	for _, r := range ranks {
		seen[[2]int64{r.Step, r.Rank}]++
	}
	cl, err := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "cluster", trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	steps2 := map[int64]int{}
	for _, s := range cl {
		steps2[s.Step]++
		if s.RanksReported != world {
			t.Errorf("step %d: %d ranks", s.Step, s.RanksReported)
		}
	}
	if len(ranks) != steps*world || len(seen) != steps*world || len(cl) != steps || len(steps2) != steps {
		t.Errorf("rank rows %d (%d distinct), cluster rows %d (%d distinct); want %d and %d, each once", len(ranks), len(seen), len(cl), len(steps2), steps*world, steps)
	}
}
