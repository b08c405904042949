package collector

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// The ingest path: every message, from a core subscription (core.go) or
// the durable consumer (durable.go), goes through ingest, which finds its
// kind's handler in the table New built for the collector's role. A
// handler decodes and validates without a lock, then does its work on the
// job through withJob, the one place that takes a job's lock, settles what
// the work changed, releases it and applies the tally.

// Role is a collector's share of the work when it is scaled out
// (docs/scale.md).
type Role string

const (
	// RoleAll aggregates rank records into cluster rows and writes every
	// table (the default).
	RoleAll Role = "all"
	// RoleAggregator merges the node partials agents publish into cluster
	// rows, and takes events, metadata and GPU samples.
	RoleAggregator Role = "aggregator"
	// RoleRankWriter writes rank_steps, one of a pool sharing the step
	// batches.
	RoleRankWriter Role = "rank-writer"
)

// ParseRole reads a role's name; "" is RoleAll.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case "":
		return RoleAll, nil
	case RoleAll, RoleAggregator, RoleRankWriter:
		return r, nil
	}
	return "", fmt.Errorf("collector: unknown role %q (all, aggregator, rank-writer)", s)
}

// aggregates: the role closes steps into cluster rows, so it answers
// launches' attempt requests and straggler reports and runs automatic
// captures.
func (r Role) aggregates() bool { return r != RoleRankWriter }

// pooled: collectors of the role share one stream of messages (a queue
// group, a shared durable consumer), each taking different messages.
func (r Role) pooled() bool { return r == RoleRankWriter }

// partitionKey is what Config.Partitions hashes: the job, and for rank
// writers the node too (a node's batches always reach the same writer).
func (r Role) partitionKey(job, node string) []byte {
	if r == RoleRankWriter {
		return []byte(job + "." + node)
	}
	return []byte(job)
}

// message is one message as a handler sees it: its subject parsed, and
// its acknowledgement (nil in core mode, where there is none).
type message struct {
	subject, job, node string
	data               []byte
	ack                acker
}

// route is one entry of the handler table: a wire kind, the subject that
// carries it, and its handler.
type route struct {
	subject string
	handle  func(m message)
}

// routes is the role's handler table, keyed by wire kind. Kinds outside
// it are another role's (an all-role collector reading the durable stream
// sees the node partials it does not need): acknowledged and dropped.
func (c *Collector) routes() map[string]route {
	common := map[string]route{
		"gpu":    {wire.AllGPU, c.handleGPU},
		"events": {wire.AllEvents, c.handleEvent},
		"meta":   {wire.AllMeta, c.handleMeta},
	}
	switch c.cfg.Role {
	case RoleAggregator:
		common["partial"] = route{wire.AllPartials, c.handlePartials}
		return common
	case RoleRankWriter:
		return map[string]route{"steps": {wire.AllSteps, c.handleRankRows}}
	default:
		common["steps"] = route{wire.AllSteps, c.handleSteps}
		return common
	}
}

// ingest hands a message to its kind's handler. A subject that does not
// parse is counted; one of another partition (Config.Partitions) is
// counted and dropped unread; one of a kind the role does not take is
// dropped. What is dropped is acknowledged: there is nothing to keep.
func (c *Collector) ingest(subject string, data []byte, ack acker) {
	job, kind, node, err := wire.ParseSubject(subject)
	if err != nil {
		c.reject("subject:invalid", 1)
		c.ackNow(ack)
		return
	}
	r, ok := c.table[kind]
	if !ok {
		c.ackNow(ack)
		return
	}
	if !c.mine(job, node) {
		c.ackNow(ack)
		return
	}
	r.handle(message{subject: subject, job: job, node: node, data: data, ack: ack})
}

// mine reports whether a message of job (from node) is of this
// collector's partition (Config.Partitions); others are counted and
// dropped unread.
func (c *Collector) mine(job, node string) bool {
	if c.cfg.Partitions <= 1 {
		return true
	}
	h := fnv.New32a()
	h.Write(c.cfg.Role.partitionKey(job, node))
	if int(h.Sum32()%uint32(c.cfg.Partitions)) == c.cfg.Partition {
		return true
	}
	c.n.otherPartition.Add(1)
	return false
}

