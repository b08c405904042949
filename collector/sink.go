package collector

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// sink is the I/O side of a job: its five tables, each written by a
// goroutine of its own (asyncWriter), and the metadata snapshot the parts
// store. The state side (state.go: open steps, dedupe windows, live
// figures) hands rows and rotation commands to it and never waits for the
// disk while it holds a lock; closing the sink waits, so it runs outside
// every lock (docs/collector.md).
type sink struct {
	job      string
	metaSnap atomic.Pointer[map[string]string] // what parts store; see refreshMeta
	// nil when the job's folders could not be created (counted then)
	ranks   *asyncWriter[tps.StepRecord]
	cluster *asyncWriter[tps.ClusterStep]
	events  *asyncWriter[tps.Event]
	gpus    *asyncWriter[tps.GPUSample]
	windows *asyncWriter[tps.RankWindow]
	// tables are the five writers above, in that order, as the sink drives
	// them whatever their row type: rows go in through the typed fields,
	// everything else through tables. Empty when the folders could not be
	// created.
	tables []tableWriter
}

// tableWriter is what a sink does with a table's writer besides handing
// it rows (asyncWriter, whatever its row type).
type tableWriter interface {
	table() string
	rotateNow()
	rotateIfDue(now time.Time)
	rotateAsync() chan error
	settle(reply chan error) error
	waitBelow(n int)
	close() error
	counts() (errs, lost int64)
}

// open starts the five writers; on an error (the job's folders cannot be
// created) the sink stays without writers.
func (s *sink) open(out string, opt trace.WriterOptions, onError func(error)) error {
	rw, err := trace.NewPartWriter[tps.StepRecord](out, s.job, trace.RankSteps, opt)
	if err != nil {
		return err
	}
	cw, err := trace.NewPartWriter[tps.ClusterStep](out, s.job, trace.ClusterSteps, opt)
	if err != nil {
		return err
	}
	ew, err := trace.NewPartWriter[tps.Event](out, s.job, trace.Events, opt)
	if err != nil {
		return err
	}
	gw, err := trace.NewPartWriter[tps.GPUSample](out, s.job, trace.GPUSamples, opt)
	if err != nil {
		return err
	}
	ww, err := trace.NewPartWriter[tps.RankWindow](out, s.job, trace.RankWindows, opt)
	if err != nil {
		return err
	}
	s.ranks = newAsyncWriter(trace.RankSteps, rw, releaseRecords, onError)
	s.cluster = newAsyncWriter(trace.ClusterSteps, cw, nil, onError)
	s.events = newAsyncWriter(trace.Events, ew, nil, onError)
	s.gpus = newAsyncWriter(trace.GPUSamples, gw, nil, onError)
	s.windows = newAsyncWriter(trace.RankWindows, ww, nil, onError)
	s.tables = []tableWriter{s.ranks, s.cluster, s.events, s.gpus, s.windows}
	return nil
}

// rotateNow finalises every table's open part after its queued writes,
// without waiting; rotateIfDue those older than PartAge.
func (s *sink) rotateNow() {
	for _, w := range s.tables {
		w.rotateNow()
	}
}

func (s *sink) rotateIfDue(now time.Time) {
	for _, w := range s.tables {
		w.rotateIfDue(now)
	}
}

// rotateAsync queues a rotation of every table; settle waits for them
// (outside every lock) and reports the first failure since the last
// rotation, naming its table.
func (s *sink) rotateAsync() []chan error {
	replies := make([]chan error, len(s.tables))
	for i, w := range s.tables {
		replies[i] = w.rotateAsync()
	}
	return replies
}

func (s *sink) settle(replies []chan error) error {
	var first error
	for i, w := range s.tables {
		if err := w.settle(replies[i]); err != nil && first == nil {
			first = fmt.Errorf("%s: %w", w.table(), err)
		}
	}
	return first
}

// closeWriters finalises the job's parts and stops its writer goroutines;
// it waits for the disk, so no lock may be held. Failures are counted by
// the writers themselves (writerErrors); it returns the first.
func (s *sink) closeWriters() error {
	if len(s.tables) == 0 {
		return fmt.Errorf("collector: job %s: trace folders could not be created", s.job)
	}
	var first error
	for _, w := range s.tables {
		if err := w.close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// waitWriters waits until no table's writer has more than maxBacklog
// commands queued: a message handler's back-pressure, after it released
// the job's lock (never under it: the loop and /api/summary take it).
func (s *sink) waitWriters() {
	for _, w := range s.tables {
		w.waitBelow(maxBacklog)
	}
}

// writerErrors and writerLost sum the job's writers' counters.
func (s *sink) writerErrors() (n int64) {
	for _, w := range s.tables {
		e, _ := w.counts()
		n += e
	}
	return n
}

func (s *sink) writerLost() (n int64) {
	for _, w := range s.tables {
		_, l := w.counts()
		n += l
	}
	return n
}
