package collector

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

// job joins a job's state (state.go: pure, no lock, no I/O) to its sink
// (sink.go: five tables on writer goroutines) under the job's own lock.
// Handlers of different jobs never wait for each other; the collector's
// lock guards only the map of jobs (docs/collector.md).
type job struct {
	// mu guards st, rankBuf, lastFlush and evicted.
	mu      sync.Mutex
	st      jobState // what its records add up to (state.go)
	out     sink     // its tables on their writer goroutines (sink.go)
	rankBuf []tps.StepRecord
	// lastFlush is how many rank rows the last flush handed over (the
	// next buffer's size: ingest)
	lastFlush int

	evicted bool // out of the map: a handler that finds it takes the job anew

	touched atomic.Int64                // unix ns of the last message of any kind (eviction)
	openN   atomic.Int64                // open steps, for Stats without the lock
	live    atomic.Pointer[liveFigures] // what /metrics reads, without the lock
}

// liveFigures are a job's figures as of its last closed step, published
// for scrapes, which never take a job's lock.
type liveFigures struct {
	world, closed, incomplete, tokens int64
	stragglers, episodesOpen          int
	episodesEnded, duplicates         int64
	last                              *tps.ClusterStep
	lastClosedAt                      time.Time // the collector's clock when the last step closed
	ended                             bool      // its last attempt ended
	tokensPerJoule                    float64
	stepSeconds                       float64       // Σ step time of the closed steps
	win                               windowFigures // over the last LiveWindowSteps closed steps
	// generation latencies over the recent rollout events (seconds)
	ttft, itl *latencySummary
}

// latencySummary is a merged sketch as a Prometheus summary.
type latencySummary struct {
	count     uint64
	sum       float64
	quantiles map[float64]float64
}

func summaryOf(s *tps.Sketch) *latencySummary {
	if s.Count == 0 {
		return nil
	}
	q := map[float64]float64{}
	for _, p := range []float64{0.5, 0.95, 0.99} {
		q[p] = s.Quantile(p)
	}
	return &latencySummary{count: uint64(s.Count), sum: s.Sum, quantiles: q}
}

func newJob(c *Collector, id string) *job {
	j := &job{st: newJobState(id, limits{maxOpenSteps: c.cfg.MaxOpenSteps, gpuJoinWait: c.cfg.GPUJoinWait, metaWait: c.cfg.MetaWait, quietAfter: c.cfg.QuietAfter, mem: &c.mem}, c.cfg.Meta, c.src.ledger()),
		out: sink{job: id}}
	j.touched.Store(time.Now().UnixNano())
	j.live.Store(&liveFigures{})
	opt := c.cfg.Writer
	// Writers finalise parts on their own goroutines: they read a snapshot
	// of the metadata, replaced whenever the run metadata, the GPU seen or
	// the job's settings change.
	j.refreshMeta()
	opt.Metadata = func() map[string]string { return *j.out.metaSnap.Load() }
	// Creating the folders cannot fail silently: the first write reports it.
	onError := func(err error) { c.cfg.Logger.Error("parquet write failed", "job", id, "err", err) }
	if err := j.out.open(c.cfg.OutDir, opt, onError); err != nil {
		c.cfg.Logger.Error("cannot create the trace folders; nothing of this job is written", "job", id, "err", err)
		c.n.writeErrors.Add(1)
	}
	return j
}

// refreshMeta replaces the metadata snapshot the writers store in parts.
func (j *job) refreshMeta() {
	m := j.st.fileMetadata()
	j.out.metaSnap.Store(&m)
}

