package collector

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// asyncWriter writes a job's rows of one table on a goroutine of its own:
// the collector's lock is never held across disk I/O (every table goes
// through one), and encoding Parquet overlaps with decoding and
// aggregating the next messages (a second core's worth of work; see
// BENCHMARKS.md). Commands run in order: a rotation waits for every write
// queued before it. The queue is bounded: a writer that falls behind slows
// the handler, memory stays flat.
type asyncWriter[T any] struct {
	w       *trace.PartWriter[T]
	ch      chan writeCmd[T]
	wg      sync.WaitGroup
	release func([]T) // takes written rows back (a pool); nil drops them

	errors, lost atomic.Int64
	failed       atomic.Bool // a write failed since the last rotation (durable mode)
	onError      func(error)
}

type writeCmd[T any] struct {
	rows   []T
	rotate bool
	due    time.Time // rotate only if the part is older than PartAge at this time
	reply  chan error
}

func newAsyncWriter[T any](w *trace.PartWriter[T], release func([]T), onError func(error)) *asyncWriter[T] {
	r := &asyncWriter[T]{w: w, ch: make(chan writeCmd[T], 8), release: release, onError: onError}
	r.wg.Add(1)
	go r.loop()
	return r
}

// releaseRecords returns written rank rows to the decode pool.
func releaseRecords(rows []tps.StepRecord) {
	clear(rows) // slots past len are zero already
	rows = rows[:0]
	decodeBufs.Put(&rows)
}

func (r *asyncWriter[T]) loop() {
	defer r.wg.Done()
	for cmd := range r.ch {
		var err error
		switch {
		case cmd.rows != nil:
			err = r.w.Write(cmd.rows)
			if r.release != nil {
				r.release(cmd.rows)
			}
		case cmd.rotate && (cmd.due.IsZero() || r.w.Due(cmd.due)):
			err = r.w.Rotate()
		}
		if err != nil {
			// every row of a part that failed, counted by the part writer
			r.lost.Store(r.w.Lost())
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

// recordBuffer returns an empty slice to collect rank rows into.
func recordBuffer() []tps.StepRecord { return (*decodeBufs.Get().(*[]tps.StepRecord))[:0] }

// write hands rows over; the caller must not touch them again.
func (r *asyncWriter[T]) write(rows []T) { r.ch <- writeCmd[T]{rows: rows} }

// rotateIfDue finalises the part if it is older than PartAge, without waiting.
func (r *asyncWriter[T]) rotateIfDue(now time.Time) { r.ch <- writeCmd[T]{rotate: true, due: now} }

// rotateNow finalises the open part after every queued write, without
// waiting.
func (r *asyncWriter[T]) rotateNow() { r.ch <- writeCmd[T]{rotate: true} }

// rotateAsync queues a rotation and returns where its result will come;
// the caller may wait for it after releasing its locks (see settle).
func (r *asyncWriter[T]) rotateAsync() chan error {
	reply := make(chan error, 1)
	r.ch <- writeCmd[T]{rotate: true, reply: reply}
	return reply
}

// settle waits for a rotation queued by rotateAsync and reports whether
// anything failed since the last one.
func (r *asyncWriter[T]) settle(reply chan error) error {
	err := <-reply
	if err == nil && r.failed.Swap(false) {
		err = errWriteFailed
	}
	return err
}

// rotate finalises the open part after every queued write, and reports
// whether anything failed since the last rotate.
func (r *asyncWriter[T]) rotate() error { return r.settle(r.rotateAsync()) }

// close finalises and stops the goroutine.
func (r *asyncWriter[T]) close() error {
	err := r.rotate()
	close(r.ch)
	r.wg.Wait()
	return err
}
