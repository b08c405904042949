package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/internal/dflt"
	"github.com/tpsprof/tpsprof/internal/ratelog"
	"github.com/tpsprof/tpsprof/internal/safefs"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
)

// Config configures an Agent.
type Config struct {
	// Socket is the intake socket path (default client.DefaultSocket()).
	Socket string
	// SocketMode is the socket's permission bits (default 0600: owner only).
	SocketMode os.FileMode
	// NATS is where to publish.
	NATS natsconn.Options
	// Node names this machine in records and subjects (default: host name).
	Node string
	// GPUUUIDs maps local_rank to the GPU's UUID, for records that leave
	// gpu_uuid out.
	GPUUUIDs map[int32]string
	// BatchRecords and FlushInterval bound how long a record waits.
	BatchRecords  int
	FlushInterval time.Duration
	// BufferBytes bounds the encoded batches held while NATS is unreachable
	// (default 64 MiB); past it the oldest are dropped and counted.
	BufferBytes int
	// MaxLineBytes caps one intake line (default 64 KiB).
	MaxLineBytes int
	// MaxLinesPerSec bounds what one connection (one rank) may send,
	// sustained, with bursts of as many lines (default 10,000: a rank sends
	// a few per step); lines past it are rejected as line:rate_limited, so
	// a runaway rank cannot crowd out the others. Negative: no limit.
	MaxLinesPerSec int
	// IdleTimeout closes an intake connection that sends nothing for this
	// long (default 30 min: a rank sends every step); at MaxConnections a
	// new connection also closes the one idle the longest, if it has been
	// idle for 10 s, instead of being refused.
	IdleTimeout time.Duration
	// ForgetAfter stops republishing the metadata of a job, and sending GPU
	// samples for it, once it has sent nothing for this long (default 1 h).
	ForgetAfter time.Duration
	// MaxConnections bounds concurrent intake connections (default 4096).
	MaxConnections int
	// ClockTolerance rejects records further in the future (default 10m).
	ClockTolerance time.Duration
	// MetaInterval is how often run metadata is published again, for
	// collectors that start late (default 10s).
	MetaInterval time.Duration
	// GPU, when set, is sampled every GPUInterval (default 1s; negative:
	// only when SampleGPUs is called) and the samples are published for
	// every job the node serves. The agent closes it on Close.
	GPU         GPUReader
	GPUInterval time.Duration
	// Durable publishes through JetStream and waits for the stream's
	// acknowledgement of each batch (retrying what is not acknowledged),
	// for collectors run with --durable: nothing is lost between agent and
	// stream even when the NATS server restarts mid-publish.
	Durable bool
	// Partials also publishes, per step, the aggregate of the node's ranks
	// (tps.Partial) for collectors in the aggregator role (docs/scale.md).
	// The job's topology comes from its run metadata; records without
	// dp_rank in a job without metadata count as pure data parallel.
	Partials bool
	// ResubscribeGrace is how long the agent holds its buffer after a
	// reconnect, so collectors have resubscribed before it is delivered
	// (default 2s). Core NATS drops messages no one subscribes to; for
	// delivery that survives any outage, run the collector with --durable.
	ResubscribeGrace time.Duration
	// TraceDir is where ranks write the profiler traces they sample
	// (default DefaultTraceDir(Socket)); the agent analyses each off the
	// training process and deletes it unless KeepTraces.
	TraceDir   string
	KeepTraces bool
	// TraceMaxEvents bounds the events of one trace analysis, and so its
	// memory: the records of the trace's densest step are held at once,
	// about 270 B each (2,000,000 events in one step peaked at 535 MB of
	// heap). A trace with more is not analysed (trace:unreadable).
	// Default DefaultTraceMaxEvents.
	TraceMaxEvents int64
	// CaptureGap is the least time between the end of one on-demand
	// capture of a job on this node and the start of the next (default
	// 5s; negative: none): whoever may publish capture requests cannot
	// keep the training processes profiling back to back.
	CaptureGap time.Duration
	// Clock stamps GPU samples (default time.Now; the demo runs a simulated one).
	Clock  func() time.Time
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if c.Socket == "" {
		c.Socket = client.DefaultSocket()
	}
	if c.SocketMode == 0 {
		c.SocketMode = 0o600
	}
	if c.TraceDir == "" {
		c.TraceDir = DefaultTraceDir(c.Socket)
	}
	if c.Node == "" {
		h, err := os.Hostname()
		if err != nil {
			h = "unknown"
		}
		c.Node = h
	}
	dflt.Positive(&c.BatchRecords, 1024)
	dflt.Positive(&c.BufferBytes, 64<<20)
	dflt.Positive(&c.MaxLineBytes, 64<<10)
	dflt.Zero(&c.MaxLinesPerSec, 10000) // negative: no limit
	dflt.Positive(&c.TraceMaxEvents, DefaultTraceMaxEvents)
	dflt.Positive(&c.MaxConnections, MaxConnections)
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
		set func(*time.Duration, time.Duration)
	}{{&c.FlushInterval, 100 * time.Millisecond, dflt.Positive[time.Duration]}, {&c.CaptureGap, 5 * time.Second, dflt.Zero[time.Duration]},
		{&c.IdleTimeout, 30 * time.Minute, dflt.Positive[time.Duration]}, {&c.ForgetAfter, time.Hour, dflt.Positive[time.Duration]},
		{&c.ClockTolerance, 10 * time.Minute, dflt.Positive[time.Duration]}, {&c.MetaInterval, 10 * time.Second, dflt.Positive[time.Duration]},
		{&c.GPUInterval, time.Second, dflt.Zero[time.Duration]}, {&c.ResubscribeGrace, 2 * time.Second, dflt.Positive[time.Duration]}} {
		d.set(d.v, d.def)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.GPU != nil && c.GPUUUIDs == nil {
		c.GPUUUIDs = map[int32]string{}
		for _, d := range c.GPU.Devices() {
			c.GPUUUIDs[int32(d.Index)] = d.UUID
		}
	}
	if c.NATS.URL == "" {
		return errors.New("agent: no NATS URL")
	}
	return nil
}

