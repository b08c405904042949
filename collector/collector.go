package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/internal/dflt"
	"github.com/tpsprof/tpsprof/internal/ratelog"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// defaultMetaWait is Config.MetaWait's default.
var defaultMetaWait = 2 * time.Second

// Config configures a Collector.
type Config struct {
	// OutDir receives one folder per job.
	OutDir string
	// NATS is where agents publish. The caller starts the embedded server
	// when the user gives none (tpsprof collector does).
	NATS natsconn.Options
	// Grace is how long a step stays open for missing ranks after its first
	// record (default 30s).
	Grace time.Duration
	// QuietAfter finalises a job's open parts once it has sent no step
	// record for this long and has no open step (default 10s), so that a
	// report on a job that just ended or paused does not wait for PartAge.
	// An attempt_end event finalises them as soon as the last step closes.
	QuietAfter time.Duration
	// MaxOpenSteps bounds the open steps of a job; past it the oldest closes
	// early (default 256). With Grace it bounds memory by the window, not by
	// the length of the run.
	MaxOpenSteps int
	// MaxStateBytes bounds the memory that jobs' declared world sizes
	// claim (default DefaultMaxStateBytes: a quarter of the memory the
	// process may use, at most 4 GiB): open steps cost
	// tps.StepAccumulatorBytes(world) each plus a bit per rank kept after
	// they close, a job 128 KiB and 32 bytes per rank. A record that would go past it
	// is rejected (world_size:memory): a record claiming the largest world
	// costs ~67 MB of open step, and a few hundred used to get the
	// collector killed. 131,072 ranks with 256 open steps fit in 1 GiB.
	MaxStateBytes int64
	// MaxJobs bounds the jobs held at once (default 1024): past it a new
	// job id evicts the longest-idle job, or, when every job is active,
	// its messages are rejected (counted as job:limit).
	MaxJobs int
	// EvictAfter closes and forgets a job that has sent nothing for this
	// long and has no open step (default 10 min); its parts are finalised,
	// and a job that comes back starts a new set of parts.
	EvictAfter time.Duration
	// ClockTolerance rejects GPU samples further than this in the future
	// (default 10 minutes): one would make every later sample of its GPU
	// look stale. Step records are checked against the clock they were
	// measured on by the node's agent (same bound); here only against
	// RecordClockTolerance, since the collector's clock may be behind the
	// nodes' (a collector 10 minutes behind rejected every record).
	ClockTolerance time.Duration
	// RecordClockTolerance rejects step records further than this ahead of
	// the collector's clock (default 24 hours): a broken clock or unit, not
	// skew, which the clock offsets handle.
	RecordClockTolerance time.Duration
	// Meta is run metadata from a file, applied to every job before what
	// the job itself publishes.
	Meta *tps.RunMeta
	// Live receives the live line every LiveInterval (default 5s); nil is silent.
	Live         io.Writer
	LiveInterval time.Duration
	// StaleAfter is how long after a job's last closed step its
	// throughput gauges (TPS, MFU, step time, ratios) stop being exported
	// on /metrics (default 5 min); tpsprof_last_step_timestamp_seconds
	// stays.
	StaleAfter time.Duration
	// MetaWait is how long the steps of a job that has no run metadata yet
	// are held open after its first record, for the metadata to arrive
	// (it travels on a subject of its own and can lose the race): when it
	// comes, the held steps are aggregated under its topology and model,
	// tensor- and pipeline-parallel peers' tokens counted once. Default
	// 2s; negative: not held. A job that never sends metadata closes its
	// first steps that much later, then as usual.
	MetaWait time.Duration
	// GPUJoinWait is how long a closed step waits for the GPU samples that
	// cover it before its row is written without them (default 5s).
	GPUJoinWait time.Duration
	// Durable reads through a JetStream stream and a durable consumer and
	// acknowledges a message only once its data is in finalised parts (see
	// durable.go). The NATS server must have JetStream enabled.
	Durable bool
	// StreamMaxAge and StreamMaxBytes bound the stream in durable mode
	// (defaults 7 days and 8 GiB; past them the oldest messages go).
	StreamMaxAge   time.Duration
	StreamMaxBytes int64
	// StreamReplicas is how many servers of a NATS cluster hold the stream
	// (default 1; 3 on a three-server cluster survives losing one).
	StreamReplicas int
	// StreamCheck is how often a durable collector checks that its stream
	// and consumer still exist, creating them again if someone deleted
	// them (default 5 s).
	StreamCheck time.Duration
	// Writer bounds the Parquet parts.
	Writer trace.WriterOptions
	// Role splits the collector's work for scale-out (docs/scale.md):
	// RoleAll (or "") does everything; RoleAggregator merges the node
	// partials agents publish into cluster rows (and takes events,
	// metadata and GPU samples); RoleRankWriter joins the pool that writes
	// rank_steps.
	Role Role
	// Partitions > 1 splits the traffic among that many collectors of one
	// role by hash (FNV-1a of the key, modulo Partitions); this one keeps
	// the share numbered Partition (0-based) and drops the rest unread.
	// The key is the job for the all and aggregator roles (a job's every
	// message lands in one collector), the job and node for rank writers
	// (a node's batches always reach the same writer, which can then drop
	// resent rank rows exactly; rank writers then do not join the queue
	// group). Not with Durable: dropping would acknowledge others' data.
	Partition, Partitions int
	// OnStep, when set, is called with every cluster step as it closes
	// (before GPU samples are joined), on the goroutine that closed it,
	// after the job's lock is released: it must return quickly (a slow
	// one slows that goroutine's messages, never other jobs').
	OnStep func(tps.ClusterStep)
	// Logger receives errors and warnings, rate-limited; nil discards them.
	Logger *slog.Logger
	// AutoCapture: when a live straggler episode has stayed open 5 closed
	// steps, capture one step
	// on its rank and the fastest rank (docs/capture.md), at most once per
	// job every AutoCaptureEvery (default 10 minutes), each bounded by
	// AutoCaptureTimeout (default 1 minute). Off by default.
	AutoCapture                          bool
	AutoCaptureEvery, AutoCaptureTimeout time.Duration
	// FiguresEvery is how often each job's cluster figures, when a step
	// closed since the last time, are published on wire.FiguresSubject for
	// rank 0 to log into the job's tracker run (default 5 s; negative:
	// never).
	FiguresEvery time.Duration
	// NodesEvery is how often the node health across jobs is brought up
	// to date from the output folder (docs/nodes.md): the node rows of the
	// jobs that finished since, kept in OUT/nodes/ (default 1 minute;
	// negative: never). Aggregating roles only.
	NodesEvery time.Duration
	// NodesRetention leaves the jobs whose folders last changed longer
	// ago out of the node view, their kept node rows removed (0: every
	// job kept).
	NodesRetention time.Duration
}

