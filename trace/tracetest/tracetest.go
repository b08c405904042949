// Package tracetest writes synthetic traces for benchmarks and tests: a
// run's rank_steps and cluster_steps as the collector would, at any size.
// It is for tests and benchmarks only; the product never imports it.
package tracetest

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// T0 is when a written run starts (unix ns).
const T0 = int64(1_760_000_000_000_000_000)

// Run describes a synthetic run.
type Run struct {
	World, Steps int
	// Jitter varies each rank's start, duration, forward, backward,
	// optimizer, communication, exposed communication and data stall by
	// up to ±1% of the step, from a fixed seed, so columns compress as
	// measured ones do rather than to nothing: 59 B a rank row, where the
	// demo's rank_steps hold 60.
	Jitter bool
	// ClusterRowsPerGroup bounds cluster_steps' row groups (0: the
	// writer's default); a collector's parts, rotated every minute, hold
	// about a minute of steps each.
	ClusterRowsPerGroup int64
	// ClusterRowsPerPart bounds cluster_steps' parts (0: the writer's
	// default); a collector rotates its parts every minute, so a long run
	// at a step a second has a part for every 60 steps.
	ClusterRowsPerPart int64
	// RankRowsPerGroup bounds rank_steps' row groups (0: the writer's
	// default).
	RankRowsPerGroup int64
	// RankRowsPerPart bounds rank_steps' parts (0: the writer's default).
	RankRowsPerPart int64
	// Windows writes rank_windows too, as the collector does.
	Windows bool
	// Watts, when above 0, gives the cluster rows the collector's live
	// energy join: every rank's GPU drawing that much over its step time.
	Watts float64
	// GPUEvery, when above 0 (with Watts), writes gpu_samples: a reading
	// of every rank's GPU (its energy counter and power) every GPUEvery
	// steps, 256 readings of each GPU a row group and 16 row groups a part
	// (a collector's parts, rotated every minute, hold a minute each).
	GPUEvery int
	// Attempts, when above 1, restarts the run: each attempt runs Steps
	// steps, the next one starting a minute after the previous one's last
	// step and resuming a tenth of Steps before it (those steps redone).
	Attempts int
}

// WriteRun writes job's rank_steps (world ranks × steps, one node, rank r
// r ns faster than rank 0, 4,096 tokens, 100 ms exposed communication, a
// step a second) and its cluster_steps under root, and returns the job's
// folder.
func WriteRun(root, job string, world, steps int) (string, error) {
	return Write(root, job, Run{World: world, Steps: steps})
}

// Write writes the run r describes (WriteRun's, varied as r says).
func Write(root, job string, r Run) (string, error) {
	opt := trace.WriterOptions{WriterID: "tracetest"}
	ropt := opt
	ropt.RowsPerGroup = r.RankRowsPerGroup
	ropt.RowsPerPart = r.RankRowsPerPart
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, job, trace.RankSteps, ropt)
	if err != nil {
		return "", err
	}
	copt := opt
	copt.RowsPerGroup = r.ClusterRowsPerGroup
	copt.RowsPerPart = r.ClusterRowsPerPart
	cluster, err := trace.NewPartWriter[tps.ClusterStep](root, job, trace.ClusterSteps, copt)
	if err != nil {
		return "", err
	}
	var gpus *trace.PartWriter[tps.GPUSample]
	if r.GPUEvery > 0 && r.Watts > 0 {
		gopt := opt
		gopt.RowsPerGroup = int64(r.World) * 256
		gopt.RowsPerPart = 16 * gopt.RowsPerGroup
		if gpus, err = trace.NewPartWriter[tps.GPUSample](root, job, trace.GPUSamples, gopt); err != nil {
			return "", err
		}
	}
	samples := make([]tps.GPUSample, r.World)
	var windows *trace.PartWriter[tps.RankWindow]
	if r.Windows {
		if windows, err = trace.NewPartWriter[tps.RankWindow](root, job, trace.RankWindows, opt); err != nil {
			return "", err
		}
	}
	wins := make([]tps.RankWindow, r.World)
	flushWindows := func() error {
		for k := range wins {
			wins[k].Seal()
		}
		err := windows.Write(wins)
		clear(wins)
		return err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	jit := func() int64 {
		if !r.Jitter {
			return 0
		}
		return rng.Int64N(2e7+1) - 1e7 // ±1% of the second
	}
	recs := make([]tps.StepRecord, r.World)
	back := r.Steps / 10
	for g := 0; g < r.Steps*max(r.Attempts, 1); g++ {
		attempt, s := g/r.Steps, g%r.Steps+(g/r.Steps)*(r.Steps-back)
		now := T0 + int64(g)*1e9 + int64(attempt)*60e9
		for k := range recs {
			exposed, data := 1e8+jit()/2, max(jit()/4, 0)
			recs[k] = tps.StepRecord{Job: job, Attempt: int64(attempt), Step: int64(s), Rank: int64(k), WorldSize: int64(r.World), Node: "n",
				StartUnixNs: now, EndUnixNs: now + 9e8, DurationNs: 9e8 - int64(k) + jit(), Tokens: 4096, ExposedCommNs: exposed, DataWaitNs: data}
			if r.Jitter {
				c := &recs[k]
				c.StartUnixNs += jit() / 10
				c.FwdNs, c.BwdNs, c.OptimNs, c.CommNs = 2.5e8+jit(), 5e8+jit(), 5e7+jit()/4, 2e8+jit()
			}
		}
		c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
		if err != nil {
			return "", fmt.Errorf("tracetest: step %d: %w", s, err)
		}
		if err := ranks.Write(recs); err != nil {
			return "", err
		}
		if windows != nil {
			if g > 0 && (tps.WindowOf(int64(s)) != wins[0].Window || int64(attempt) != wins[0].Attempt) {
				if err := flushWindows(); err != nil {
					return "", err
				}
			}
			for k := range recs {
				wins[k].Add(&recs[k])
			}
		}
		if gpus != nil && g%r.GPUEvery == 0 {
			at := now + 5e8
			for k := range samples {
				mj, w := int64(r.Watts*float64(at-T0)/1e6), r.Watts
				samples[k] = tps.GPUSample{Job: job, Node: "n", UUID: fmt.Sprintf("GPU-%d", k), Index: int32(k), UnixNs: at, EnergyMJ: &mj, PowerW: &w}
			}
			if err := gpus.Write(samples); err != nil {
				return "", err
			}
		}
		if r.Watts > 0 {
			c.GPUsJoined, c.PowerWMean = int64(r.World), r.Watts
			c.EnergyJ = r.Watts * float64(r.World) * float64(c.StepTimeNs) / 1e9
		}
		if err := cluster.Write([]tps.ClusterStep{c}); err != nil {
			return "", err
		}
	}
	if err := ranks.Close(); err != nil {
		return "", err
	}
	if windows != nil && r.Steps > 0 {
		if err := flushWindows(); err != nil {
			return "", err
		}
		if err := windows.Close(); err != nil {
			return "", err
		}
	}
	if err := cluster.Close(); err != nil {
		return "", err
	}
	if gpus != nil {
		if err := gpus.Close(); err != nil {
			return "", err
		}
	}
	return filepath.Join(root, job), nil
}
