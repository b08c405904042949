package collector

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/internal/natsconn"
	"github.com/tpsprof/tpsprof/internal/ratelog"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// Config configures a Collector.
type Config struct {
	// OutDir receives one folder per job.
	OutDir string
	// NATS is where agents publish. The caller starts the embedded server
	// when the user gives none (see natsconn.StartEmbedded).
	NATS natsconn.Options
	// Grace is how long a step stays open for missing ranks after its first
	// record (default 30s).
	Grace time.Duration
	// MaxOpenSteps bounds the open steps of a job; past it the oldest closes
	// early (default 256). With Grace it bounds memory by the window, not by
	// the length of the run.
	MaxOpenSteps int
	// ClockTolerance rejects records further than this in the future
	// (default 10 minutes).
	ClockTolerance time.Duration
	// Meta is run metadata from a file, applied to every job before what
	// the job itself publishes.
	Meta *tps.RunMeta
	// Live receives the live line every LiveInterval (default 5s); nil is silent.
	Live         io.Writer
	LiveInterval time.Duration
	// GPUJoinWait is how long a closed step waits for the GPU samples that
	// cover it before its row is written without them (default 5s).
	GPUJoinWait time.Duration
	// Writer bounds the Parquet parts.
	Writer trace.WriterOptions
	// Logger receives errors and warnings, rate-limited; nil discards them.
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if c.OutDir == "" {
		return errors.New("collector: no output directory")
	}
	if c.Grace <= 0 {
		c.Grace = 30 * time.Second
	}
	if c.MaxOpenSteps <= 0 {
		c.MaxOpenSteps = 256
	}
	if c.ClockTolerance <= 0 {
		c.ClockTolerance = 10 * time.Minute
	}
	if c.GPUJoinWait <= 0 {
		c.GPUJoinWait = 5 * time.Second
	}
	if c.LiveInterval <= 0 {
		c.LiveInterval = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
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
}

// Collector aggregates steps and writes traces. Its methods are safe for
// concurrent use.
type Collector struct {
	cfg  Config
	nc   *nats.Conn
	subs []*nats.Subscription
	log  *ratelog.Logger

	mu       sync.Mutex
	jobs     map[string]*job
	rejected map[string]int64
	stats    Stats

	records   atomic.Int64
	closeOnce sync.Once
	done      chan struct{}
	wg        sync.WaitGroup
}

// New connects to NATS, subscribes to every job's subjects and starts the
// closing and live loops.
func New(cfg Config) (*Collector, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	c := &Collector{cfg: cfg, jobs: map[string]*job{}, rejected: map[string]int64{}, done: make(chan struct{}),
		log: ratelog.New(cfg.Logger, 10*time.Second)}
	if cfg.NATS.Name == "" {
		cfg.NATS.Name = "tpsprof-collector"
	}
	nc, err := natsconn.Connect(cfg.NATS, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrSlowConsumer) {
			c.mu.Lock()
			c.stats.SlowConsumer++
			c.mu.Unlock()
		}
		c.log.Warn("nats", "nats error", "err", err)
	}))
	if err != nil {
		return nil, err
	}
	c.nc = nc
	for subj, h := range map[string]nats.MsgHandler{wire.AllSteps: c.onSteps, wire.AllEvents: c.onEvent, wire.AllMeta: c.onMeta, wire.AllGPU: c.onGPU} {
		sub, err := nc.Subscribe(subj, h)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("collector: subscribe %s: %w", subj, err)
		}
		// Hold bursts rather than drop them; past this, drops are counted.
		sub.SetPendingLimits(1<<20, 1<<30)
		c.subs = append(c.subs, sub)
	}
	if err := nc.Flush(); err != nil && nc.IsConnected() {
		nc.Close()
		return nil, fmt.Errorf("collector: %w", err)
	}
	c.wg.Add(1)
	go c.loop()
	return c, nil
}

// URL is the NATS server the collector is connected to (redacted).
func (c *Collector) URL() string { return natsconn.Redacted(c.nc.ConnectedUrl()) }

func (c *Collector) reject(reason string, n int64) {
	c.mu.Lock()
	c.rejected[reason] += n
	c.mu.Unlock()
}

