package collector

import (
	"fmt"
	"sync/atomic"

	"github.com/tpsprof/tpsprof/tps"
)

// sink is the I/O side of a job: its four tables, each written by a
// goroutine of its own (asyncWriter), and the metadata snapshot the parts
// store. The state side (job.go: open steps, dedupe windows, live figures)
// hands rows and rotation commands to it and never waits for the disk
// while it holds the collector's lock; closing the sink waits, so it runs
// outside the lock (docs/collector.md).
type sink struct {
	job      string
	metaSnap atomic.Pointer[map[string]string] // what parts store; see refreshMeta
	// nil when the job's folders could not be created (counted then)
	ranks   *asyncWriter[tps.StepRecord]
	cluster *asyncWriter[tps.ClusterStep]
	events  *asyncWriter[tps.Event]
	gpus    *asyncWriter[tps.GPUSample]
}

// closeWriters finalises the job's parts and stops its writer goroutines;
// it waits for the disk, so no lock may be held. Failures are counted by
// the writers themselves (writerErrors); it returns the first.
func (j *sink) closeWriters() error {
	if j.ranks == nil {
		return fmt.Errorf("collector: job %s: trace folders could not be created", j.job)
	}
	var first error
	for _, fn := range []func() error{j.ranks.close, j.cluster.close, j.events.close, j.gpus.close} {
		if err := fn(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// writerErrors and writerLost sum the job's writers' counters.
// waitWriters waits until no table's writer has more than maxBacklog
// commands queued: a message handler's back-pressure, after it released
// the job's lock (never under it: the loop and /api/summary take it).
func (j *sink) waitWriters() {
	if j.ranks == nil {
		return
	}
	j.ranks.waitBelow(maxBacklog)
	j.cluster.waitBelow(maxBacklog)
	j.events.waitBelow(maxBacklog)
	j.gpus.waitBelow(maxBacklog)
}

func (j *sink) writerErrors() int64 {
	if j.ranks == nil {
		return 0
	}
	return j.ranks.errors.Load() + j.cluster.errors.Load() + j.events.errors.Load() + j.gpus.errors.Load()
}

func (j *sink) writerLost() int64 {
	if j.ranks == nil {
		return 0
	}
	return j.ranks.lost.Load() + j.cluster.lost.Load() + j.events.lost.Load() + j.gpus.lost.Load()
}