func (c *Config) defaults() error {
	if c.OutDir == "" {
		return errors.New("collector: no output directory")
	}
	if c.FiguresEvery == 0 {
		c.FiguresEvery = 5 * time.Second
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.AutoCaptureEvery, 10 * time.Minute}, {&c.AutoCaptureTimeout, time.Minute}, {&c.Grace, 30 * time.Second},
		{&c.QuietAfter, 10 * time.Second}, {&c.EvictAfter, 10 * time.Minute}, {&c.ClockTolerance, 10 * time.Minute},
		{&c.RecordClockTolerance, max(24*time.Hour, c.ClockTolerance)}, {&c.StreamMaxAge, 7 * 24 * time.Hour},
		{&c.Writer.PartAge, time.Minute}, {&c.GPUJoinWait, 5 * time.Second}, {&c.StaleAfter, 5 * time.Minute},
		{&c.LiveInterval, 5 * time.Second}} {
		dflt.Positive(d.v, d.def)
	}
	dflt.Zero(&c.NodesEvery, time.Minute)
	dflt.Positive(&c.MaxOpenSteps, 256)
	dflt.Positive(&c.MaxJobs, 1024)
	if c.MaxStateBytes <= 0 {
		c.MaxStateBytes = DefaultMaxStateBytes() // reads the machine's memory: only when needed
	}
	dflt.Positive(&c.StreamMaxBytes, 8<<30)
	if err := trace.CheckCodec(c.Writer.Codec); err != nil {
		return fmt.Errorf("collector: %w", err)
	}
	if err := c.checkRole(); err != nil {
		return err
	}
	switch {
	case c.MetaWait == 0:
		c.MetaWait = defaultMetaWait
	case c.MetaWait < 0:
		c.MetaWait = 0
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// checkRole checks the role and partition.
func (c *Config) checkRole() error {
	if c.Partitions < 0 || (c.Partitions > 0 && (c.Partition < 0 || c.Partition >= c.Partitions)) || (c.Partitions == 0 && c.Partition != 0) {
		return fmt.Errorf("collector: partition %d of %d: want 0 <= partition < partitions", c.Partition, c.Partitions)
	}
	role, err := ParseRole(string(c.Role))
	if err != nil {
		return err
	}
	c.Role = role
	if c.Partitions > 1 && c.Durable {
		return errors.New("collector: partitions do not combine with durable mode")
	}
	return nil
}

// Stats are the collector's counters since start.
type Stats struct {
	Records      int64            `json:"records"`      // step records accepted (first copy)
	Duplicates   int64            `json:"duplicates"`   // repeated (job, attempt, step, rank)
	Late         int64            `json:"late"`         // after their step closed; written, not aggregated
	Rejected     map[string]int64 `json:"rejected"`     // by reason: "field:reason", "batch:decode", …
	Events       int64            `json:"events"`       //
	MetaUpdates  int64            `json:"meta_updates"` //
	StepsClosed  int64            `json:"steps_closed"` //
	Incomplete   int64            `json:"steps_incomplete"`
	WriteErrors  int64            `json:"write_errors"`
	RowsLost     int64            `json:"rows_lost"`
	Jobs         int              `json:"jobs"`
	OpenSteps    int              `json:"open_steps"`
	SlowConsumer int64            `json:"slow_consumer_drops"`
	// OtherPartition counts messages of other partitions, dropped unread
	// (Config.Partitions).
	OtherPartition int64 `json:"other_partition"`
	// Evicted counts jobs closed and forgotten after EvictAfter idle, or
	// to make room under MaxJobs.
	Evicted int64 `json:"jobs_evicted"`
	// NodeFilesUnreadable counts the kept node files the node passes could
	// not read (each recomputed), NodeKeepFailed the jobs whose node rows
	// a pass could not keep (a full disk).
	NodeFilesUnreadable int64 `json:"node_files_unreadable"`
	NodeKeepFailed      int64 `json:"node_keep_failed"`
	// Quarantined counts parts found unreadable at a durable start-up and
	// renamed to *.unreadable.
	Quarantined int64 `json:"parts_quarantined"`
	// StaleParts counts unfinished part files (.part-*.tmp) of a writer
	// that died, removed at start-up: the rows of its open parts, lost
	// with it (a kill -9 loses up to a part age of rows in core mode).
	StaleParts int64 `json:"stale_parts_removed"`
	// AfterClose counts messages whose callback started once Close had
	// begun (core mode): dropped, the jobs being closed.
	AfterClose int64 `json:"dropped_after_close"`
	// JobResets counts jobs restarted after a part could not be written
	// (durable mode): their unacknowledged messages were redelivered.
	JobResets int64 `json:"job_resets"`
	// Redelivered counts the step records of messages a job reset handed
	// back, handled a second time: not counted again in Records,
	// Duplicates or Late. Reclosed counts the steps such a job closed
	// again (their rows had not reached Parquet): not in StepsClosed.
	Redelivered int64 `json:"records_redelivered"`
	Reclosed    int64 `json:"steps_reclosed"`
	// StreamRecreated counts the times the durable stream (or the role's
	// consumer) was found deleted and created again.
	StreamRecreated int64 `json:"stream_recreated"`
	// StateBytes is the memory jobs' declared world sizes claim now
	// (bounded by Config.MaxStateBytes).
	StateBytes int64 `json:"state_bytes"`
}

// Collector aggregates steps and writes traces. Its methods are safe for
// concurrent use.
type Collector struct {
	nodeState
	cfg Config
	nc  *nats.Conn
	log *ratelog.Logger
	// src is where messages come from (core subscriptions or the durable
	// stream); table is the role's handler table both hand them to
	// (ingest.go).
	src   source
	table map[string]route
	// connClosed is closed when the NATS connection has closed (a core
	// Close drains it first).
	connClosed chan struct{}
	closedOnce sync.Once

	// mu guards the map of jobs and the evicted jobs waiting to be
	// closed; it is held for map operations only. Each job has its own
	// lock (job.go); the order is mu, then a job's.
	mu       sync.Mutex
	jobs     map[string]*job
	retired  []*job    // evicted jobs whose writers the loop closes
	retireCh chan *job // evicted jobs for the closer goroutine

	mem memBudget // what declared world sizes claim (MaxStateBytes)
	// summaryCache shares /api/summary pages among requests (http.go)
	summaryCache summaryCache
	n            counters // every counter: atomics, read by Stats and scrapes without a lock
	rejMu        sync.Mutex
	rejects      map[string]int64 // by reason; rejMu

	attempts   attemptBook
	attemptSub *nats.Subscription

	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup

	captureCh    chan captureAsk
	stragglerSub *nats.Subscription
	stopCaptures context.CancelFunc
}

// counters are the collector's totals since start.
type counters struct {
	records, duplicates, late, events, metaUpdates, stepsClosed, incomplete atomic.Int64
	writeErrors, rowsLost, slowConsumer, otherPartition, evicted            atomic.Int64
	quarantined, staleParts, afterClose, resets, streamRecreated            atomic.Int64
	redelivered, reclosed                                                   atomic.Int64
	nodeUnreadable, nodeKeepFailed                                          atomic.Int64
}

// apply counts and says what state calls did; the caller holds no lock
// (the job's was released after settle). OnStep runs here too.
func (c *Collector) apply(t *tally) {
	if t.replay {
		c.n.redelivered.Add(t.records + t.duplicates + t.late)
	} else {
		c.n.records.Add(t.records)
		c.n.duplicates.Add(t.duplicates)
		c.n.late.Add(t.late)
	}
	c.n.stepsClosed.Add(t.stepsClosed)
	c.n.reclosed.Add(t.reclosed)
	c.n.incomplete.Add(t.incomplete)
	if len(t.rejected) > 0 {
		c.rejMu.Lock()
		for k, v := range t.rejected {
			c.rejects[k] += v
		}
		c.rejMu.Unlock()
	}
	for _, w := range t.warnings {
		if w.key == "" {
			c.cfg.Logger.Warn(w.msg, w.args...)
		} else {
			c.log.Warn(w.key, w.msg, w.args...)
		}
	}
	if j := t.backpressure; j != nil {
		j.out.waitWriters()
	}
	for _, ask := range t.captures {
		select {
		case c.captureCh <- ask:
		default: // one runs and one waits: this one is not run, and its episode says so
			c.linkCapture(ask, CaptureLink{State: "failed", Error: "not run: other jobs' automatic captures were under way"})
		}
	}
	if c.cfg.OnStep != nil {
		for _, row := range t.closed {
			c.cfg.OnStep(row)
		}
	}
	*t = tally{now: t.now}
}

// New connects to NATS, subscribes to every job's subjects and starts the
// closing and live loops.
func New(cfg Config) (*Collector, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	c := &Collector{cfg: cfg, jobs: map[string]*job{}, rejects: map[string]int64{}, done: make(chan struct{}),
		log: ratelog.New(cfg.Logger, 10*time.Second)}
	c.mem.max = cfg.MaxStateBytes
	// A job holds up to five open part files: with the default 1,024 jobs
	// and a limit of 1,024 open files, 700 jobs stopped the collector's
	// HTTP server and every new part with "too many open files".
	if lim, ok := openFileLimit(); ok && lim < uint64(cfg.MaxJobs)*filesPerJob+reservedFiles {
		n := max(int((int64(lim)-reservedFiles)/filesPerJob), 1)
		cfg.Logger.Warn("open-files limit too low for --max-jobs: fewer jobs held at once (raise it with ulimit -n)",
			"open_files_limit", lim, "max_jobs", cfg.MaxJobs, "now", n)
		c.cfg.MaxJobs = n
	}
	c.n.staleParts.Store(removeStaleParts(cfg.OutDir, 2*cfg.Writer.PartAge+time.Minute, cfg.Logger))
	if cfg.NATS.Name == "" {
		cfg.NATS.Name = "tpsprof-collector"
	}
	c.connClosed = make(chan struct{})
	nc, err := natsconn.Connect(cfg.NATS, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrSlowConsumer) {
			c.n.slowConsumer.Add(1)
		}
		c.log.Warn("nats", "nats error", "err", err)
	}), nats.ClosedHandler(func(*nats.Conn) { c.closedOnce.Do(func() { close(c.connClosed) }) }), nats.DrainTimeout(drainTimeout))
	if err != nil {
		return nil, err
	}
	c.nc = nc
	if c.cfg.Role.aggregates() {
		// launch asks which attempt a new launch is: a core request in every mode
		if c.attemptSub, err = nc.Subscribe(wire.AllAttempt, c.handleAttempt); err != nil {
			nc.Close()
			return nil, fmt.Errorf("collector: subscribe %s: %w", wire.AllAttempt, err)
		}
		if c.stragglerSub, err = nc.Subscribe(wire.AllStraggler, c.handleStraggler); err != nil {
			nc.Close()
			return nil, fmt.Errorf("collector: subscribe %s: %w", wire.AllStraggler, err)
		}
	}
	c.retireCh = make(chan *job, 64)
	c.captureCh = make(chan captureAsk, 1)
	c.table = c.routes()
	if c.cfg.Durable {
		c.src = &durableSource{c: c}
	} else {
		c.src = &coreSource{c: c}
	}
	if err := c.src.start(); err != nil {
		nc.Close()
		return nil, err
	}
	c.startCaptures()
	c.wg.Add(2)
	go c.loop()
	go c.closer()
	if c.cfg.FiguresEvery > 0 {
		c.wg.Add(1)
		go c.publishFigures()
	}
	if c.cfg.NodesEvery > 0 && c.cfg.Role.aggregates() {
		c.nodesNow = make(chan chan struct{})
		c.wg.Add(1)
		go c.nodePass()
	}
	return c, nil
}