// Stats are the agent's counters since start.
type Stats struct {
	Connections    int64            `json:"connections"`
	Lines          int64            `json:"lines"`            // lines handled, counted after their outcome
	Records        int64            `json:"records"`          // step records accepted
	Events         int64            `json:"events"`           //
	Metas          int64            `json:"metas"`            //
	Rejected       map[string]int64 `json:"rejected"`         // by reason
	Published      int64            `json:"published"`        // step records handed to NATS
	Dropped        int64            `json:"dropped"`          // step records dropped past the buffer bound
	BufferedBytes  int64            `json:"buffered_bytes"`   // held while NATS is unreachable
	GPUSamples     int64            `json:"gpu_samples"`      //
	GPUErrors      int64            `json:"gpu_errors"`       // failed device readings
	NATSConnected  bool             `json:"nats_connected"`   //
	PublishErrors  int64            `json:"publish_errors"`   //
	BatchesPending int64            `json:"batches_buffered"` //
	TracesAnalysed int64            `json:"traces_analysed"`  // sampled profiler traces turned into trace_analysis events
	// ClaimsReplaced counts records and events that named another node,
	// or a GPU this node's agent does not have: each was stamped with
	// this agent's own (a row is charged to the node that sent it).
	ClaimsReplaced int64 `json:"claims_replaced"`
}

