package agent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

func eventsSubject(job string) string { return wire.EventsSubject(job) }

type outMsg struct {
	subject string
	data    []byte
	records int // step records inside, for drop counts
}

// publisher batches step records per job and publishes them. While NATS is
// unreachable it holds encoded batches up to BufferBytes, dropping the
// oldest past that bound (counted): memory never grows without limit.
type publisher struct {
	a    *Agent
	kick chan struct{}
	js   jetstream.JetStream // set in durable mode

	mu         sync.Mutex
	pending    map[string][]tps.StepRecord
	pendingN   int
	queue      []outMsg
	queueBytes int
	metas      map[string]tps.RunMeta // each job's metadata, its lines merged; republished
	metaSent   time.Time
	// what each job's metadata was when last published, when, and the jobs
	// whose metadata changed since, within metaMinGap of that (sent at a
	// later drain): repeated lines publish nothing, changes at most once a
	// second a job
	metaJSON  map[string][]byte
	metaAt    map[string]time.Time
	metaDirty map[string]bool
	seenJobs  map[string]time.Time      // job → last record or metadata; forgotten after ForgetAfter
	topology  map[string]tps.Topology   // per job, from its run metadata (partials)
	sentRanks map[string]map[int64]bool // job/step → ranks already in a partial
	sentOrder []string
	holdUntil time.Time
	sawDown   bool // NATS was seen disconnected since the last delivery
	downSince time.Time
	// draining: a drain runs; it publishes the first inflight messages of
	// the queue without holding mu, so intake never waits on the network.
	draining bool
	inflight int

	published, dropped, errors atomic.Int64
}

func newPublisher(a *Agent) *publisher {
	return &publisher{a: a, kick: make(chan struct{}, 1), pending: map[string][]tps.StepRecord{}, metas: map[string]tps.RunMeta{},
		metaJSON: map[string][]byte{}, metaAt: map[string]time.Time{}, metaDirty: map[string]bool{},
		seenJobs: map[string]time.Time{}, topology: map[string]tps.Topology{}, sentRanks: map[string]map[int64]bool{}}
}

func (p *publisher) addStep(r tps.StepRecord) {
	p.mu.Lock()
	if _, ok := p.seenJobs[r.Job]; ok || len(p.seenJobs) < 1024 {
		p.seenJobs[r.Job] = time.Now()
	}
	p.pending[r.Job] = append(p.pending[r.Job], r)
	p.pendingN++
	full := p.pendingN >= p.a.cfg.BatchRecords
	p.mu.Unlock()
	if full {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// setMeta merges a job's metadata line into what its earlier lines said
// (a rank's topology, then the model from a trainer callback: the
// republished metadata keeps both) and publishes the result.
func (p *publisher) setMeta(m tps.RunMeta) {
	p.mu.Lock()
	if old, ok := p.metas[m.Job]; ok {
		old.Merge(m)
		m = old
	}
	p.metas[m.Job] = m
	b, _ := json.Marshal(m)
	now := time.Now()
	p.seenJobs[m.Job] = now
	if m.Topology != (tps.Topology{}) {
		p.topology[m.Job] = m.Topology
	}
	switch {
	case bytes.Equal(b, p.metaJSON[m.Job]):
		p.mu.Unlock() // nothing new: the periodic republish carries it
		return
	case now.Sub(p.metaAt[m.Job]) < metaMinGap:
		p.metaDirty[m.Job] = true // sent by a later drain
		p.mu.Unlock()
		return
	}
	p.sendMeta(m.Job, b, now)
	p.mu.Unlock()
	p.flushNow()
}

// metaMinGap is the least time between two publishes of a job's changed
// metadata (3,000 meta lines made 6,000 publishes in 21 s).
const metaMinGap = time.Second

// sendMeta queues a job's metadata b; mu held.
func (p *publisher) sendMeta(job string, b []byte, now time.Time) {
	p.enqueue(outMsg{subject: wire.MetaSubject(job), data: b})
	p.metaJSON[job], p.metaAt[job] = b, now
	delete(p.metaDirty, job)
}

func (p *publisher) publishJSON(subject string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agent: encode: %w", err)
	}
	p.mu.Lock()
	p.enqueue(outMsg{subject: subject, data: b})
	p.mu.Unlock()
	p.flushNow()
	return nil
}

// jobs lists the jobs this node has served.
func (p *publisher) jobs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.seenJobs))
	for j, t := range p.seenJobs {
		if time.Since(t) < p.a.cfg.ForgetAfter {
			out = append(out, j)
		}
	}
	return out
}