// URL is the NATS server the collector is connected to (redacted).
func (c *Collector) URL() string { return natsconn.Redacted(c.nc.ConnectedUrl()) }

func (c *Collector) reject(reason string, n int64) {
	c.rejMu.Lock()
	c.rejects[reason] += n
	c.rejMu.Unlock()
}

// evictIdlest evicts the job idle the longest, if it has been idle for
// QuietAfter and is evictable. The caller holds mu. A job whose lock is
// busy is not idle: it is skipped, never waited for.
func (c *Collector) evictIdlest(now time.Time) bool {
	var best *job
	for _, j := range c.jobs {
		if now.Sub(j.idleSince()) >= c.cfg.QuietAfter && (best == nil || j.idleSince().Before(best.idleSince())) {
			if j.mu.TryLock() {
				ok := j.evictable()
				j.mu.Unlock()
				if ok {
					best = j
				}
			}
		}
	}
	if best == nil || len(c.retireCh) == cap(c.retireCh) || !best.mu.TryLock() {
		return false
	}
	ok := best.evictable()
	if ok {
		c.evict(best)
	}
	best.mu.Unlock()
	return ok
}

// evict forgets a job: out of the map, marked so a handler holding it
// takes the job anew; its last rows are written and its writers closed by
// the closer (or the loop), outside mu. The caller holds mu and the job's
// lock.
func (c *Collector) evict(j *job) {
	j.evicted = true
	delete(c.jobs, j.st.id)
	select {
	case c.retireCh <- j: // the closer finalises its parts
	default:
		c.retired = append(c.retired, j) // the loop does, at its next tick
	}
	c.n.evicted.Add(1)
}

