// Package demo runs a whole simulated job through the real product: the
// embedded nats-server, a collector, one real agent per node with its unix
// socket, and ranks that time their steps with tps.Recorder and send them
// through client.Client, i.e. through the socket intake. The simulation has
// jitter, warm-up steps, one straggler node, a communication-heavy phase, a
// checkpoint and evaluation gaps, so every part of the output has something
// to show.
//
// It owns the simulation only: every figure the demo prints comes from the
// product's own packages.
package demo

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// Config shapes the simulated job.
type Config struct {
	Out         string
	Job         string
	Steps       int
	Topology    tps.Topology
	GPUsPerNode int
	Model       string // mfu preset
	GPU         string
	// MicroBatches per replica per step, one sequence each.
	MicroBatches int
	// StragglerNode is slowed by StragglerSlowdown from step Steps/5 on
	// (-1 for none).
	StragglerNode     int
	StragglerSlowdown float64
	// SkewNode's clock (its ranks' step times and its GPU samples) runs
	// Skew ahead of the others' (-1 for none): cluster figures must not
	// change (docs/report.md, "Clocks").
	SkewNode int
	Skew     time.Duration
	// StepInterval paces the simulation in real time so the live line moves.
	StepInterval time.Duration
	Seed         uint64
	Live         io.Writer
	Progress     io.Writer
	// HTTP, when set, serves the collector's live page and metrics there
	// during the run (":0" or "127.0.0.1:0" picks a free port).
	HTTP string
	// Split runs the scale-out path of docs/scale.md instead of one
	// collector: agents publish node partials, an aggregator merges them
	// into cluster rows (with the GPU join, events and the live view), two
	// rank writers in a queue group write rank_steps, all into Out.
	Split  bool
	Logger *slog.Logger
}

// Defaults are a Llama-3-8B-like job on 64 H100s (DP 4 × TP 8 × PP 2).
func Defaults() Config {
	return Config{Out: filepath.Join(os.TempDir(), "tpsprof-demo"), Job: "demo", Steps: 200, Topology: tps.Topology{DP: 4, TP: 8, PP: 2, CP: 1, EP: 1},
		GPUsPerNode: 8, Model: "llama3-8b", GPU: "h100-sxm", MicroBatches: 16, StragglerNode: 5, StragglerSlowdown: 1.35, SkewNode: -1,
		StepInterval: 100 * time.Millisecond, Seed: 1}
}

// Result says where the traces are and what the collector counted.
type Result struct {
	JobDir string
	// Stats are the (aggregating) collector's; with Split its Records
	// count ranks merged from partials.
	Stats       collector.Stats
	RowsWritten int64 // rank rows written
	Records     int64
	Dropped     int64
	Duration    time.Duration
}

// Run simulates the job and returns once every record is in Parquet.
func Run(ctx context.Context, cfg Config) (Result, error) {
	d := &run{cfg: cfg, began: time.Now(), clock: &simClock{}}
	defer d.close()
	for _, stage := range []func() error{d.check, d.clean, d.startServices, d.startAgents, d.startRanks} {
		if err := stage(); err != nil {
			return Result{}, err
		}
	}
	if err := d.simulate(ctx); err != nil {
		return Result{}, err
	}
	return d.drain()
}

// run is one demo: its services, agents and ranks, and what was sent.
type run struct {
	cfg      Config
	began    time.Time
	world    int
	gpu      mfu.GPU
	flops    float64 // model FLOPs a token
	peak     float64
	progress io.Writer
	closers  []func() // run last first

	nopts   natsconn.Options
	col     *collector.Collector
	writers []*collector.Collector
	agents  []*agent.Agent
	clock   *simClock
	stepNow atomic.Int64 // the step being simulated, for the GPUs' straggler state
	clients []*client.Client
	recs    []*tps.Recorder
	sent    int64
	now     time.Time // the simulated clock
}

func (d *run) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

func (d *run) onClose(f func()) { d.closers = append(d.closers, f) }