// publishRaw queues an already encoded message (GPU samples).
func (p *publisher) publishRaw(subject string, data []byte) {
	p.mu.Lock()
	p.enqueue(outMsg{subject: subject, data: data})
	p.mu.Unlock()
}

// enqueue adds a message, dropping the oldest past the bound; mu held.
func (p *publisher) enqueue(m outMsg) {
	p.queue = append(p.queue, m)
	p.queueBytes += len(m.data)
	for p.queueBytes > p.a.cfg.BufferBytes && len(p.queue) > 1 {
		i := p.inflight // the window being sent stays
		if len(p.queue) < i+2 {
			break // keep the newest
		}
		old := p.queue[i]
		p.queue = slices.Delete(p.queue, i, i+1)
		p.queueBytes -= len(old.data)
		p.dropped.Add(int64(old.records))
		p.a.log.Warn("drop", "buffer full while NATS is unreachable; dropping the oldest batch", "records", old.records, "buffer_bytes", p.a.cfg.BufferBytes)
	}
}

// batch encodes the pending records into messages; mu held.
func (p *publisher) batch() {
	if p.pendingN == 0 {
		return
	}
	subj := wire.StepsSubject
	node := wire.NodeToken(p.a.cfg.Node)
	for job, recs := range p.pending {
		for i := 0; i < len(recs); i += p.a.cfg.BatchRecords {
			chunk := recs[i:min(i+p.a.cfg.BatchRecords, len(recs))]
			p.enqueue(outMsg{subject: subj(job, node), data: wire.AppendSteps(nil, chunk), records: len(chunk)})
		}
		if p.a.cfg.Partials {
			p.partials(job, node, recs)
		}
		delete(p.pending, job)
	}
	p.pendingN = 0
}

// partials aggregates the batch's records into one partial per step, for
// aggregators (docs/scale.md). A rank already sent in an earlier partial of
// the same step is left out, so partials of a step stay disjoint.
func (p *publisher) partials(job, node string, recs []tps.StepRecord) {
	topo := p.topology[job]
	byStep := map[[2]int64][]tps.StepRecord{}
	var order [][2]int64
	for _, r := range recs {
		k := [2]int64{r.Attempt, r.Step}
		sent := p.sentRanks[job+"/"+fmt.Sprint(k)]
		if sent[r.Rank] {
			continue
		}
		if _, ok := byStep[k]; !ok {
			order = append(order, k)
		}
		byStep[k] = append(byStep[k], r)
	}
	var out []tps.Partial
	for _, k := range order {
		part, err := tps.NewPartial(byStep[k], topo)
		if err != nil {
			continue
		}
		key := job + "/" + fmt.Sprint(k)
		sent := p.sentRanks[key]
		if sent == nil {
			sent = map[int64]bool{}
			p.sentRanks[key] = sent
			p.sentOrder = append(p.sentOrder, key)
			if len(p.sentOrder) > 64 { // remember the last 64 steps
				delete(p.sentRanks, p.sentOrder[0])
				p.sentOrder = p.sentOrder[1:]
			}
		}
		for _, r := range part.Ranks {
			sent[r] = true
		}
		out = append(out, part)
	}
	if len(out) == 0 {
		return
	}
	p.enqueue(outMsg{subject: wire.PartialSubject(job, node), data: wire.EncodePartials(out)})
}

func (p *publisher) holdFor(d time.Duration) {
	p.mu.Lock()
	p.holdUntil = time.Now().Add(d)
	p.mu.Unlock()
}