// Agent is the per-node intake and publisher.
type Agent struct {
	cfg Config
	nc  *nats.Conn
	ln  net.Listener
	log *ratelog.Logger
	pub *publisher

	mu       sync.Mutex
	rejected map[string]int64
	conns    map[net.Conn]*connInfo
	// who holds each rank reported through this agent, and the conflicts
	// said (ranks.go)
	rankHeld   map[rankKey]*connInfo
	rankWarned map[rankKey]bool
	userSaid   map[string]bool // the jobs whose user this agent has said (rank_user)
	gpuPerDev  []int64

	connections, lines, records, events, metas atomic.Int64
	gpuSamples, gpuErrors                      atomic.Int64
	claimsReplaced                             atomic.Int64
	sampleMu                                   sync.Mutex
	lastSample                                 time.Time

	dialErr atomic.Pointer[error]
	connsOf map[int64]int // uid → its open intake connections (mu)
	batches batchCheck    // identical batches on separate replicas (batches.go)

	traceJobs       // trace analysis (traces.go)
	captureRegistry // on-demand captures (capture.go)
	ownership       // which user's ranks write which job (owner.go)

	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// natsErr is why NATS is not reachable: the connection's last error, or
// the last failed attempt's (a server never reached leaves no last error).
func (a *Agent) natsErr() error {
	if err := a.nc.LastError(); err != nil {
		return err
	}
	if p := a.dialErr.Load(); p != nil {
		return *p
	}
	return nil
}

// ErrSocketInUse means another agent already serves the socket path.
var ErrSocketInUse = errors.New("agent: socket already served by a running agent")

// Start opens the intake socket and connects to NATS (in the background if
// NATS is not reachable yet) and returns the running agent.
func Start(cfg Config) (*Agent, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, rejected: map[string]int64{}, conns: map[net.Conn]*connInfo{}, connsOf: map[int64]int{},
		rankHeld: map[rankKey]*connInfo{}, rankWarned: map[rankKey]bool{}, userSaid: map[string]bool{}, done: make(chan struct{}),
		log: ratelog.New(cfg.Logger, 10*time.Second), traceJobs: traceJobs{traces: make(chan TraceNote, 64)},
		captureRegistry: captureRegistry{captures: map[string]*liveCapture{}}, ownership: ownership{owners: map[string]*jobOwner{}, ownedBy: map[int64]int{}}}
	// The trace folder is adopted only when it is this user's alone: in a
	// shared /tmp another user could have made it first and planted links
	// that a rank's trace writer would follow (docs/security.md).
	if err := safefs.PrivateDir(cfg.TraceDir); err != nil {
		a.traceDirErr = err
		a.log.Warn("trace", "no trace folder: sampled profiler traces will be refused", "dir", cfg.TraceDir, "err", err)
	}
	if cfg.NATS.Name == "" {
		cfg.NATS.Name = "tpsprof-agent-" + cfg.Node
	}
	if cfg.NATS.ReconnectBufBytes == 0 {
		// The agent's own bounded queue holds data while NATS is away; the
		// client's buffer would hide drops from the counters.
		cfg.NATS.ReconnectBufBytes = -1
	}
	ln, err := listenUnix(cfg.Socket, cfg.SocketMode)
	if err != nil {
		return nil, err
	}
	a.ln = ln
	nc, err := natsconn.Connect(cfg.NATS,
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// e.g. a permissions violation: this agent may not publish for a job
			a.reject("nats:error")
			a.log.Warn("nats", "NATS reported an error", "err", err)
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err == nil && nc.IsClosed() {
				return // our own Close: a clean exit, nothing to warn of
			}
			if natsconn.Refused(err) {
				a.log.Warn("disconnect", "NATS refused this agent's credentials (wrong token, user or password); records are held", "err", err)
				return
			}
			a.log.Warn("disconnect", "NATS disconnected; buffering", "err", err)
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				a.dialErr.Store(&err) // why the last attempt failed, for the messages
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			// Collectors resubscribe after a server restart at the same
			// pace as we reconnect; core NATS drops what is published to
			// no subscriber, so hold the buffer a moment.
			a.pub.holdFor(cfg.ResubscribeGrace)
			cfg.Logger.Info("NATS reconnected; delivering the buffer shortly", "after", cfg.ResubscribeGrace)
		}))
	if err != nil {
		ln.Close()
		return nil, err
	}
	a.nc = nc
	a.pub = newPublisher(a)
	if cfg.Durable {
		// Async publishes expire with the window's wait, so none lingers.
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(publishTimeout), jetstream.WithPublishAsyncMaxPending(4*publishWindow))
		if err != nil {
			nc.Close()
			ln.Close()
			return nil, fmt.Errorf("agent: jetstream: %w", err)
		}
		a.pub.js = js
	}
	a.wg.Add(3)
	go a.acceptLoop()
	go a.pub.loop()
	go a.analyseTraces()
	if cfg.GPU != nil && cfg.GPUInterval > 0 {
		a.wg.Add(1)
		go a.sampleGPUs()
	}
	return a, nil
}