// closer finalises the parts of evicted jobs and stops their writers, off
// the collector's lock and off the message path.
func (c *Collector) closer() {
	defer c.wg.Done()
	for {
		select {
		case j := <-c.retireCh:
			c.closeJobs([]*job{j})
		case <-c.done:
			return
		}
	}
}

// sweep evicts the jobs idle for EvictAfter. The caller holds mu.
func (c *Collector) sweep(now time.Time) {
	for _, j := range c.jobs {
		if now.Sub(j.idleSince()) < c.cfg.EvictAfter || !j.mu.TryLock() {
			continue
		}
		if j.evictable() {
			c.evict(j)
		}
		j.mu.Unlock()
	}
}

func (c *Collector) loop() {
	defer c.wg.Done()
	tick := time.NewTicker(min(c.cfg.Grace/4, 250*time.Millisecond))
	defer tick.Stop()
	lastLive := time.Now()
	for {
		select {
		case <-c.done:
			return
		case now := <-tick.C:
			live := c.cfg.Live != nil && now.Sub(lastLive) >= c.cfg.LiveInterval
			if live {
				lastLive = now
			}
			var lines []string
			t := tally{now: now}
			for _, j := range c.jobList() {
				c.onJob(j, &t, func(j *job) {
					if j.evicted {
						return
					}
					j.tick(c, &t)
					if live {
						if l := j.st.liveLine(now); l != "" {
							lines = append(lines, l)
						}
					}
				})
			}
			c.mu.Lock()
			c.sweep(now)
			retired := c.retired
			c.retired = nil
			c.mu.Unlock()
			c.src.tick(now) // a durable checkpoint waits for the disk: outside every lock
			c.closeJobs(retired)
			for _, l := range lines {
				fmt.Fprintln(c.cfg.Live, l)
			}
		}
	}
}