// withJob takes a job's lock (creating the job if new), runs work on it,
// settles what the work changed, releases the lock, then applies the
// tally (counts, log lines, OnStep, captures, back-pressure) with no lock
// held. When the job cannot be taken (job:limit) it applies the tally and
// reports false.
func (c *Collector) withJob(id string, t *tally, work func(j *job)) bool {
	j := c.lockJob(id, t)
	if j == nil {
		c.apply(t)
		return false
	}
	c.settleJob(j, t, work)
	return true
}

// onJob is withJob for a job already held (the loop, checkpoints,
// closing): work sees it even if evicted, and says what to do then.
func (c *Collector) onJob(j *job, t *tally, work func(j *job)) {
	j.mu.Lock()
	c.settleJob(j, t, work)
}

// settleJob is the tail both share; the caller holds j's lock.
func (c *Collector) settleJob(j *job, t *tally, work func(j *job)) {
	dups := t.duplicates
	work(j)
	if d := t.duplicates - dups; d > 0 && !t.replay {
		j.st.duplicates += d
		t.liveChanged = true
	}
	j.settle(t)
	j.mu.Unlock()
	c.apply(t)
}

// lockJob returns the job, created if new, with its lock held; nil when
// the collector holds MaxJobs active jobs (counted as job:limit). A new
// job's folders are created outside every lock; two handlers creating the
// same job at once keep the first and close the other's writers.
func (c *Collector) lockJob(id string, t *tally) *job {
	for {
		c.mu.Lock()
		j := c.jobs[id]
		if j == nil {
			if len(c.jobs) >= c.cfg.MaxJobs && !c.evictIdlest(t.now) {
				c.mu.Unlock()
				t.reject("job:limit", 1)
				t.warn("job-limit", "too many active jobs: messages of a new job rejected", "job", id, "max_jobs", c.cfg.MaxJobs)
				return nil
			}
			c.mu.Unlock()
			nj := newJob(c, id) // creates folders: outside the lock
			c.mu.Lock()
			if j = c.jobs[id]; j == nil {
				j, nj = nj, nil
				c.jobs[id] = j
			}
			c.mu.Unlock()
			if nj != nil {
				nj.out.closeWriters() // lost the race; nothing was written to it
			}
		} else {
			c.mu.Unlock()
		}
		j.touched.Store(t.now.UnixNano())
		j.mu.Lock()
		if !j.evicted {
			t.backpressure = j
			return j
		}
		j.mu.Unlock() // evicted meanwhile: take the job anew
		time.Sleep(time.Millisecond)
	}
}

// ackNow acknowledges a message that holds nothing to keep.
func (c *Collector) ackNow(ack acker) {
	switch a := ack.(type) {
	case nil:
	case *handlerAck:
		a.now = true // acknowledged once the handler returns
	default:
		a.Ack()
	}
}

// stepFold folds one valid record into a job's state: the step it went
// into, whether that step is open (its cluster row still to be written),
// and whether the record's rank row is to be written.
type stepFold func(s *jobState, r *tps.StepRecord, t *tally) (k stepKey, open, keep bool)

// handleSteps aggregates a step batch into cluster steps and writes its
// rank rows (the all role).
func (c *Collector) handleSteps(m message) { c.stepBatch(m, (*jobState).add) }

// handleRankRows writes a step batch's rank rows, each once (the
// rank-writer role: the aggregator closes the steps from node partials).
func (c *Collector) handleRankRows(m message) {
	c.stepBatch(m, func(s *jobState, r *tps.StepRecord, t *tally) (stepKey, bool, bool) {
		return stepKey{}, false, s.writeOnce(r, t)
	})
}