// listenUnix binds path with the given mode. A stale socket file (no one
// answering) is replaced; a live one is ErrSocketInUse.
func listenUnix(path string, mode os.FileMode) (net.Listener, error) {
	if err := client.CheckSocket(path); errors.Is(err, client.ErrNotOwner) {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return nil, fmt.Errorf("%w: %s", ErrSocketInUse, path)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("agent: %s exists and is not a socket; not replacing it", path)
		}
		os.Remove(path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("agent: socket directory: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("agent: listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("agent: chmod %s: %w", path, err)
	}
	return ln, nil
}

func (a *Agent) gpuPerDevice() []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int64(nil), a.gpuPerDev...)
}

// Socket is the intake socket path.
func (a *Agent) Socket() string { return a.cfg.Socket }

// OpenConnections is how many intake connections are open now (ranks,
// and launches that joined this agent).
func (a *Agent) OpenConnections() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.conns)
}

// Node is the node name the agent stamps on records.
func (a *Agent) Node() string { return a.cfg.Node }

func (a *Agent) reject(reason string) {
	a.mu.Lock()
	a.rejected[reason]++
	a.mu.Unlock()
}

// Stats returns the counters.
func (a *Agent) Stats() Stats {
	s := Stats{Connections: a.connections.Load(), Lines: a.lines.Load(), Records: a.records.Load(), ClaimsReplaced: a.claimsReplaced.Load(),
		Events: a.events.Load(), Metas: a.metas.Load(), NATSConnected: a.nc != nil && a.nc.IsConnected(),
		GPUSamples: a.gpuSamples.Load(), GPUErrors: a.gpuErrors.Load(), TracesAnalysed: a.tracesDone.Load()}
	a.mu.Lock()
	s.Rejected = make(map[string]int64, len(a.rejected))
	for k, v := range a.rejected {
		s.Rejected[k] = v
	}
	a.mu.Unlock()
	a.pub.stats(&s)
	return s
}

// SubmitStep validates and enriches one record and queues it for publishing,
// as if it came through the socket. The launcher and in-process ranks use it.
func (a *Agent) SubmitStep(r tps.StepRecord) error {
	if err := a.checkStep(&r); err != nil {
		return err
	}
	a.queueStep(r)
	return nil
}

// checkStep normalises, enriches and validates a record (counting a
// rejection).
func (a *Agent) checkStep(r *tps.StepRecord) error {
	r.Normalize()
	a.stampStep(r)
	if err := r.Validate(); err != nil {
		a.rejectErr(err)
		return err
	}
	if err := r.CheckClock(time.Now(), a.cfg.ClockTolerance); err != nil {
		a.rejectErr(err)
		return err
	}
	return nil
}

// stampStep makes the record's node this agent's and its GPU one this
// node has: the fleet view charges a row to its node and GPU, so a record
// naming another (any job could get any host drained, or hide a bad one)
// is charged to the node that sent it, counted in ClaimsReplaced. Where
// the agent knows its GPUs, a UUID it does not have is replaced by its
// local rank's (or none); where it knows none, the record's stays.
func (a *Agent) stampStep(r *tps.StepRecord) {
	replaced := false
	if r.Node != a.cfg.Node {
		replaced = r.Node != ""
		r.Node = a.cfg.Node
	}
	if len(a.cfg.GPUUUIDs) > 0 {
		own := ""
		if r.LocalRank != nil {
			own = a.cfg.GPUUUIDs[*r.LocalRank]
		}
		if r.GPUUUID != "" && r.GPUUUID != own && !a.hasGPU(r.GPUUUID) {
			replaced = true
			r.GPUUUID = ""
		}
		if r.GPUUUID == "" {
			r.GPUUUID = own
		}
	}
	if replaced {
		a.claimsReplaced.Add(1)
	}
}