// check validates the configuration and looks the model and GPU up.
func (d *run) check() error {
	cfg := &d.cfg
	d.world = cfg.Topology.WorldSize()
	if err := cfg.Topology.Validate(d.world); err != nil {
		return err
	}
	if cfg.Steps <= 0 || cfg.GPUsPerNode <= 0 || cfg.MicroBatches <= 0 {
		return fmt.Errorf("demo: steps, GPUs per node and micro-batches must be positive")
	}
	if d.world%cfg.GPUsPerNode != 0 {
		return fmt.Errorf("demo: world size %d is not a multiple of %d GPUs per node", d.world, cfg.GPUsPerNode)
	}
	if !tps.ValidJobID(cfg.Job) {
		return fmt.Errorf("demo: invalid job id %q", cfg.Job)
	}
	model, err := mfu.Preset(cfg.Model)
	if err != nil {
		return err
	}
	counts, err := model.Count(mfu.AttentionFull, mfu.RecomputeNone)
	if err != nil {
		return err
	}
	if d.gpu, err = mfu.LookupGPU(cfg.GPU); err != nil {
		return err
	}
	d.flops = counts.FLOPsPerToken
	d.peak, _ = d.gpu.Peak(mfu.BF16)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d.progress = cfg.Progress
	if d.progress == nil {
		d.progress = io.Discard
	}
	return nil
}

// demoMarker marks a job folder the demo wrote: a later demo replaces it.
const demoMarker = ".tpsprof-demo"