// jobList is the jobs, sorted by id (a snapshot of the map).
func (c *Collector) jobList() []*job {
	c.mu.Lock()
	js := make([]*job, 0, len(c.jobs))
	for _, j := range c.jobs {
		js = append(js, j)
	}
	c.mu.Unlock()
	sort.Slice(js, func(a, b int) bool { return js[a].st.id < js[b].st.id })
	return js
}

// Stats returns the counters. It takes no job's lock: the counters are
// atomics, the rejections have a lock of their own.
func (c *Collector) Stats() Stats {
	s := Stats{
		Records: c.n.records.Load(), Duplicates: c.n.duplicates.Load(), Late: c.n.late.Load(), Events: c.n.events.Load(),
		MetaUpdates: c.n.metaUpdates.Load(), StepsClosed: c.n.stepsClosed.Load(), Incomplete: c.n.incomplete.Load(),
		WriteErrors: c.n.writeErrors.Load(), RowsLost: c.n.rowsLost.Load(), SlowConsumer: c.n.slowConsumer.Load(),
		OtherPartition: c.n.otherPartition.Load(), Evicted: c.n.evicted.Load(), Quarantined: c.n.quarantined.Load(),
		StaleParts: c.n.staleParts.Load(), AfterClose: c.n.afterClose.Load(), StateBytes: c.mem.used.Load(), JobResets: c.n.resets.Load(), Redelivered: c.n.redelivered.Load(), Reclosed: c.n.reclosed.Load(), StreamRecreated: c.n.streamRecreated.Load(),
		NodeFilesUnreadable: c.n.nodeUnreadable.Load(), NodeKeepFailed: c.n.nodeKeepFailed.Load(),
	}
	c.rejMu.Lock()
	s.Rejected = maps.Clone(c.rejects)
	c.rejMu.Unlock()
	for _, j := range c.jobList() {
		s.Jobs++
		s.OpenSteps += int(j.openN.Load())
		s.WriteErrors += j.out.writerErrors()
		s.RowsLost += j.out.writerLost()
	}
	return s
}

