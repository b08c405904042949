// Package tracetest writes synthetic traces for benchmarks and tests: a
// run's rank_steps and cluster_steps as the collector would, at any size.
package tracetest

import (
	"fmt"
	"path/filepath"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// T0 is when a written run starts (unix ns).
const T0 = int64(1_760_000_000_000_000_000)

// WriteRun writes job's rank_steps (world ranks × steps, one node, rank r
// r ns faster than rank 0, 4,096 tokens, 100 ms exposed communication, a
// step a second) and its cluster_steps under root, and returns the job's
// folder.
func WriteRun(root, job string, world, steps int) (string, error) {
	opt := trace.WriterOptions{WriterID: "tracetest"}
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, job, trace.RankSteps, opt)
	if err != nil {
		return "", err
	}
	cluster, err := trace.NewPartWriter[tps.ClusterStep](root, job, trace.ClusterSteps, opt)
	if err != nil {
		return "", err
	}
	recs := make([]tps.StepRecord, world)
	for s := 0; s < steps; s++ {
		now := T0 + int64(s)*1e9
		for r := range recs {
			recs[r] = tps.StepRecord{Job: job, Step: int64(s), Rank: int64(r), WorldSize: int64(world), Node: "n",
				StartUnixNs: now, EndUnixNs: now + 9e8, DurationNs: 9e8 - int64(r), Tokens: 4096, ExposedCommNs: 1e8}
		}
		c, err := tps.Aggregate(recs, tps.AccumulatorConfig{})
		if err != nil {
			return "", fmt.Errorf("tracetest: step %d: %w", s, err)
		}
		if err := ranks.Write(recs); err != nil {
			return "", err
		}
		if err := cluster.Write([]tps.ClusterStep{c}); err != nil {
			return "", err
		}
	}
	if err := ranks.Close(); err != nil {
		return "", err
	}
	if err := cluster.Close(); err != nil {
		return "", err
	}
	return filepath.Join(root, job), nil
}
