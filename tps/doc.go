// Package tps holds the pure computation of tpsprof: the per-rank step record,
// the parallel topology of a job, token accounting, cluster step aggregation,
// window statistics and the in-process Recorder.
//
// Nothing here does I/O, so any program (a launch wrapper, a training loop, the
// collector, an analysis notebook written in Go) can import it cheaply.
//
// The rule users get wrong most: all ranks of one data-parallel replica (its
// tensor-, pipeline- and context-parallel peers) consume the same tokens. The
// cluster's tokens for a step are the sum over replicas of each replica's
// tokens, counted once per replica. Summing every rank inflates throughput by
// TP×PP×CP. [Aggregate] applies the rule and flags replicas whose ranks disagree.
//
// A typical use from a Go training program:
//
//	rec, _ := tps.NewRecorder(tps.RecorderConfig{Job: "llama-8b", Rank: 0, WorldSize: 64}, sink)
//	for step := range steps {
//		rec.Start(step)
//		... train ...
//		rec.End(tokensThisStep)
//	}
package tps