// stepBatch decodes and validates a step batch without a lock, then folds
// its records into the job and hands the rank rows kept to the writer.
// The message is registered in the job's ledger (durable mode), to be
// acknowledged once the steps it fed are in finalised Parquet parts.
func (c *Collector) stepBatch(m message, fold stepFold) {
	bufp := decodeBufs.Get().(*[]tps.StepRecord)
	defer func() {
		if *bufp != nil {
			clear(*bufp)
			decodeBufs.Put(bufp)
		}
	}()
	recs, err := wire.DecodeSteps(m.data, (*bufp)[:0])
	*bufp = recs
	if err != nil {
		c.reject("batch:decode", 1)
		c.log.Warn("decode", "undecodable step batch", "subject", m.subject, "bytes", len(m.data), "err", err)
		c.ackNow(m.ack)
		return
	}
	t := tally{now: time.Now(), replay: replayOf(m.ack)}
	// Validate before taking the job: a batch of garbage costs no lock.
	valid := 0
	for i := range recs {
		r := &recs[i]
		r.Normalize()
		if r.Job != m.job {
			t.reject("job:subject_mismatch", 1)
			t.warn("job", "record for another job on a job's subject", "subject", m.subject, "job", r.Job)
			continue
		}
		if err := r.Validate(); err != nil {
			t.invalid(err)
			continue
		}
		if err := r.CheckClock(t.now, c.cfg.RecordClockTolerance); err != nil {
			t.invalid(err)
			continue
		}
		if valid != i {
			recs[valid] = *r
		}
		valid++
	}
	recs = recs[:valid]
	if valid == 0 {
		c.apply(&t)
		c.ackNow(m.ack)
		return
	}
	maxAttempt := int64(-1)
	if !c.withJob(m.job, &t, func(j *job) {
		var touched []stepKey
		kept := 0 // records whose rank row is written, moved to the front
		for i := range recs {
			r := &recs[i]
			k, open, keep := fold(&j.st, r, &t)
			if open && (len(touched) == 0 || touched[len(touched)-1] != k) {
				touched = append(touched, k)
			}
			maxAttempt = max(maxAttempt, r.Attempt)
			if keep {
				j.st.sumWindow(r)
				if kept != i {
					recs[kept] = *r
				}
				kept++
			}
		}
		if len(t.closed) > 0 {
			j.writeRows(false, &t)
		}
		switch {
		case kept == 0:
		case j.out.ranks == nil: // the job's folders could not be created (counted then)
			if j.st.led == nil { // durable mode leaves the message in the stream instead
				c.n.rowsLost.Add(int64(kept))
			}
		case kept >= directHandOff:
			// A big batch goes to the writer as it is, without a copy; the
			// writer returns the slice to decodeBufs.
			j.flushRanks(false)
			j.out.ranks.write(recs[:kept])
			*bufp = nil
		default:
			if j.rankBuf == nil {
				// a pooled buffer for a job that flushes 64 rows or more at
				// a time, or sent a batch of that many; a job of a few rows
				// a flush takes a slice its size (a 1,024-row buffer for
				// each of 200 one-record jobs held ~0.5 MiB each until their
				// flush; growing every job's from nothing cost node-sized
				// batches a quarter of their rate)
				if n := max(j.lastFlush, kept); n >= 64 {
					j.rankBuf = recordBuffer()
				} else {
					j.rankBuf = make([]tps.StepRecord, 0, n)
				}
			}
			j.rankBuf = append(j.rankBuf, recs[:kept]...)
			if len(j.rankBuf) >= 4096 {
				j.flushRanks(false)
			}
		}
		j.st.led.hold(m.ack, touched)
	}) {
		c.ackNow(m.ack) // job:limit: nothing of it is kept
		return
	}
	if maxAttempt >= 0 {
		c.attempts.sawRecords(m.job, maxAttempt)
	}
}

// filesPerJob is the most part files a job holds open (five tables);
// reservedFiles leaves room for sockets, NATS and HTTP connections.
const (
	filesPerJob   = 5
	reservedFiles = 256
)

// directHandOff is the batch size from which decoded records go to the
// rank writer without being copied into the job's buffer.
const directHandOff = 256

// errWriteFailed reports that an earlier asynchronous write failed.
var errWriteFailed = errors.New("collector: a rank_steps write failed since the last checkpoint")

// decodeBufs recycles the record slices batches decode into.
var decodeBufs = sync.Pool{New: func() any { s := make([]tps.StepRecord, 0, decodeBufRows); return &s }}

// decodeBufRows is the rows a decode buffer holds (~0.5 MiB).
const decodeBufRows = 1024

// handlePartials merges a message of node partials (aggregator role),
// registered in the ledger like a step batch (durable mode).
func (c *Collector) handlePartials(m message) {
	ps, err := wire.DecodePartials(m.data)
	if err != nil {
		c.reject("partial:decode", 1)
		c.ackNow(m.ack)
		return
	}
	t := tally{now: time.Now(), replay: replayOf(m.ack)}
	var attempts []int64
	if !c.withJob(m.job, &t, func(j *job) {
		var touched []stepKey
		for i := range ps {
			p := &ps[i]
			if p.Job != m.job || !tps.ValidJobID(p.Job) || p.Step < 0 || p.Step > tps.MaxStep || p.Attempt < 0 || p.Attempt > tps.MaxAttempt || p.WorldSize <= 0 || p.WorldSize > tps.MaxWorldSize {
				t.reject("partial:invalid", 1)
				continue
			}
			if k, open := j.st.addPartial(p, &t); open && (len(touched) == 0 || touched[len(touched)-1] != k) {
				touched = append(touched, k)
			}
			if len(attempts) == 0 || p.Attempt != attempts[len(attempts)-1] {
				attempts = append(attempts, p.Attempt)
			}
		}
		if len(t.closed) > 0 {
			j.writeRows(false, &t)
		}
		j.st.led.hold(m.ack, touched)
	}) {
		c.ackNow(m.ack)
		return
	}
	for _, a := range attempts {
		c.attempts.sawRecords(m.job, a)
	}
}