// Recent returns the last cluster steps of a job (at most the live window).
func (c *Collector) Recent(job string) []tps.ClusterStep {
	c.mu.Lock()
	j, ok := c.jobs[job]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.st.recentSteps()
}

// Sync makes sure every message published before it (on connections that
// have flushed) has been handled: it round-trips to the server, so the
// client holds everything the server sent before, then waits until the
// source has handled those messages (or timeout). Messages arriving
// meanwhile do not extend the wait.
func (c *Collector) Sync(timeout time.Duration) error {
	if err := c.nc.FlushTimeout(timeout); err != nil {
		return fmt.Errorf("collector: flush: %w", err)
	}
	return c.src.sync(timeout)
}

// Close stops intake (core mode: the connection's drain handles what the
// client holds first), stops the loop, then leaves the jobs as the source
// needs them (core: every open step closed, missing ranks reported in
// their rows, all parts finalised; durable: what is in Parquet
// acknowledged, open steps left to the next collector) and disconnects.
func (c *Collector) Close() error {
	var err error
	c.closeOnce.Do(func() {
		if c.attemptSub != nil {
			_ = c.attemptSub.Unsubscribe()
		}
		if c.stragglerSub != nil {
			_ = c.stragglerSub.Unsubscribe()
		}
		c.src.stop()
		c.stopCaptures()
		close(c.done)
		c.wg.Wait()
		// finalising parts waits for the disk: outside every lock
		err = c.src.finish()
		c.nc.Close()
	})
	return err
}

