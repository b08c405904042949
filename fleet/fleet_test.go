package fleet_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/fleet"
	"github.com/tpsprof/tpsprof/internal/browser"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// simClock is the simulation's time: jobs run one after another in it,
// far faster than on the wall clock.
type simClock struct{ ns atomic.Int64 }

func (c *simClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// simGPUs is one simulated node's 8 GPUs (a fake at the hardware
// boundary: NVML has no GPU here). On the throttling node GPU 3 reports a
// hardware slowdown in every sample, runs hot and draws less power.
type simGPUs struct {
	node      int
	throttles bool
}

var _ agent.GPUReader = simGPUs{}

func (g simGPUs) uuid(i int) string { return fmt.Sprintf("GPU-fleet-%02d-%d", g.node, i) }

func (g simGPUs) Devices() []agent.GPUInfo {
	out := make([]agent.GPUInfo, gpusPerNode)
	for i := range out {
		out[i] = agent.GPUInfo{Index: i, UUID: g.uuid(i), Name: "NVIDIA H100 80GB HBM3"}
	}
	return out
}

func (g simGPUs) Sample(i int) (tps.GPUSample, error) {
	temp, power, reasons := int64(66), 640.0, int64(0)
	if g.throttles && i == throttledGPU {
		temp, power, reasons = 91, 520, 0x8|0x40 // hardware slowdown, hardware thermal slowdown
	}
	zero := int64(0)
	return tps.GPUSample{Index: int32(i), UUID: g.uuid(i), Name: "NVIDIA H100 80GB HBM3", TempC: &temp, PowerW: &power,
		ClockEventReason: &reasons, XIDEvents: &zero, ECCUncorrected: &zero}, nil
}

func (g simGPUs) Close() error { return nil }

const (
	nodes, gpusPerNode = 32, 8
	throttledGPU       = 3
	baseOwn            = 200 * time.Millisecond
	commTime           = 20 * time.Millisecond
	jitter             = 0.02
)

// fleetSim is the simulated fleet: 32 nodes of 8 GPUs, each with a real
// agent, one real collector on a real NATS server; 2 nodes chronically
// slow (3% and 5%), one whose GPU 3 throttles (and is 10% slow).
type fleetSim struct {
	t       *testing.T
	rng     *rand.Rand
	clock   simClock
	nats    natsconn.Options
	out     string
	agents  []*agent.Agent
	col     *collector.Collector
	slow    map[int]float64 // node -> own-time factor − 1, all its GPUs
	throt   int             // the throttling node
	steps   int
	jobsRun int
	// injected: per node, GPU-hours the simulation's slowness cost, by its
	// own account (each step's wall time with the slowness against the
	// same draws without it, times the ranks)
	injected map[int]float64
	// jobsOf: per node, the jobs that ran on it so far
	jobsOf map[int]int
}

func newFleetSim(t *testing.T, seed uint64, steps int) *fleetSim {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	s := &fleetSim{t: t, rng: rand.New(rand.NewPCG(seed, 7)), nats: natsconn.Options{URL: srv.URL()}, out: t.TempDir(),
		steps: steps, injected: map[int]float64{}, jobsOf: map[int]int{}}
	s.clock.ns.Store(time.Now().Add(-48 * time.Hour).UnixNano())
	perm := s.rng.Perm(nodes)
	s.slow = map[int]float64{perm[0]: 0.03, perm[1]: 0.05}
	s.throt = perm[2]
	sock := t.TempDir()
	for n := range nodes {
		a, err := agent.Start(agent.Config{Socket: filepath.Join(sock, fmt.Sprintf("n%d.sock", n)), NATS: s.nats,
			Node: fmt.Sprintf("node-%02d", n), FlushInterval: 20 * time.Millisecond,
			GPU: simGPUs{node: n, throttles: n == s.throt}, GPUInterval: -1, Clock: s.clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		s.agents = append(s.agents, a)
	}
	s.startCollector()
	return s
}

func (s *fleetSim) startCollector() {
	c, err := collector.New(collector.Config{OutDir: s.out, NATS: s.nats, Grace: time.Minute, QuietAfter: time.Hour,
		NodesEvery: time.Hour, FiguresEvery: -1, Writer: trace.WriterOptions{Codec: "snappy"}}) // (zstd's encoder set-up was a tenth of the test)
	if err != nil {
		s.t.Fatal(err)
	}
	s.col = c
}

// factor is a rank's own-time factor on node n, GPU g.
func (s *fleetSim) factor(n, g int) float64 {
	f := 1 + s.slow[n]
	if n == s.throt && g == throttledGPU {
		f *= 1.10
	}
	return f
}

// runJob places a job on 4-7 random nodes and runs it through the
// agents: each rank's own time 200 ms ±2% a step times its node's factor,
// the others waiting for the slowest in the step's communication.
func (s *fleetSim) runJob() {
	t := s.t
	s.jobsRun++
	job := fmt.Sprintf("job-%02d", s.jobsRun)
	k := 4 + s.rng.IntN(4)
	placed := s.rng.Perm(nodes)[:k]
	world := k * gpusPerNode
	meta := tps.RunMeta{Job: job}
	for _, n := range placed {
		if err := s.agents[n].SubmitMeta(meta); err != nil {
			t.Fatal(err)
		}
		s.jobsOf[n]++
	}
	clients := make([]*client.Client, world)
	recs := make([]*tps.Recorder, world)
	for r := range world {
		n := placed[r/gpusPerNode]
		clients[r] = client.New(s.agents[n].Socket(), client.Options{Queue: 256})
		lr := int32(r % gpusPerNode)
		var err error
		recs[r], err = tps.NewRecorder(tps.RecorderConfig{Job: job, Rank: int64(r), WorldSize: int64(world), LocalRank: &lr}, clients[r])
		if err != nil {
			t.Fatal(err)
		}
	}
	own := make([]time.Duration, world)
	for st := range s.steps {
		now := s.clock.Now()
		for _, n := range placed {
			s.agents[n].SampleGPUs()
		}
		var wall, wallWithout time.Duration
		for r := range world {
			n, g := placed[r/gpusPerNode], r%gpusPerNode
			draw := float64(baseOwn) * (1 + jitter*(2*s.rng.Float64()-1))
			own[r] = time.Duration(draw * s.factor(n, g))
			wall = max(wall, own[r])
			without := time.Duration(draw)
			if n == s.throt && g == throttledGPU {
				without = own[r] // the throttling GPU's cost is not the chronic nodes'
			}
			wallWithout = max(wallWithout, without)
		}
		for _, n := range placed {
			if s.slow[n] > 0 && st >= fleet.WarmSteps {
				// what this node's slowness cost the step: the step with it
				// against the same draws with the node at full speed
				alt := time.Duration(0)
				for r := range world {
					o := own[r]
					if placed[r/gpusPerNode] == n {
						o = time.Duration(float64(o) / (1 + s.slow[n]))
					}
					alt = max(alt, o)
				}
				s.injected[n] += float64(wall-alt) * float64(world) / 3.6e12
			}
		}
		for r := range world {
			d := wall + commTime
			p := tps.Phases{Fwd: own[r] * 3 / 10, Bwd: own[r] * 6 / 10, Optim: own[r] / 10, Comm: d - own[r], ExposedComm: d - own[r]}
			if err := recs[r].Record(int64(st), now, now.Add(d), 4096, p); err != nil {
				t.Fatal(err)
			}
		}
		s.clock.ns.Add(int64(wall + commTime))
	}
	clients[0].SendEvent(tps.Event{Job: job, Kind: tps.EventAttemptEnd, Rank: 0, StartUnixNs: s.clock.Now().UnixNano(), EndUnixNs: s.clock.Now().UnixNano()})
	for _, c := range clients {
		c.Close(10 * time.Second)
	}
	var wg sync.WaitGroup
	for _, n := range placed {
		wg.Go(func() { s.agents[n].Flush(10 * time.Second) })
	}
	wg.Wait()
	s.clock.ns.Add(int64(5 * time.Minute)) // the next job starts later
	if err := s.col.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// the job's parts are finalised once its last step closes (job_end)
	deadline := time.Now().Add(30 * time.Second)
	for {
		js, _ := report.Jobs(s.out)
		i := slices.IndexFunc(js, func(j report.JobInfo) bool { return j.Name == job })
		if i >= 0 && !js[i].Running && js[i].Parts > 0 && rankRows(filepath.Join(s.out, job)) == world*s.steps {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not finalised after 30 s: %+v", job, js)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !s.col.RefreshNodes(30 * time.Second) {
		t.Fatal("no node pass")
	}
}

func (s *fleetSim) drained() map[string]fleet.Node {
	v := s.col.Nodes()
	if v == nil || v.Err != "" {
		s.t.Fatalf("node view: %+v", v)
	}
	out := map[string]fleet.Node{}
	for _, n := range v.Nodes {
		if n.Drain {
			out[n.Host] = n
		}
	}
	return out
}

// rankRows counts the rank rows in a job's finalised parts.
func rankRows(dir string) int {
	n := 0
	trace.EachColumnsStrs(filepath.Join(dir, trace.RankSteps), []string{"step"}, nil, nil, func(c *trace.Columns) error {
		n += c.Rows
		return nil
	})
	return n
}

func host(n int) string { return fmt.Sprintf("node-%02d", n) }

// The simulated fleet: 32 nodes × 8 GPUs, 20 jobs placed at random
// through real agents and a real collector; 2 nodes chronically 3% and 5%
// slow, one with a throttling GPU. Each bad node is a drain candidate
// after at most 3 jobs containing it (the throttling one after its first),
// no healthy node ever is (precision over 5 seeds ≥ 0.9: here none at
// all), the GPU-hours each chronic node cost within 5% of what the
// simulation injected, and a collector restart after job 10 loses none of
// it (the node rows are in OUT/nodes/, the jobs' folders beside them).
func TestSimulatedFleet(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5}
	steps := 20
	if testing.Short() {
		seeds = seeds[:1]
	}
	var flaggedBad, flaggedHealthy int
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s := newFleetSim(t, seed, steps)
			bad := map[int]bool{s.throt: true}
			for n := range s.slow {
				bad[n] = true
			}
			firstFlag := map[int]int{} // node -> jobs containing it when first flagged
			for j := 1; j <= 20; j++ {
				s.runJob()
				d := s.drained()
				for n := range nodes {
					if _, ok := d[host(n)]; ok {
						if _, seen := firstFlag[n]; !seen {
							firstFlag[n] = s.jobsOf[n]
						}
					}
				}
				if j == 10 { // a collector restart mid-fleet
					before := s.col.Nodes()
					if err := s.col.Close(); err != nil {
						t.Fatal(err)
					}
					s.startCollector()
					if !s.col.RefreshNodes(30 * time.Second) {
						t.Fatal("no node pass after the restart")
					}
					after := s.col.Nodes()
					if after == nil || after.Jobs != before.Jobs || after.Computed != 0 || len(after.Nodes) != len(before.Nodes) {
						t.Fatalf("after a restart: %+v, before %d jobs and %d nodes", after, before.Jobs, len(before.Nodes))
					}
					for i := range before.Nodes {
						a, b := after.Nodes[i], before.Nodes[i]
						if a.Host != b.Host || a.Jobs != b.Jobs || math.Abs(a.CostGPUHours-b.CostGPUHours) > 1e-12 || a.Drain != b.Drain {
							t.Errorf("after a restart %+v, before %+v", a, b)
						}
					}
				}
			}
			v := s.col.Nodes()
			if v.Jobs != 20 || len(v.Failed) != 0 {
				t.Fatalf("%d jobs in the view, failed %v", v.Jobs, v.Failed)
			}
			for n := range nodes {
				at, flagged := firstFlag[n]
				switch {
				case bad[n] && s.jobsOf[n] >= 3 && (!flagged || at > 3):
					t.Errorf("node %d (slow %.0f%%, throttles %v) in %d jobs: flagged at its job %d (%v)", n, 100*s.slow[n], n == s.throt, s.jobsOf[n], at, flagged)
				case n == s.throt && s.jobsOf[n] >= 1 && (!flagged || at > 1):
					t.Errorf("throttling node %d: flagged at its job %d (%v), want its first", n, at, flagged)
				case !bad[n] && flagged:
					flaggedHealthy++
					t.Errorf("healthy node %d flagged at its job %d: %+v", n, at, s.drained()[host(n)])
				case bad[n] && flagged:
					flaggedBad++
				}
			}
			for _, node := range v.Nodes {
				var n int
				fmt.Sscanf(node.Host, "node-%d", &n)
				if s.slow[n] == 0 {
					continue
				}
				want := s.injected[n]
				if math.Abs(node.CostGPUHours-want) > 0.05*want {
					t.Errorf("%s (slow %.0f%%): %.5f GPU-hours lost by tpsprof's account, %.5f injected", node.Host, 100*s.slow[n], node.CostGPUHours, want)
				}
				t.Logf("%s (slow %.0f%%, %d jobs): score %.4f, %.5f GPU-hours (injected %.5f): %s", node.Host, 100*s.slow[n], node.Jobs, node.Score, node.CostGPUHours, want, node.Why)
			}
			if seed == seeds[0] {
				checkViews(t, s.col, v)
			}
			if err := s.col.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(s.out, fleet.Table)); err != nil {
				t.Fatal(err)
			}
		})
	}
	if flaggedBad+flaggedHealthy > 0 {
		p := float64(flaggedBad) / float64(flaggedBad+flaggedHealthy)
		t.Logf("precision over %d seeds: %.3f (%d bad nodes flagged, %d healthy)", len(seeds), p, flaggedBad, flaggedHealthy)
		if p < 0.9 {
			t.Errorf("precision %.3f < 0.9", p)
		}
	}
}