// drain publishes queued messages while NATS is connected. It holds mu
// only between messages: a durable publish waits up to 2 s for the stream,
// and intake (addStep) must not wait with it.
func (p *publisher) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.draining {
		return
	}
	p.batch()
	// After an outage, hold the buffer a moment so collectors have
	// resubscribed (the reconnect callback may run after we see the link up).
	switch up := p.a.nc.IsConnected(); {
	case !up:
		p.sawDown = true
		if p.downSince.IsZero() {
			p.downSince = time.Now()
		}
		// Say so from the start and keep saying it (rate-limited): a
		// wrong URL must not be found only when the job ends.
		if d := time.Since(p.downSince); d >= natsDownWarnAfter && natsconn.Refused(p.a.natsErr()) {
			p.a.log.Warn("nats-down", "NATS refused this agent's credentials (wrong token, user or password): nothing is published until they are fixed; step records are held, past the buffer the oldest are dropped",
				"url", natsconn.Redacted(p.a.cfg.NATS.URL), "for", d.Round(time.Second), "err", p.a.nc.LastError(), "buffered_bytes", p.queueBytes, "dropped_records", p.dropped.Load())
		} else if d >= natsDownWarnAfter {
			p.a.log.Warn("nats-down", "NATS unreachable: step records are held and published when it comes up; past the buffer the oldest are dropped",
				"url", natsconn.Redacted(p.a.cfg.NATS.URL), "cause", natsconn.Cause(p.a.natsErr()), "for", d.Round(time.Second), "buffered_bytes", p.queueBytes, "buffer_max_bytes", p.a.cfg.BufferBytes, "dropped_records", p.dropped.Load())
		}
	case p.sawDown:
		p.sawDown = false
		p.holdUntil = time.Now().Add(p.a.cfg.ResubscribeGrace)
		if !p.downSince.IsZero() {
			p.a.cfg.Logger.Info("NATS reachable again", "url", natsconn.Redacted(p.a.cfg.NATS.URL), "after", time.Since(p.downSince).Round(time.Second))
		}
		p.downSince = time.Time{}
	}
	if time.Now().Before(p.holdUntil) {
		return
	}
	if time.Since(p.metaSent) >= p.a.cfg.MetaInterval && len(p.metas) > 0 {
		p.forget()
		now := time.Now()
		for job, m := range p.metas {
			if now.Sub(p.metaAt[job]) < p.a.cfg.MetaInterval {
				continue // sent within the interval (a job's first line, at start-up); a change waits for the dirty pass
			}
			b, _ := json.Marshal(m)
			p.sendMeta(job, b, now)
		}
		p.metaSent = now
	}
	for job := range p.metaDirty { // changes held back by metaMinGap
		if now := time.Now(); now.Sub(p.metaAt[job]) >= metaMinGap {
			if m, ok := p.metas[job]; ok {
				b, _ := json.Marshal(m)
				p.sendMeta(job, b, now)
			} else {
				delete(p.metaDirty, job)
			}
		}
	}
	nc := p.a.nc
	p.draining = true
	defer func() { p.draining = false }()
	for len(p.queue) > 0 && nc.IsConnected() {
		n := min(len(p.queue), publishWindow)
		win := slices.Clone(p.queue[:n])
		p.inflight = n
		p.mu.Unlock()
		errs := p.publishAll(win)
		p.mu.Lock()
		p.inflight = 0
		// The window is still the head of the queue (enqueue drops only
		// behind it). Messages that failed go back to the head, in order.
		var failed []outMsg
		var firstErr error
		for i, m := range win {
			if errs[i] != nil {
				failed = append(failed, m)
				firstErr = cmp.Or(firstErr, errs[i])
				continue
			}
			p.queueBytes -= len(m.data)
			p.published.Add(int64(m.records))
		}
		clear(p.queue[:n])
		p.queue = append(failed, p.queue[n:]...)
		if firstErr != nil {
			p.errors.Add(int64(len(failed)))
			p.a.log.Warn("publish", "publish failed; keeping the batches", "failed", len(failed), "of", n, "err", firstErr)
			return
		}
	}
}