func (c *Collector) handleEvent(m message) {
	var e tps.Event
	if err := tps.CheckKeys(m.data); err != nil {
		c.reject("event:key_case", 1)
		c.ackNow(m.ack)
		return
	}
	if err := json.Unmarshal(m.data, &e); err != nil {
		c.reject("event:decode", 1)
		c.ackNow(m.ack)
		return
	}
	if e.Job != m.job {
		c.reject("event:job", 1)
		c.ackNow(m.ack)
		return
	}
	t := tally{now: time.Now()}
	rollout, err := e.ValidateRollout() // the rollout detail is parsed once
	if err != nil {
		t.invalid(err)
		c.apply(&t)
		c.ackNow(m.ack)
		return
	}
	c.n.events.Add(1)
	c.attempts.sawEvent(e)
	if !c.withJob(e.Job, &t, func(j *job) {
		if e.Kind == tps.EventAttemptEnd {
			j.st.attemptEnded = true
		}
		if e.Kind == tps.EventAttemptEnd || e.Kind == tps.EventJobEnd {
			j.st.ended = true // until its next step record
			j.st.endEpisodes()
			t.liveChanged = true
		}
		if e.Kind == tps.EventRollout {
			j.st.addRollout(rollout)
		}
		if e.Kind == tps.EventFlopCount {
			j.st.addCount(&e)
			t.liveChanged = true
		}
		if j.out.events != nil {
			j.out.events.write([]tps.Event{e})
		}
		j.st.led.hold(m.ack, nil)
	}) {
		c.ackNow(m.ack)
	}
}

func (c *Collector) handleMeta(m message) {
	defer c.ackNow(m.ack) // metadata is republished by agents; nothing to keep
	var meta tps.RunMeta
	if err := tps.CheckKeys(m.data); err != nil {
		c.reject("meta:key_case", 1)
		return
	}
	if err := json.Unmarshal(m.data, &meta); err != nil {
		c.reject("meta:decode", 1)
		return
	}
	if meta.Job != m.job {
		c.reject("meta:job", 1)
		return
	}
	if err := meta.Topology.Validate(0); err != nil {
		c.reject("meta:topology", 1)
		c.log.Warn("meta", "bad topology in run metadata", "job", meta.Job, "err", err)
		return
	}
	if err := meta.CheckUnmeasured(); err != nil {
		c.reject("meta:unmeasured", 1)
		return
	}
	c.n.metaUpdates.Add(1)
	t := tally{now: time.Now()}
	c.withJob(meta.Job, &t, func(j *job) { j.st.setMeta(meta, &t) })
}

func (c *Collector) handleGPU(m message) {
	samples, err := wire.DecodeGPUSamples(m.data)
	if err != nil {
		c.reject("gpu:decode", 1)
		c.ackNow(m.ack)
		return
	}
	t := tally{now: time.Now()}
	kept := samples[:0]
	for _, s := range samples {
		if err := s.Validate(); err != nil {
			t.invalid(err)
			continue
		}
		if err := s.CheckClock(t.now, c.cfg.ClockTolerance); err != nil {
			t.invalid(err)
			continue
		}
		if m.node != "" && wire.NodeToken(s.Node) != m.node {
			// an agent publishes its own node's samples on its node's
			// subject: a sample naming another host is not its agent's
			t.reject("gpu:node", 1)
			continue
		}
		s.Job = m.job
		kept = append(kept, s)
	}
	if !c.withJob(m.job, &t, func(j *job) {
		if len(kept) > 0 && j.out.gpus != nil {
			j.st.addGPU(kept, &t)
			j.out.gpus.write(kept) // kept is not touched again
		}
		j.st.led.hold(m.ack, nil)
	}) {
		c.ackNow(m.ack)
	}
}