func (a *Agent) hasGPU(uuid string) bool {
	for _, u := range a.cfg.GPUUUIDs {
		if u == uuid {
			return true
		}
	}
	return false
}

// queueStep queues a checked record for publishing.
func (a *Agent) queueStep(r tps.StepRecord) {
	a.records.Add(1)
	if a.holdForTrace(&r) {
		return
	}
	a.pub.addStep(r)
}

// SubmitEvent validates and publishes a run event.
func (a *Agent) SubmitEvent(e tps.Event) error {
	if err := a.publishEvent(e); err != nil {
		return err
	}
	a.events.Add(1)
	return nil
}

// publishEvent is SubmitEvent without the count (Stats.Events counts the
// events the agent was given, not its own bookkeeping: rank_user).
func (a *Agent) publishEvent(e tps.Event) error {
	if e.Node != a.cfg.Node {
		if e.Node != "" {
			a.claimsReplaced.Add(1)
		}
		e.Node = a.cfg.Node
	}
	if err := e.Validate(); err != nil {
		a.rejectErr(err)
		return err
	}
	return a.pub.publishJSON(eventsSubject(e.Job), e)
}

// SubmitMeta validates run metadata, publishes it and republishes it every
// MetaInterval.
func (a *Agent) SubmitMeta(m tps.RunMeta) error {
	if !tps.ValidJobID(m.Job) {
		a.reject("meta:job")
		return fmt.Errorf("agent: run metadata: invalid job id %q", m.Job)
	}
	if err := m.Topology.Validate(0); err != nil {
		a.reject("meta:topology")
		return err
	}
	if _, ok := tps.TokenSourceText(m.TokenSource); m.TokenSource != "" && !ok {
		a.reject("meta:token_source")
		return fmt.Errorf("agent: run metadata: unknown token source %.40q", m.TokenSource)
	}
	if _, ok := tps.DataSourceText(m.DataSource); m.DataSource != "" && !ok {
		a.reject("meta:data_source")
		return fmt.Errorf("agent: run metadata: unknown data source %.40q", m.DataSource)
	}
	if m.Steps != "" && m.Steps != tps.StepsLoop {
		a.reject("meta:steps")
		return fmt.Errorf("agent: run metadata: unknown steps %.40q", m.Steps)
	}
	if err := m.CheckUnmeasured(); err != nil {
		a.reject("meta:unmeasured")
		return fmt.Errorf("agent: run metadata: %w", err)
	}
	a.metas.Add(1)
	a.pub.setMeta(m)
	return nil
}

func (a *Agent) rejectErr(err error) {
	var fe *tps.FieldError
	code := "record:invalid"
	if errors.As(err, &fe) {
		code = fe.Code()
	}
	a.reject(code)
	a.log.Warn(code, "record rejected", "err", err)
}

// Flush publishes what is batched and waits until NATS has it (or timeout).
func (a *Agent) Flush(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !a.pub.drained() {
		if time.Now().After(deadline) {
			return fmt.Errorf("agent: flush: %d batches still queued after %v", a.pub.queued(), timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := a.nc.FlushTimeout(max(time.Until(deadline), time.Millisecond)); err != nil {
		return fmt.Errorf("agent: flush: %w", err)
	}
	return nil
}

// Close stops accepting, publishes what it holds (waiting up to a few
// seconds for NATS) and disconnects. Connected clients are closed.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		a.ln.Close()
		a.mu.Lock()
		for c := range a.conns {
			c.Close()
		}
		a.mu.Unlock()
		close(a.done)
		a.wg.Wait()
		for pending := true; pending; {
			select {
			case n := <-a.traces:
				a.removeTrace(n.Path) // not analysed: the agent is going
			default:
				pending = false
			}
		}
		a.releaseWaits(0) // held records go out without trace figures
		a.pub.final(5 * time.Second)
		a.nc.Close()
		if a.cfg.GPU != nil {
			a.cfg.GPU.Close()
		}
		os.Remove(a.cfg.Socket)
		if a.traceDirErr == nil {
			os.Remove(a.cfg.TraceDir) // only when empty: kept traces stay
		}
	})
	return nil
}