// publishWindow bounds the messages in flight at once: in durable mode
// each waits for the stream's acknowledgement, and waiting for them
// together rather than one by one keeps a slow round trip from limiting
// the rate (one at a time, a 2 ms round trip caps it at 500 batches/s).
const publishWindow = 64

// publishTimeout bounds the wait for a window's acknowledgements.
const publishTimeout = 5 * time.Second

// publishAll sends a window of messages and reports each one's error:
// fire-and-forget on core NATS, or, in durable mode, published
// asynchronously and awaited for the stream's acknowledgement.
func (p *publisher) publishAll(ms []outMsg) []error {
	errs := make([]error, len(ms))
	if p.js == nil {
		for i, m := range ms {
			errs[i] = p.a.nc.Publish(m.subject, m.data)
		}
		return errs
	}
	futs := make([]jetstream.PubAckFuture, len(ms))
	for i, m := range ms {
		futs[i], errs[i] = p.js.PublishAsync(m.subject, m.data)
	}
	timeout := time.NewTimer(publishTimeout)
	defer timeout.Stop()
	for i, f := range futs {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i] = err
		case <-timeout.C:
			for k := i; k < len(futs); k++ {
				if futs[k] != nil && errs[k] == nil {
					select {
					case <-futs[k].Ok():
					default:
						errs[k] = fmt.Errorf("no acknowledgement from the stream within %v", publishTimeout)
					}
				}
			}
			return errs
		}
	}
	return errs
}

func (p *publisher) flushNow() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *publisher) loop() {
	defer p.a.wg.Done()
	t := time.NewTicker(p.a.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-p.a.done:
			return
		case <-t.C:
			p.drain()
		case <-p.kick:
			p.drain()
		}
	}
}

// final publishes what is left, waiting up to timeout for NATS to be
// reachable; what still cannot be sent is counted as dropped.
func (p *publisher) final(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	// metadata changes held back by metaMinGap go now: a job that ended
	// within a second of its last change (a one-process job of a second:
	// its token source, its steps) lost them with the agent
	p.mu.Lock()
	now := time.Now()
	for job := range p.metaDirty {
		if m, ok := p.metas[job]; ok {
			b, _ := json.Marshal(m)
			p.sendMeta(job, b, now)
		} else {
			delete(p.metaDirty, job)
		}
	}
	p.mu.Unlock()
	for {
		p.drain()
		p.mu.Lock()
		left := len(p.queue)
		p.mu.Unlock()
		if left == 0 {
			p.a.nc.FlushTimeout(max(time.Until(deadline), 100*time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			p.mu.Lock()
			for _, m := range p.queue {
				p.dropped.Add(int64(m.records))
			}
			p.a.cfg.Logger.Error("NATS unreachable at shutdown; records dropped", "batches", len(p.queue))
			p.queue, p.queueBytes = nil, 0
			p.mu.Unlock()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *publisher) stats(s *Stats) {
	s.Published, s.Dropped, s.PublishErrors = p.published.Load(), p.dropped.Load(), p.errors.Load()
	p.mu.Lock()
	s.BufferedBytes = int64(p.queueBytes)
	s.BatchesPending = int64(len(p.queue))
	p.mu.Unlock()
}

// natsDownWarnAfter is how long NATS may be unreachable before the agent
// says so (then every 10 s while it lasts).
const natsDownWarnAfter = 3 * time.Second

// drained drains and reports whether nothing is queued or in flight
// (another drain may be running: then it waits for that one).
func (p *publisher) drained() bool {
	p.drain()
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue) == 0 && p.pendingN == 0 && !p.draining
}

func (p *publisher) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// forget drops the jobs that sent nothing for ForgetAfter: their metadata
// is no longer republished, nor GPU samples sent for them; mu held.
func (p *publisher) forget() {
	for job, t := range p.seenJobs {
		if time.Since(t) >= p.a.cfg.ForgetAfter {
			delete(p.seenJobs, job)
			delete(p.metas, job)
			delete(p.topology, job)
			delete(p.metaJSON, job)
			delete(p.metaAt, job)
			delete(p.metaDirty, job)
		}
	}
}