func (c *Collector) onSteps(m *nats.Msg) {
	subjJob, _, _, err := wire.ParseSubject(m.Subject)
	if err != nil {
		c.reject("subject:invalid", 1)
		return
	}
	recs, err := wire.DecodeSteps(m.Data, nil)
	if err != nil {
		c.reject("batch:decode", 1)
		c.log.Warn("decode", "undecodable step batch", "subject", m.Subject, "bytes", len(m.Data), "err", err)
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range recs {
		r := &recs[i]
		r.Normalize()
		if r.Job != subjJob {
			c.rejected["job:subject_mismatch"]++
			c.log.Warn("job", "record for another job on a job's subject", "subject", m.Subject, "job", r.Job)
			continue
		}
		if err := r.Validate(); err != nil {
			c.countInvalid(err)
			continue
		}
		if err := r.CheckClock(now, c.cfg.ClockTolerance); err != nil {
			c.countInvalid(err)
			continue
		}
		c.jobFor(r.Job).add(c, r, now)
	}
}

// countInvalid counts a validation error by its code; the caller holds mu.
func (c *Collector) countInvalid(err error) {
	var fe *tps.FieldError
	code := "record:invalid"
	if errors.As(err, &fe) {
		code = fe.Code()
	}
	c.rejected[code]++
	c.log.Warn(code, "record rejected", "err", err)
}

func (c *Collector) onEvent(m *nats.Msg) {
	var e tps.Event
	if err := json.Unmarshal(m.Data, &e); err != nil {
		c.reject("event:decode", 1)
		return
	}
	subjJob, _, _, err := wire.ParseSubject(m.Subject)
	if err != nil || e.Job != subjJob {
		c.reject("event:job", 1)
		return
	}
	if err := e.Validate(); err != nil {
		c.mu.Lock()
		c.countInvalid(err)
		c.mu.Unlock()
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Events++
	j := c.jobFor(e.Job)
	c.write(j, func() error { return j.events.Write([]tps.Event{e}) })
}

func (c *Collector) onMeta(m *nats.Msg) {
	var meta tps.RunMeta
	if err := json.Unmarshal(m.Data, &meta); err != nil {
		c.reject("meta:decode", 1)
		return
	}
	subjJob, _, _, err := wire.ParseSubject(m.Subject)
	if err != nil || meta.Job != subjJob {
		c.reject("meta:job", 1)
		return
	}
	if err := meta.Topology.Validate(0); err != nil {
		c.reject("meta:topology", 1)
		c.log.Warn("meta", "bad topology in run metadata", "job", meta.Job, "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.MetaUpdates++
	c.jobFor(meta.Job).setMeta(c, meta)
}

func (c *Collector) onGPU(m *nats.Msg) {
	subjJob, _, _, err := wire.ParseSubject(m.Subject)
	if err != nil {
		c.reject("subject:invalid", 1)
		return
	}
	samples, err := wire.DecodeGPUSamples(m.Data)
	if err != nil {
		c.reject("gpu:decode", 1)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.jobFor(subjJob)
	kept := samples[:0]
	for _, s := range samples {
		if err := s.Validate(); err != nil {
			c.countInvalid(err)
			continue
		}
		s.Job = subjJob
		kept = append(kept, s)
	}
	j.addGPU(c, kept)
}

// write runs one Parquet write, counting a failure; the caller holds mu.
func (c *Collector) write(j *job, fn func() error) {
	if err := fn(); err != nil {
		c.stats.WriteErrors++
		c.cfg.Logger.Error("parquet write failed", "job", j.id, "err", err)
	}
}

func (c *Collector) jobFor(id string) *job {
	j, ok := c.jobs[id]
	if !ok {
		j = newJob(c, id)
		c.jobs[id] = j
	}
	return j
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
			c.mu.Lock()
			for _, j := range c.jobs {
				j.closeExpired(c, now)
				j.rotateDue(c, now)
			}
			live := c.cfg.Live != nil && now.Sub(lastLive) >= c.cfg.LiveInterval
			var lines []string
			if live {
				lastLive = now
				for _, j := range c.sortedJobs() {
					if l := j.liveLine(); l != "" {
						lines = append(lines, l)
					}
				}
			}
			c.mu.Unlock()
			for _, l := range lines {
				fmt.Fprintln(c.cfg.Live, l)
			}
		}
	}
}

func (c *Collector) sortedJobs() []*job {
	js := make([]*job, 0, len(c.jobs))
	for _, j := range c.jobs {
		js = append(js, j)
	}
	sort.Slice(js, func(a, b int) bool { return js[a].id < js[b].id })
	return js
}

// Stats returns the counters.
func (c *Collector) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Rejected = make(map[string]int64, len(c.rejected))
	for k, v := range c.rejected {
		s.Rejected[k] = v
	}
	s.Jobs = len(c.jobs)
	for _, j := range c.jobs {
		s.OpenSteps += len(j.open)
	}
	return s
}

// Recent returns the last cluster steps of a job (at most the live window).
func (c *Collector) Recent(job string) []tps.ClusterStep {
	c.mu.Lock()
	defer c.mu.Unlock()
	if j, ok := c.jobs[job]; ok {
		return j.recentSteps()
	}
	return nil
}

// Sync makes sure every message published before it (on connections that
// have flushed) has been handled: it round-trips to the server, so the
// client holds everything the server sent before, then waits for a barrier
// queued behind those messages on every subscription (or timeout). Messages
// arriving meanwhile do not extend the wait.
func (c *Collector) Sync(timeout time.Duration) error {
	if err := c.nc.FlushTimeout(timeout); err != nil {
		return fmt.Errorf("collector: flush: %w", err)
	}
	done := make(chan struct{})
	if err := c.nc.Barrier(func() { close(done) }); err != nil {
		return fmt.Errorf("collector: barrier: %w", err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("collector: messages received before the sync still unhandled after %v", timeout)
	}
}

// Close drains the subscriptions, closes every open step (missing ranks are
// reported in their rows), finalises all Parquet parts and disconnects.
func (c *Collector) Close() error {
	var err error
	c.closeOnce.Do(func() {
		// Handle what has arrived before leaving; on a dead server this
		// times out and what the client holds is still handled below.
		_ = c.Sync(5 * time.Second)
		for _, s := range c.subs {
			s.Unsubscribe()
		}
		close(c.done)
		c.wg.Wait()
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, j := range c.sortedJobs() {
			if jerr := j.close(c); jerr != nil && err == nil {
				err = jerr
			}
		}
		c.nc.Close()
	})
	return err
}
