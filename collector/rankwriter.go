package collector

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// rankWriter writes a job's rank rows on a goroutine of its own, so
// encoding Parquet overlaps with decoding and aggregating the next batches
// (a second core's worth of work; see BENCHMARKS.md). Commands run in
// order: a rotation waits for every write queued before it. The queue is
// bounded: a writer that falls behind slows the handler, memory stays flat.
type rankWriter struct {
	w  *trace.PartWriter[tps.StepRecord]
	ch chan rankCmd
	wg sync.WaitGroup

	errors, lost atomic.Int64
	failed       atomic.Bool // a write failed since the last rotation (durable mode)
	onError      func(error)
}

type rankCmd struct {
	rows   []tps.StepRecord
	rotate bool
	due    time.Time // rotate only if the part is older than PartAge at this time
	reply  chan error
}

func newRankWriter(w *trace.PartWriter[tps.StepRecord], onError func(error)) *rankWriter {
	r := &rankWriter{w: w, ch: make(chan rankCmd, 8), onError: onError}
	r.wg.Add(1)
	go r.loop()
	return r
}

func (r *rankWriter) loop() {
	defer r.wg.Done()
	for cmd := range r.ch {
		var err error
		switch {
		case cmd.rows != nil:
			if err = r.w.Write(cmd.rows); err != nil {
				r.lost.Add(int64(len(cmd.rows)))
			}
			clear(cmd.rows) // slots past len are zero already
			rows := cmd.rows[:0]
			decodeBufs.Put(&rows)
		case cmd.rotate && (cmd.due.IsZero() || r.w.Due(cmd.due)):
			err = r.w.Rotate()
		}
		if err != nil {
			r.errors.Add(1)
			r.failed.Store(true)
			if r.onError != nil {
				r.onError(err)
			}
		}
		if cmd.reply != nil {
			cmd.reply <- err
		}
	}
}

// buffer returns an empty slice to collect rows into.
func (r *rankWriter) buffer() []tps.StepRecord { return (*decodeBufs.Get().(*[]tps.StepRecord))[:0] }

// write hands rows over; the caller must not touch them again.
func (r *rankWriter) write(rows []tps.StepRecord) { r.ch <- rankCmd{rows: rows} }

// rotateIfDue finalises the part if it is older than PartAge, without waiting.
func (r *rankWriter) rotateIfDue(now time.Time) { r.ch <- rankCmd{rotate: true, due: now} }

// rotate finalises the open part after every queued write, and reports
// whether anything failed since the last rotate.
func (r *rankWriter) rotate() error {
	reply := make(chan error, 1)
	r.ch <- rankCmd{rotate: true, reply: reply}
	err := <-reply
	if err == nil && r.failed.Swap(false) {
		err = errWriteFailed
	}
	return err
}

// close finalises and stops the goroutine.
func (r *rankWriter) close() error {
	err := r.rotate()
	close(r.ch)
	r.wg.Wait()
	return err
}
