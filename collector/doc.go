// Package collector receives what agents publish on NATS, aggregates every
// step across all ranks of a job (tokens once per data-parallel replica, step
// time of the slowest rank), prints a live line, and writes the Parquet
// traces: rank_steps, cluster_steps, gpu_samples and events.
//
// A step closes when all world_size ranks have reported, or when Grace has
// passed since its first record; its cluster row then says how many ranks
// were missing. A record that repeats (job, attempt, step, rank) counts once.
// A record that arrives after its step closed is still written to
// rank_steps and counted as late.
//
// It owns the live aggregation and the tables' writing: a job's state is
// jobState (state.go) with its concerns as types of their own (finalising,
// gpuJoin, stragglerTrack, rolloutWindow). It never does disk or network
// I/O under a job's lock; the figures are package tps's, the same the
// report computes.
//
// See the example of New.
package collector
