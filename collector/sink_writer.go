package collector

import (
	"errors"
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
// queued before it. Queuing never blocks, so no one waits for a disk while
// holding a job's lock (one job's stalled writer used to stall the loop,
// and with it every other job, and /api/summary); the queue is bounded by
// the message handlers, which wait (waitBelow) after releasing the job's
// lock while its backlog is past maxBacklog: a writer that falls behind
// slows its job's messages, memory stays flat.
type asyncWriter[T any] struct {
	name    string // the table's
	w       *trace.PartWriter[T]
	wg      sync.WaitGroup
	release func([]T) // takes written rows back (a pool); nil drops them

	mu     sync.Mutex
	space  *sync.Cond // signalled as the queue shrinks
	work   *sync.Cond // signalled as commands come
	queue  []writeCmd[T]
	busy   int // commands taken by the goroutine, not done yet
	closed bool

	errors, lost atomic.Int64
	failed       atomic.Bool // a write failed since the last rotation (durable mode)
	onError      func(error)
}

// maxBacklog is how many commands a writer may have queued before its
// job's message handlers wait (outside the job's lock) for it to catch up.
const maxBacklog = 8

type writeCmd[T any] struct {
	rows   []T
	rotate bool
	due    time.Time // rotate only if the part is older than PartAge at this time
	reply  chan error
	hold   chan struct{} // (tests) the writer waits for it to close, as for a hung disk
}

func newAsyncWriter[T any](table string, w *trace.PartWriter[T], release func([]T), onError func(error)) *asyncWriter[T] {
	r := &asyncWriter[T]{name: table, w: w, release: release, onError: onError}
	r.space, r.work = sync.NewCond(&r.mu), sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.loop()
	return r
}

// push queues a command without waiting.
func (r *asyncWriter[T]) push(cmd writeCmd[T]) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		if cmd.reply != nil {
			cmd.reply <- errWriterClosed
		}
		return
	}
	r.queue = append(r.queue, cmd)
	r.work.Signal()
	r.mu.Unlock()
}

func (r *asyncWriter[T]) table() string { return r.name }

// counts are the writes that failed and the rows they lost.
func (r *asyncWriter[T]) counts() (errs, lost int64) { return r.errors.Load(), r.lost.Load() }

// waitBelow waits until at most n commands wait or run (or the writer is
// closed). Never call it holding a job's lock.
func (r *asyncWriter[T]) waitBelow(n int) {
	r.mu.Lock()
	for !r.closed && len(r.queue)+r.busy > n {
		r.space.Wait()
	}
	r.mu.Unlock()
}

// releaseRecords returns written rank rows to the decode pool.
func releaseRecords(rows []tps.StepRecord) {
	if cap(rows) < decodeBufRows {
		return // a small job's own slice (job.flushRanks): not the pool's size
	}
	clear(rows) // slots past len are zero already
	rows = rows[:0]
	decodeBufs.Put(&rows)
}

func (r *asyncWriter[T]) loop() {
	defer r.wg.Done()
	r.mu.Lock()
	for {
		for len(r.queue) == 0 && !r.closed {
			r.work.Wait()
		}
		if len(r.queue) == 0 {
			r.mu.Unlock()
			return // closed, and everything queued is done
		}
		cmds := r.queue
		r.queue = nil
		r.busy = len(cmds)
		r.mu.Unlock()
		for _, cmd := range cmds {
			r.run(cmd) // disk I/O: no lock held
			r.mu.Lock()
			r.busy--
			r.space.Broadcast()
			r.mu.Unlock()
		}
		r.mu.Lock()
	}
}

func (r *asyncWriter[T]) run(cmd writeCmd[T]) {
	if cmd.hold != nil {
		<-cmd.hold
	}
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

// recordBuffer returns an empty slice to collect rank rows into.
func recordBuffer() []tps.StepRecord { return (*decodeBufs.Get().(*[]tps.StepRecord))[:0] }

// write hands rows over; the caller must not touch them again.
func (r *asyncWriter[T]) write(rows []T) { r.push(writeCmd[T]{rows: rows}) }

// rotateIfDue finalises the part if it is older than PartAge, without waiting.
// A rotation already waiting at the queue's end stands for this one (a
// stalled writer's queue does not grow by a rotation every tick).
func (r *asyncWriter[T]) rotateIfDue(now time.Time) {
	r.mu.Lock()
	n := len(r.queue)
	pending := n > 0 && r.queue[n-1].rotate && r.queue[n-1].reply == nil
	r.mu.Unlock()
	if !pending {
		r.push(writeCmd[T]{rotate: true, due: now})
	}
}

// rotateNow finalises the open part after every queued write, without
// waiting.
func (r *asyncWriter[T]) rotateNow() { r.push(writeCmd[T]{rotate: true}) }

// rotateAsync queues a rotation and returns where its result will come;
// the caller may wait for it after releasing its locks (see settle).
func (r *asyncWriter[T]) rotateAsync() chan error {
	reply := make(chan error, 1)
	r.push(writeCmd[T]{rotate: true, reply: reply})
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
	r.mu.Lock()
	r.closed = true
	r.space.Broadcast()
	r.work.Broadcast() // the goroutine finishes what is queued, then returns
	r.mu.Unlock()
	r.wg.Wait()
	return err
}

var errWriterClosed = errors.New("collector: the table's writer is closed")