// clean removes the previous demo's job folder (a second demo into the
// same folder would add its steps to the first's, as one attempt: "goodput
// 3.1%, idle 96.7%"); a folder the demo did not write (no marker, and not
// under the demo's own default folder, which older demos wrote unmarked)
// is left alone, and the demo stops, saying so.
func (d *run) clean() error {
	dir := filepath.Join(d.cfg.Out, d.cfg.Job)
	if _, err := os.Stat(dir); err == nil {
		if _, err := os.Stat(filepath.Join(dir, demoMarker)); err != nil && d.cfg.Out != Defaults().Out {
			return fmt.Errorf("demo: %s holds a run the demo did not write: give another --out or --job", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("demo: removing the previous demo's %s: %w", dir, err)
		}
		fmt.Fprintf(d.progress, "removed the previous demo's run in %s\n", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, demoMarker), []byte("written by tpsprof demo: the next demo replaces this folder\n"), 0o600)
}

// startServices starts the embedded NATS server, the collector (and with
// Split its rank writers) and the live page.
func (d *run) startServices() error {
	cfg := d.cfg
	// The demo's server, like the collector's, requires a token: a random
	// one, known only to this process.
	tok := make([]byte, 16)
	crand.Read(tok)
	d.nopts = natsconn.Options{Token: hex.EncodeToString(tok)}
	srv, err := natsconn.StartEmbeddedAuth("127.0.0.1", -1, "", natsconn.Auth{Token: d.nopts.Token})
	if err != nil {
		return err
	}
	d.nopts.URL = srv.URL()
	d.onClose(srv.Shutdown)
	fmt.Fprintf(d.progress, "embedded NATS at %s\n", srv.URL())
	ccfg := collector.Config{OutDir: cfg.Out, NATS: d.nopts, Grace: 5 * time.Second,
		Live: cfg.Live, LiveInterval: 2 * time.Second, Logger: cfg.Logger}
	if cfg.Split {
		ccfg.Role = collector.RoleAggregator
		for i := range 2 {
			w, err := collector.New(collector.Config{OutDir: cfg.Out, NATS: d.nopts, Role: collector.RoleRankWriter,
				Logger: cfg.Logger, Writer: trace.WriterOptions{WriterID: fmt.Sprintf("rank-writer-%d", i)}})
			if err != nil {
				return err
			}
			d.onClose(func() { w.Close() })
			d.writers = append(d.writers, w)
		}
		fmt.Fprintf(d.progress, "split roles: one aggregator of node partials, %d rank writers in a queue group\n", len(d.writers))
	}
	if d.col, err = collector.New(ccfg); err != nil {
		return err
	}
	d.onClose(func() { d.col.Close() })
	if cfg.HTTP != "" {
		ln, err := net.Listen("tcp", cfg.HTTP)
		if err != nil {
			return fmt.Errorf("demo: live page: %w", err)
		}
		hs, lim := collector.NewHTTPServer(d.col.Handler(), ln, 0)
		go hs.Serve(lim)
		d.onClose(func() { hs.Close() })
		fmt.Fprintf(d.progress, "live page: http://%s/ (metrics at /metrics)\n", ln.Addr())
	}
	return nil
}

// startAgents starts one agent a simulated node, each with its simulated
// GPUs and clock, and tells them the job, as `tpsprof launch` does.
func (d *run) startAgents() error {
	cfg := d.cfg
	sockDir, err := os.MkdirTemp("", "tpsprof-demo-")
	if err != nil {
		return err
	}
	d.onClose(func() { os.RemoveAll(sockDir) })
	nodes := d.world / cfg.GPUsPerNode
	d.agents = make([]*agent.Agent, nodes)
	for n := range d.agents {
		slow := func() bool { return n == cfg.StragglerNode && d.stepNow.Load() >= int64(cfg.Steps/5) }
		nodeClock := d.clock.Now
		if n == cfg.SkewNode {
			nodeClock = func() time.Time { return d.clock.Now().Add(cfg.Skew) }
		}
		a, err := agent.Start(agent.Config{Socket: filepath.Join(sockDir, fmt.Sprintf("node-%d.sock", n)),
			NATS: d.nopts, Node: fmt.Sprintf("node-%d", n), FlushInterval: 50 * time.Millisecond, Logger: cfg.Logger,
			Partials: cfg.Split,
			GPU:      newSimGPUs(n, cfg.GPUsPerNode, d.clock, slow, cfg.Seed), GPUInterval: -1, Clock: nodeClock}) // sampled once per simulated step, below
		if err != nil {
			return err
		}
		d.onClose(func() { a.Close() })
		d.agents[n] = a
	}
	fmt.Fprintf(d.progress, "%d agents on %d simulated nodes, %d ranks (%s), %s on %s\n", nodes, nodes, d.world, cfg.Topology, cfg.Model, d.gpu.Name)
	meta := tps.RunMeta{Job: cfg.Job, Topology: cfg.Topology, MicroBatches: cfg.MicroBatches, ModelPreset: cfg.Model,
		GPU: cfg.GPU, DType: "bf16", GPUHourUSD: 2.5}
	// As `tpsprof launch` does on every node: each agent learns the job (and
	// so publishes its GPU samples for it from the first step on).
	for _, a := range d.agents {
		if err := a.SubmitMeta(meta); err != nil {
			return err
		}
		a.Flush(5 * time.Second)
	}
	return d.col.Sync(5 * time.Second)
}

// startRanks makes each rank's client (to its node's agent) and recorder.
func (d *run) startRanks() error {
	cfg := d.cfg
	d.clients = make([]*client.Client, d.world)
	d.recs = make([]*tps.Recorder, d.world)
	for r := 0; r < d.world; r++ {
		node := r / cfg.GPUsPerNode
		d.clients[r] = client.New(d.agents[node].Socket(), client.Options{Queue: 8192})
		lr := int32(r % cfg.GPUsPerNode)
		var err error
		d.recs[r], err = tps.NewRecorder(tps.RecorderConfig{Job: cfg.Job, Rank: int64(r), WorldSize: int64(d.world),
			Topology: cfg.Topology, LocalRank: &lr}, d.clients[r])
		if err != nil {
			return err
		}
	}
	return nil
}

// simulate runs the steps. Compute per rank is the FLOPs of its share at
// 50% kernel efficiency; the bubble follows the 1F1B formula.
func (d *run) simulate(ctx context.Context) error {
	cfg := d.cfg
	sim := newSim(cfg, d.flops, d.peak, d.world)
	d.now = time.Now().Add(-time.Duration(float64(cfg.Steps)*sim.nominalStep*1.6*1e9) - time.Minute)
	d.clock.Set(d.now)
	tick := time.NewTicker(max(cfg.StepInterval, time.Millisecond))
	defer tick.Stop()
	for s := 0; s < cfg.Steps; s++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := d.step(s, sim); err != nil {
			return err
		}
		if cfg.StepInterval > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// step sends step s of every rank, and its checkpoint and evaluation.
func (d *run) step(s int, sim *sim) error {
	cfg := d.cfg
	step := sim.step(s)
	d.stepNow.Store(int64(s))
	for _, a := range d.agents { // each node's sampler reads its GPUs at the step's start
		a.SampleGPUs()
	}
	for r := 0; r < d.world; r++ {
		p := step.ranks[r]
		start := d.now.Add(p.offset)
		if r/cfg.GPUsPerNode == cfg.SkewNode {
			start = start.Add(cfg.Skew)
		}
		if err := d.recs[r].Record(int64(s), start, start.Add(p.duration), sim.replicaTokens, p.phases); err != nil {
			return fmt.Errorf("demo: rank %d step %d: %w", r, s, err)
		}
		d.sent++
	}
	if step.ckpt > 0 {
		d.clients[0].SendEvent(tps.Event{Job: cfg.Job, Kind: tps.EventCheckpointSave, Step: int64(s), Rank: 0,
			StartUnixNs: d.now.Add(step.wall - step.ckpt).UnixNano(), EndUnixNs: d.now.Add(step.wall).UnixNano()})
	}
	d.now = d.now.Add(step.wall + step.gapAfter)
	d.clock.Set(d.now)
	if step.gapAfter > time.Second {
		// the last rank reports the evaluation, on its node's clock
		last := d.world - 1
		at := d.now
		if last/cfg.GPUsPerNode == cfg.SkewNode {
			at = at.Add(cfg.Skew)
		}
		d.clients[last].SendEvent(tps.Event{Job: cfg.Job, Kind: tps.EventEval, Step: int64(s), Rank: int64(last),
			StartUnixNs: at.Add(-step.gapAfter).UnixNano(), EndUnixNs: at.UnixNano()})
	}
	return nil
}

// drain closes the clients, waits for the agents to read everything they
// wrote, flushes the agents and syncs and closes the collectors.
func (d *run) drain() (Result, error) {
	var dropped int64
	for _, c := range d.clients {
		c.Close(10 * time.Second)
		_, n, _ := c.Counts()
		dropped += n
	}
	// Wait until the agents have read everything the clients wrote.
	for deadline := time.Now().Add(30 * time.Second); d.agentRecords() < d.sent-dropped && !time.Now().After(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	d.clock.Set(d.now.Add(time.Millisecond)) // a last reading after the last step
	for _, a := range d.agents {
		a.SampleGPUs()
	}
	for _, a := range d.agents {
		if err := a.Flush(10 * time.Second); err != nil {
			return Result{}, err
		}
	}
	for _, w := range d.writers {
		if err := w.Sync(30 * time.Second); err != nil {
			return Result{}, err
		}
		if err := w.Close(); err != nil {
			return Result{}, err
		}
	}
	if err := d.col.Sync(30 * time.Second); err != nil {
		return Result{}, err
	}
	if err := d.col.Close(); err != nil {
		return Result{}, err
	}
	res := Result{JobDir: filepath.Join(d.cfg.Out, d.cfg.Job), Stats: d.col.Stats(), Records: d.sent, Dropped: dropped, Duration: time.Since(d.began)}
	for _, w := range d.writers {
		res.RowsWritten += w.Stats().Records
	}
	if !d.cfg.Split {
		res.RowsWritten = res.Stats.Records + res.Stats.Late
	}
	return res, nil
}

func (d *run) agentRecords() int64 {
	var n int64
	for _, a := range d.agents {
		n += a.Stats().Records
	}
	return n
}

type rankStep struct {
	offset, duration time.Duration
	phases           tps.Phases
}

type simStep struct {
	ranks    []rankStep
	wall     time.Duration
	ckpt     time.Duration
	gapAfter time.Duration
}

type sim struct {
	cfg           Config
	rng           *rand.Rand
	world         int
	replicaTokens int64
	compute       float64 // seconds per rank per step at nominal speed
	bubble        float64 // seconds
	nominalStep   float64
}

func newSim(cfg Config, flopsPerToken, peak float64, world int) *sim {
	m, _ := mfu.Preset(cfg.Model)
	replica := int64(cfg.MicroBatches) * int64(m.Seq)
	stepFLOPs := float64(replica) * float64(max(cfg.Topology.DP, 1)) * flopsPerToken
	compute := stepFLOPs / (float64(world) * peak * 0.5)
	bubble := compute * tps.TheoreticalBubble(max(cfg.Topology.PP, 1), cfg.MicroBatches, 1) / (1 - tps.TheoreticalBubble(max(cfg.Topology.PP, 1), cfg.MicroBatches, 1))
	return &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), world: world, replicaTokens: replica,
		compute: compute, bubble: bubble, nominalStep: compute*1.1 + bubble}
}

func (s *sim) step(i int) simStep {
	cfg := s.cfg
	warm := 1.0
	switch i {
	case 0:
		warm = 3.0
	case 1:
		warm = 1.8
	case 2:
		warm = 1.3
	}
	commHeavy := i >= cfg.Steps*6/10 && i < cfg.Steps*3/4
	exposedBase := 0.05 * s.compute
	if commHeavy {
		exposedBase += 0.35 * s.compute // a congested fabric: collectives stop overlapping
	}
	commTotal := 0.4*s.compute + exposedBase
	computes := make([]float64, s.world)
	maxC := 0.0
	for r := range computes {
		c := s.compute * warm * math.Exp(s.rng.NormFloat64()*0.02)
		if cfg.StragglerNode >= 0 && r/cfg.GPUsPerNode == cfg.StragglerNode && i >= cfg.Steps/5 {
			c *= cfg.StragglerSlowdown
		}
		computes[r] = c
		maxC = max(maxC, c)
	}
	dataWait := make([]float64, max(cfg.Topology.DP, 1))
	for d := range dataWait {
		dataWait[d] = 0.004 + 0.002*s.rng.Float64()
		if (i+d*11)%37 == 0 && i > 0 {
			dataWait[d] = 0.25 // a slow shard
		}
	}
	maxData := 0.0
	for _, d := range dataWait {
		maxData = max(maxData, d)
	}
	var ckpt float64
	if i == cfg.Steps/2 {
		ckpt = 2.0
	}
	wall := maxC + exposedBase + s.bubble + maxData + ckpt
	st := simStep{ranks: make([]rankStep, s.world), ckpt: sec(ckpt)}
	for r := range computes {
		c := cfg.Topology.Coords(r)
		dw := dataWait[c.DP]
		// Waiting for the slowest rank shows up in the collective that follows.
		exposed := exposedBase + (maxC - computes[r]) + (maxData - dw)
		offset := sec(s.rng.Float64() * 0.0005)
		st.ranks[r] = rankStep{offset: offset, duration: sec(wall) - offset, phases: tps.Phases{
			DataWait: sec(dw), Fwd: sec(computes[r] / 3), Bwd: sec(computes[r] * 2 / 3 * 0.9), Optim: sec(computes[r] * 2 / 3 * 0.1),
			Comm: sec(commTotal + (maxC - computes[r])), ExposedComm: sec(exposed), PPWait: sec(s.bubble), Ckpt: sec(ckpt)}}
	}
	st.wall = sec(wall)
	st.gapAfter = 3 * time.Millisecond
	if i > 0 && i%50 == 0 {
		st.gapAfter = 4 * time.Second // evaluation between steps
	}
	return st
}

func sec(s float64) time.Duration { return time.Duration(s * 1e9) }