// settle publishes what a state call changed, before the job's lock is
// released: the parts' metadata snapshot, the open-step count and the
// figures scrapes read.
func (j *job) settle(t *tally) {
	if t.metaChanged {
		j.refreshMeta()
		t.metaChanged = false
	}
	j.openN.Store(int64(len(j.st.open)))
	if !t.liveChanged {
		return
	}
	t.liveChanged = false
	f := &liveFigures{world: j.st.world, closed: j.st.closedSteps, incomplete: j.st.incompleteSteps, tokens: j.st.tokens, stepSeconds: j.st.stepSeconds,
		stragglers: j.st.stragglers(), tokensPerJoule: j.st.lastTPJ, episodesOpen: len(j.st.openEpisodes), episodesEnded: j.st.episodesEnded,
		duplicates: j.st.duplicates}
	if len(j.st.recent) > 0 {
		last := j.st.lastRow()
		f.last = &last
		f.lastClosedAt = j.st.lastClosedAt
		f.win = j.st.liveFigures(LiveWindowSteps)
	}
	f.ended = j.st.ended
	ttft, itl := j.st.rolloutSketches()
	f.ttft, f.itl = summaryOf(&ttft), summaryOf(&itl)
	j.st.rollDirty = false
	j.live.Store(f)
}

// flushRanks hands the buffered rank rows, and the rank windows ready
// (with all, every one), to the job's writer goroutines.
func (j *job) flushRanks(all bool) {
	if ws := j.st.takeWindows(all); len(ws) > 0 && j.out.windows != nil {
		j.out.windows.write(ws)
	}
	if len(j.rankBuf) == 0 || j.out.ranks == nil {
		return
	}
	j.lastFlush = len(j.rankBuf)
	j.out.ranks.write(j.rankBuf)
	// the next buffer is taken when rows come (ingest: a pooled one for a
	// batch of 64 rows or more): each job that had flushed held an empty
	// 1,024-row buffer (~0.5 MiB) until its next rows, and 200 one-record
	// jobs read 16 to 283 KiB a job as the flushes fell before or after
	// the reading (TestOneRecordJobMemory)
	j.rankBuf = nil
}

// writeRows hands the closed rows that are ready (all with force) to the
// cluster writer.
func (j *job) writeRows(force bool, t *tally) {
	if rows := j.st.readyRows(force, t); len(rows) > 0 && j.out.cluster != nil {
		j.out.cluster.write(rows)
	}
}

// finalise writes what waits (closed rows still waiting for GPU samples
// included) and finalises every open part, so readers see the whole job.
func (j *job) finalise(t *tally) {
	j.flushRanks(true)
	j.writeRows(true, t)
	j.out.rotateNow()
	j.st.unfinalised, j.st.attemptEnded = false, false
}

func (j *job) rotateDue(t *tally) {
	j.flushRanks(false)
	j.writeRows(false, t)
	j.out.rotateIfDue(t.now)
}

// tick is the loop's work on a job, under its lock: close expired steps,
// track straggler episodes, write or finalise.
func (j *job) tick(c *Collector, t *tally) {
	j.st.closeExpired(c.cfg.Grace, t)
	j.st.closeHeld(t)
	if j.st.newSinceEpisodes {
		j.st.trackEpisodes(&c.cfg, t)
		j.st.newSinceEpisodes = false
		t.liveChanged = true // /metrics shows the episodes
	}
	if j.st.rollDirty {
		t.liveChanged = true // rollout latencies arrived: published here, not per event
	}
	switch {
	case j.st.led != nil: // durable: parts are finalised by checkpoints
		j.writeRows(false, t)
		j.flushRanks(false)
	case j.out.ranks != nil && j.st.finaliseDue(t.now):
		j.finalise(t)
	default:
		j.rotateDue(t)
	}
}

// prepareClose closes the open steps and hands every row to the writers;
// the caller holds the job's lock and calls closeWriters after releasing it.
func (j *job) prepareClose(t *tally) {
	j.st.closeAll(t)
	j.writeRows(true, t)
	j.flushRanks(true)
}

// evictable: nothing open or waiting, no message unacknowledged for it,
// no checkpoint holding any. The caller holds the job's lock.
func (j *job) evictable() bool {
	return len(j.st.open) == 0 && len(j.st.pending) == 0 && len(j.rankBuf) == 0 && j.st.led.settled()
}

func (j *job) idleSince() time.Time { return time.Unix(0, j.touched.Load()) }