// allJobs is every job, those in the map and those evicted but not yet
// closed, for Close.
func (c *Collector) allJobs() []*job {
	c.mu.Lock()
	defer c.mu.Unlock()
	jobs := make([]*job, 0, len(c.jobs)+len(c.retired))
	for _, j := range c.jobs {
		jobs = append(jobs, j)
	}
	jobs = append(jobs, c.retired...)
	jobs = append(jobs, drain(c.retireCh)...)
	c.retired = nil
	return jobs
}

// closeJobs writes the last rows of jobs no longer in use and closes their
// writers (the caller holds no lock). The writers count their own
// failures; those of an evicted job move into the totals, as it leaves
// the map Stats sums over.
func (c *Collector) closeJobs(jobs []*job) error {
	var first error
	for _, j := range jobs {
		t := tally{now: time.Now()}
		c.onJob(j, &t, func(j *job) {
			if j.st.led == nil {
				j.prepareClose(&t)
			} else {
				// Durable mode leaves open steps open: their messages are
				// not acknowledged, and the next collector aggregates them.
				j.writeRows(true, &t)
				j.flushRanks(true)
			}
			j.evicted = true
			j.st.release()
		})
		if err := j.out.closeWriters(); err != nil && first == nil {
			first = err
		}
		c.mu.Lock()
		gone := c.jobs[j.st.id] != j
		c.mu.Unlock()
		if gone {
			c.n.writeErrors.Add(j.out.writerErrors())
			c.n.rowsLost.Add(j.out.writerLost())
		}
	}
	return first
}

// drain takes what a channel holds without waiting.
func drain[T any](ch chan T) []T {
	var out []T
	for {
		select {
		case v := <-ch:
			out = append(out, v)
		default:
			return out
		}
	}
}

// removeStaleParts deletes the unfinished parts (.part-*.tmp) under out
// older than age: a live writer finalises its part within a part age, so
// an older one belongs to a writer that died (kill -9, a crash) and will
// never be completed. It says how many, and that their rows were lost.
func removeStaleParts(out string, age time.Duration, log *slog.Logger) int64 {
	files, _ := filepath.Glob(filepath.Join(out, "*", "*", ".part-*.tmp"))
	var n int64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && time.Since(fi.ModTime()) > age && os.Remove(f) == nil {
			n++
		}
	}
	if n > 0 {
		log.Warn("removed unfinished parts of a collector that died: their rows were lost with it", "parts", n, "out", out)
	}
	return n
}