// checkViews: the collector's node view on /api/nodes, /metrics (each host
// a drain candidate 1, the others 0, its GPU-hours) and the live page as
// Chromium renders it (the drain candidates' rows).
func checkViews(t *testing.T, c *collector.Collector, v *collector.NodesView) {
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	get := func(path string) string {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s %s", path, resp.Status, b)
		}
		return string(b)
	}
	var api collector.NodesView
	if err := json.Unmarshal([]byte(get("/api/nodes")), &api); err != nil {
		t.Fatal(err)
	}
	if api.Jobs != v.Jobs || len(api.Nodes) != len(v.Nodes) || api.Nodes[0].Host != v.Nodes[0].Host || api.Nodes[0].CostGPUHours != v.Nodes[0].CostGPUHours {
		t.Errorf("/api/nodes %+v, the view %+v", api, v)
	}
	metrics := get("/metrics")
	var drains []string
	for _, n := range v.Nodes {
		want := "0"
		if n.Drain {
			want = "1"
			drains = append(drains, n.Host)
		}
		if line := fmt.Sprintf("tpsprof_node_drain_candidate{host=%q} %s\n", n.Host, want); !strings.Contains(metrics, line) {
			t.Errorf("/metrics lacks %q", line)
		}
		cost := regexp.MustCompile(fmt.Sprintf(`tpsprof_node_cost_gpu_hours\{host=%q\} (\S+)`, n.Host)).FindStringSubmatch(metrics)
		if cost == nil {
			t.Errorf("/metrics: no cost of %s", n.Host)
			continue
		}
		if got, _ := strconv.ParseFloat(cost[1], 64); math.Abs(got-n.CostGPUHours) > 1e-9*max(1, n.CostGPUHours) {
			t.Errorf("/metrics cost of %s: %v, the view %v", n.Host, cost, n.CostGPUHours)
		}
	}
	dom, err := browser.DumpDOM(srv.URL+"/", t.TempDir())
	if err != nil {
		t.Fatalf("the live page in a browser: %v", err)
	}
	if !strings.Contains(dom, fmt.Sprintf("nodes across %d finished jobs", v.Jobs)) {
		t.Errorf("live page: no nodes section:\n%s", dom)
	}
	for _, h := range drains {
		if !regexp.MustCompile(`<tr class="strag"><td>` + h + `</td>.*?drain: (slow in|hardware)`).MatchString(dom) {
			t.Errorf("live page: %s not shown as a drain candidate", h)
		}
	}
}
