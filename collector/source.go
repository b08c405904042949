package collector

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// source is where a collector's messages come from, and what they need
// before they are settled: core subscriptions (coreSource, below), or a
// JetStream stream read through a durable consumer, acknowledged once
// their data is in finalised parts (durableSource, durable.go). Both hand
// every message to ingest.
type source interface {
	// start subscribes; messages may be handled once it returns.
	start() error
	// ledger is a new job's bookkeeping; nil where the source needs none.
	ledger() *ledger
	// sync waits until every message published before it (on connections
	// that have flushed) has been handled.
	sync(timeout time.Duration) error
	// tick is the source's periodic work, run by the loop outside every
	// lock.
	tick(now time.Time)
	// stop ends intake: once it returns, no handler runs.
	stop()
	// finish leaves the jobs as the source needs them once the loop has
	// stopped; it waits for the disk, so no lock is held.
	finish() error
}

// coreSource reads a core NATS subscription per kind of the role's
// handler table. Nothing is acknowledged: what a collector that dies had
// not written is lost (docs/collector.md).
type coreSource struct {
	c    *Collector
	subs []*nats.Subscription
	// gate orders message callbacks (readers) before the jobs are
	// finished (the writer): closed is set under it once no callback
	// runs. The connection's drain already waits for callbacks; the gate
	// holds where the drain could not (a server gone, the drain timed
	// out).
	gate   sync.RWMutex
	closed bool
}

func (s *coreSource) start() error {
	c := s.c
	queue := ""
	if c.cfg.Role.pooled() && c.cfg.Partitions <= 1 {
		queue = "tpsprof-rank-writers"
	}
	for _, r := range c.table {
		sub, err := c.nc.QueueSubscribe(r.subject, queue, s.receive)
		if err != nil {
			return fmt.Errorf("collector: subscribe %s: %w", r.subject, err)
		}
		// Hold bursts rather than drop them; past this, drops are counted.
		sub.SetPendingLimits(1<<20, 1<<30)
		s.subs = append(s.subs, sub)
	}
	if err := c.nc.Flush(); err != nil && c.nc.IsConnected() {
		return fmt.Errorf("collector: %w", err)
	}
	return nil
}

// receive is every subscription's callback.
func (s *coreSource) receive(m *nats.Msg) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		s.c.n.afterClose.Add(1)
		return
	}
	s.c.ingest(m.Subject, m.Data, nil)
}

func (s *coreSource) ledger() *ledger { return nil }

// sync waits for a barrier queued behind the messages the client holds on
// every subscription (the caller has round-tripped to the server).
// Messages arriving meanwhile do not extend the wait.
func (s *coreSource) sync(timeout time.Duration) error {
	done := make(chan struct{})
	if err := s.c.nc.Barrier(func() { close(done) }); err != nil {
		return fmt.Errorf("collector: barrier: %w", err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("collector: messages received before the sync still unhandled after %v", timeout)
	}
}

func (s *coreSource) tick(time.Time) {}

// stop drains the connection (nats.go's own drain: the server stops
// sending, every message the client holds is handled, callbacks have
// returned, then the connection closes) and waits for it to close. On a
// server that is gone, the drain closes at once and what the client
// holds is dropped, as a disconnected subscription's would be.
func (s *coreSource) stop() {
	c := s.c
	if err := c.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		c.cfg.Logger.Info("NATS drain not possible; closing", "err", err)
	}
	select {
	case <-c.connClosed:
	case <-time.After(drainTimeout + 5*time.Second):
		c.cfg.Logger.Warn("NATS drain did not finish; closing", "after", drainTimeout)
		c.nc.Close()
	}
	s.gate.Lock() // waits for callbacks still running (a drain that timed out)
	s.closed = true
	s.gate.Unlock()
}

// finish closes every job's open steps (missing ranks are reported in
// their rows) and finalises its parts.
func (s *coreSource) finish() error { return s.c.closeJobs(s.c.allJobs()) }

// drainTimeout bounds the drain at Close: handlers of the messages the
// client holds get this long (nats.go's default is 30 s).
const drainTimeout = 10 * time.Second
