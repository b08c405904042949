// Package demo runs a whole simulated job through the real product: the
// embedded nats-server, a collector, one real agent per node with its unix
// socket, and ranks that time their steps with tps.Recorder and send them
// through client.Client, i.e. through the socket intake. The simulation has
// jitter, warm-up steps, one straggler node, a communication-heavy phase, a
// checkpoint and evaluation gaps, so every part of the output has something
// to show.
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
	began := time.Now()
	world := cfg.Topology.WorldSize()
	if err := cfg.Topology.Validate(world); err != nil {
		return Result{}, err
	}
	if cfg.Steps <= 0 || cfg.GPUsPerNode <= 0 || cfg.MicroBatches <= 0 {
		return Result{}, fmt.Errorf("demo: steps, GPUs per node and micro-batches must be positive")
	}
	if world%cfg.GPUsPerNode != 0 {
		return Result{}, fmt.Errorf("demo: world size %d is not a multiple of %d GPUs per node", world, cfg.GPUsPerNode)
	}
	if !tps.ValidJobID(cfg.Job) {
		return Result{}, fmt.Errorf("demo: invalid job id %q", cfg.Job)
	}
	model, err := mfu.Preset(cfg.Model)
	if err != nil {
		return Result{}, err
	}
	counts, err := model.Count(mfu.AttentionFull, mfu.RecomputeNone)
	if err != nil {
		return Result{}, err
	}
	gpu, err := mfu.LookupGPU(cfg.GPU)
	if err != nil {
		return Result{}, err
	}
	peak, _ := gpu.Peak(mfu.BF16)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}

	// The demo's server, like the collector's, requires a token: a random
	// one, known only to this process.
	tok := make([]byte, 16)
	crand.Read(tok)
	nopts := natsconn.Options{Token: hex.EncodeToString(tok)}
	srv, err := natsconn.StartEmbeddedAuth("127.0.0.1", -1, "", natsconn.Auth{Token: nopts.Token})
	if err != nil {
		return Result{}, err
	}
	nopts.URL = srv.URL()
	defer srv.Shutdown()
	fmt.Fprintf(progress, "embedded NATS at %s\n", srv.URL())
	ccfg := collector.Config{OutDir: cfg.Out, NATS: nopts, Grace: 5 * time.Second,
		Live: cfg.Live, LiveInterval: 2 * time.Second, Logger: cfg.Logger}
	var writers []*collector.Collector
	if cfg.Split {
		ccfg.Role = collector.RoleAggregator
		for i := range 2 {
			w, err := collector.New(collector.Config{OutDir: cfg.Out, NATS: nopts, Role: collector.RoleRankWriter,
				Logger: cfg.Logger, Writer: trace.WriterOptions{WriterID: fmt.Sprintf("rank-writer-%d", i)}})
			if err != nil {
				return Result{}, err
			}
			defer w.Close()
			writers = append(writers, w)
		}
		fmt.Fprintf(progress, "split roles: one aggregator of node partials, %d rank writers in a queue group\n", len(writers))
	}
	col, err := collector.New(ccfg)
	if err != nil {
		return Result{}, err
	}
	defer col.Close()
	if cfg.HTTP != "" {
		ln, err := net.Listen("tcp", cfg.HTTP)
		if err != nil {
			return Result{}, fmt.Errorf("demo: live page: %w", err)
		}
		hs, lim := collector.NewHTTPServer(col.Handler(), ln, 0)
		go hs.Serve(lim)
		defer hs.Close()
		fmt.Fprintf(progress, "live page: http://%s/ (metrics at /metrics)\n", ln.Addr())
	}

	sockDir, err := os.MkdirTemp("", "tpsprof-demo-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(sockDir)
	nodes := world / cfg.GPUsPerNode
	agents := make([]*agent.Agent, nodes)
	clock := &simClock{}
	var stepNow atomic.Int64 // the step being simulated, for the GPUs' straggler state
	for n := range agents {
		slow := func() bool { return n == cfg.StragglerNode && stepNow.Load() >= int64(cfg.Steps/5) }
		nodeClock := clock.Now
		if n == cfg.SkewNode {
			nodeClock = func() time.Time { return clock.Now().Add(cfg.Skew) }
		}
		a, err := agent.Start(agent.Config{Socket: filepath.Join(sockDir, fmt.Sprintf("node-%d.sock", n)),
			NATS: nopts, Node: fmt.Sprintf("node-%d", n), FlushInterval: 50 * time.Millisecond, Logger: cfg.Logger,
			Partials: cfg.Split,
			GPU:      newSimGPUs(n, cfg.GPUsPerNode, clock, slow, cfg.Seed), GPUInterval: -1, Clock: nodeClock}) // sampled once per simulated step, below
		if err != nil {
			return Result{}, err
		}
		defer a.Close()
		agents[n] = a
	}
	fmt.Fprintf(progress, "%d agents on %d simulated nodes, %d ranks (%s), %s on %s\n", nodes, nodes, world, cfg.Topology, cfg.Model, gpu.Name)
	meta := tps.RunMeta{Job: cfg.Job, Topology: cfg.Topology, MicroBatches: cfg.MicroBatches, ModelPreset: cfg.Model,
		GPU: cfg.GPU, DType: "bf16", GPUHourUSD: 2.5}
	// As `tpsprof launch` does on every node: each agent learns the job (and
	// so publishes its GPU samples for it from the first step on).
	for _, a := range agents {
		if err := a.SubmitMeta(meta); err != nil {
			return Result{}, err
		}
		a.Flush(5 * time.Second)
	}
	if err := col.Sync(5 * time.Second); err != nil {
		return Result{}, err
	}

	clients := make([]*client.Client, world)
	recs := make([]*tps.Recorder, world)
	for r := 0; r < world; r++ {
		node := r / cfg.GPUsPerNode
		clients[r] = client.New(agents[node].Socket(), client.Options{Queue: 8192})
		lr := int32(r % cfg.GPUsPerNode)
		recs[r], err = tps.NewRecorder(tps.RecorderConfig{Job: cfg.Job, Rank: int64(r), WorldSize: int64(world),
			Topology: cfg.Topology, LocalRank: &lr}, clients[r])
		if err != nil {
			return Result{}, err
		}
	}

	// The step model. Compute per rank is the FLOPs of its share at 50%
	// kernel efficiency; the bubble follows the 1F1B formula.
	sim := newSim(cfg, counts.FLOPsPerToken, peak, world)
	simStart := time.Now().Add(-time.Duration(float64(cfg.Steps)*sim.nominalStep*1.6*1e9) - time.Minute)
	now := simStart
	clock.Set(now)
	tick := time.NewTicker(max(cfg.StepInterval, time.Millisecond))
	defer tick.Stop()
	sent := int64(0)
	for s := 0; s < cfg.Steps; s++ {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		step := sim.step(s)
		stepNow.Store(int64(s))
		for _, a := range agents { // each node's sampler reads its GPUs at the step's start
			a.SampleGPUs()
		}
		for r := 0; r < world; r++ {
			p := step.ranks[r]
			start := now.Add(p.offset)
			if r/cfg.GPUsPerNode == cfg.SkewNode {
				start = start.Add(cfg.Skew)
			}
			if err := recs[r].Record(int64(s), start, start.Add(p.duration), sim.replicaTokens, p.phases); err != nil {
				return Result{}, fmt.Errorf("demo: rank %d step %d: %w", r, s, err)
			}
			sent++
		}
		if step.ckpt > 0 {
			clients[0].SendEvent(tps.Event{Job: cfg.Job, Kind: tps.EventCheckpointSave, Step: int64(s), Rank: 0,
				StartUnixNs: now.Add(step.wall - step.ckpt).UnixNano(), EndUnixNs: now.Add(step.wall).UnixNano()})
		}
		now = now.Add(step.wall + step.gapAfter)
		clock.Set(now)
		if step.gapAfter > time.Second {
			// the last rank reports the evaluation, on its node's clock
			last := world - 1
			at := now
			if last/cfg.GPUsPerNode == cfg.SkewNode {
				at = at.Add(cfg.Skew)
			}
			clients[last].SendEvent(tps.Event{Job: cfg.Job, Kind: tps.EventEval, Step: int64(s), Rank: int64(last),
				StartUnixNs: at.Add(-step.gapAfter).UnixNano(), EndUnixNs: at.UnixNano()})
		}
		if cfg.StepInterval > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return Result{}, ctx.Err()
			}
		}
	}
	var dropped int64
	for _, c := range clients {
		c.Close(10 * time.Second)
		_, d, _ := c.Counts()
		dropped += d
	}
	// Wait until the agents have read everything the clients wrote.
	var lines int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines = 0
		for _, a := range agents {
			lines += a.Stats().Records
		}
		if lines >= sent-dropped || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	clock.Set(now.Add(time.Millisecond)) // a last reading after the last step
	for _, a := range agents {
		a.SampleGPUs()
	}
	for _, a := range agents {
		if err := a.Flush(10 * time.Second); err != nil {
			return Result{}, err
		}
	}
	for _, w := range writers {
		if err := w.Sync(30 * time.Second); err != nil {
			return Result{}, err
		}
		if err := w.Close(); err != nil {
			return Result{}, err
		}
	}
	if err := col.Sync(30 * time.Second); err != nil {
		return Result{}, err
	}
	if err := col.Close(); err != nil {
		return Result{}, err
	}
	res := Result{JobDir: filepath.Join(cfg.Out, cfg.Job), Stats: col.Stats(), Records: sent, Dropped: dropped, Duration: time.Since(began)}
	for _, w := range writers {
		res.RowsWritten += w.Stats().Records
	}
	if !cfg.Split {
		res.RowsWritten = res.Stats.Records + res.Stats.Late
	}
	return res, nil
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
