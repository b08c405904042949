package collector

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// Durable mode: agents publish as usual; a JetStream stream captures every
// tpsprof subject, and the collector reads it through a durable consumer.
// A message is acknowledged only after everything it fed is in Parquet
// parts that have been renamed into place: its records' rank rows, and the
// cluster rows of the steps they went into. A collector that dies (kill -9
// included) loses nothing: on restart the stream redelivers the messages
// not acknowledged, and the keys found in parts written after the last
// acknowledgement keep them from being written or counted twice.

// Stream and consumer names. The stream is a work queue, whose consumers
// must not overlap: one all-role collector, or an aggregator and a pool of
// rank writers with the filters below, per stream.
const (
	StreamName   = "TPSPROF"
	ConsumerName = "tpsprof-collector"
	// AggregatorConsumer takes node partials, GPU samples, events and
	// metadata; RankWriterConsumer the step batches, shared by every rank
	// writer (each pull takes different messages).
	AggregatorConsumer = "tpsprof-aggregator"
	RankWriterConsumer = "tpsprof-rank-writers"
)

// durableConsumer is the consumer of the collector's role: its name, its
// filter subjects, whether a collector starting resets it (it is alone on
// it), and how long a message may wait for its acknowledgement before the
// stream hands it to another reader.
func (c *Collector) durableConsumer() jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{Durable: ConsumerName, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour,
		MaxAckPending: 1 << 20, DeliverPolicy: jetstream.DeliverAllPolicy}
	switch c.cfg.Role {
	case "aggregator":
		cc.Durable = AggregatorConsumer
		cc.FilterSubjects = []string{wire.AllPartials, wire.AllGPU, wire.AllEvents, wire.AllMeta}
	case "rank-writer":
		// Shared: not reset by a writer starting, so a writer that dies
		// leaves its unacknowledged messages to the others after AckWait.
		// Writers acknowledge at every checkpoint (PartAge).
		cc.Durable = RankWriterConsumer
		cc.FilterSubjects = []string{wire.AllSteps}
		cc.AckWait = max(5*c.cfg.Writer.PartAge, 30*time.Second)
	}
	return cc
}

type acker interface{ Ack() error }

type ackItem struct {
	ack   acker
	steps []stepKey // open steps the message's records went into
}

type durableState struct {
	js jetstream.JetStream
	mu sync.Mutex // guards consumer and consume, which watchStream replaces
	// consumer and consume are the role's consumer and its consumption.
	consumer jetstream.Consumer
	consume  jetstream.ConsumeContext
	// stopWatch stops watchStream; watchDone is closed when it returned.
	stopWatch, watchDone chan struct{}
	// replays are the stream sequences of messages a job reset handed
	// back: their records were counted when they first came
	replayMu sync.Mutex
	replays  map[uint64]bool
	handled  atomic.Uint64 // highest stream sequence handled
	lastRot  atomic.Int64  // unix ns of the last checkpoint
	// checkpointing: a checkpoint runs (the loop's, or a Sync's)
	checkpointing atomic.Bool
}

// diskKeys are the step and rank keys in parts that no acknowledgement
// covers: written before a crash, possibly from messages that will be
// redelivered.
type diskKeys struct {
	closed map[stepKey]bool
	ranks  map[stepKey]map[int64]bool
}

func (d *diskKeys) markRank(k stepKey, r int64) {
	m := d.ranks[k]
	if m == nil {
		m = map[int64]bool{}
		d.ranks[k] = m
	}
	m[r] = true
}

// startDurable creates (or updates) the stream and the durable consumer,
// loads the keys of unacknowledged parts, starts consuming, and watches
// the stream: one deleted (by anyone holding a credential that may) is
// created again with its consumer, so agents publishing to it stop
// retrying and nothing after the deletion is lost.
func (c *Collector) startDurable() error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return fmt.Errorf("collector: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.durable = &durableState{js: js, stopWatch: make(chan struct{}), watchDone: make(chan struct{}), replays: map[uint64]bool{}}
	if err := c.ensureStream(ctx); err != nil {
		return err
	}
	// The stream is a work queue: acknowledged messages leave it, so it
	// holds exactly what no collector has secured in Parquet. A consumer
	// left by a collector that died still holds its messages as pending
	// acknowledgements until they time out; deleting it hands them all to
	// the new consumer at once. (One durable collector per stream.)
	if c.cfg.Role != "rank-writer" {
		if err := js.DeleteConsumer(ctx, StreamName, c.durableConsumer().Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("collector: reset consumer: %w", err)
		}
	}
	c.durable.lastRot.Store(time.Now().UnixNano())
	if err := c.loadDiskKeys(ctx); err != nil {
		return err
	}
	if err := c.startConsumer(ctx); err != nil {
		return err
	}
	go c.watchStream()
	return nil
}

// ensureStream creates the stream, or updates it only if its limits
// differ: several collectors of a role start at once, and a stream update
// racing a consumer creation is a data race inside nats-server (seen under
// -race in TestDurableRankWriterSurvivesKill9).
func (c *Collector) ensureStream(ctx context.Context) error {
	js := c.durable.js
	want := jetstream.StreamConfig{
		Name: StreamName, Subjects: []string{wire.Prefix + ".>"}, Storage: jetstream.FileStorage,
		Retention: jetstream.WorkQueuePolicy, MaxAge: c.cfg.StreamMaxAge, MaxBytes: c.cfg.StreamMaxBytes, Discard: jetstream.DiscardOld,
		Replicas: max(c.cfg.StreamReplicas, 1),
	}
	st, err := js.Stream(ctx, StreamName)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		_, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // another collector created it meanwhile
		}
	case err == nil:
		if have := st.CachedInfo().Config; have.MaxAge != want.MaxAge || have.MaxBytes != want.MaxBytes || have.Replicas != want.Replicas ||
			have.Retention != want.Retention || have.Discard != want.Discard || !slices.Equal(have.Subjects, want.Subjects) {
			_, err = js.UpdateStream(ctx, want)
		}
	}
	if err != nil {
		hint := ""
		if strings.Contains(strings.ToLower(err.Error()), "insufficient") || strings.Contains(strings.ToLower(err.Error()), "resources") {
			hint = fmt.Sprintf(" (the stream may hold %d MiB and JetStream keeps a quarter of the disk free: give --stream-max-bytes a size the disk holds, or free space)", c.cfg.StreamMaxBytes>>20)
		}
		return fmt.Errorf("collector: create stream %s: %w%s", StreamName, err, hint)
	}
	return nil
}

// startConsumer creates the role's consumer (or takes the existing one)
// and starts consuming from it.
func (c *Collector) startConsumer(ctx context.Context) error {
	cfg := c.durableConsumer()
	cons, err := c.durable.js.CreateOrUpdateConsumer(ctx, StreamName, cfg)
	if err != nil {
		return fmt.Errorf("collector: create consumer %s (a work-queue stream takes one all-role collector, or an aggregator and rank writers, not both): %w", cfg.Durable, err)
	}
	cc, err := cons.Consume(c.onDurable, jetstream.PullMaxMessages(4096))
	if err != nil {
		return fmt.Errorf("collector: consume: %w", err)
	}
	c.durable.mu.Lock()
	c.durable.consumer, c.durable.consume = cons, cc
	c.durable.mu.Unlock()
	return nil
}

// watchStream creates the stream and the consumer again when they have
// been deleted. It runs until stopWatch is closed (closeDurable).
func (c *Collector) watchStream() {
	defer close(c.durable.watchDone)
	every := c.cfg.StreamCheck
	if every <= 0 {
		every = 5 * time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-c.durable.stopWatch:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.durable.js.Stream(ctx, StreamName)
		streamGone := errors.Is(err, jetstream.ErrStreamNotFound)
		consumerGone := false
		if err == nil {
			_, err = c.durable.js.Consumer(ctx, StreamName, c.durableConsumer().Durable)
			consumerGone = errors.Is(err, jetstream.ErrConsumerNotFound)
		}
		if streamGone || consumerGone {
			what := "consumer " + c.durableConsumer().Durable
			if streamGone {
				what = "stream " + StreamName
			}
			c.durable.mu.Lock()
			old := c.durable.consume
			c.durable.mu.Unlock()
			old.Stop()
			select { // its handler calls end before the new consumer's begin
			case <-old.Closed():
			case <-ctx.Done():
			}
			if err := c.ensureStream(ctx); err != nil {
				c.cfg.Logger.Error("durable: the "+what+" was deleted and cannot be created again; trying again", "err", err)
			} else if err := c.startConsumer(ctx); err != nil {
				c.cfg.Logger.Error("durable: the "+what+" was deleted; its consumer cannot be created again; trying again", "err", err)
			} else {
				c.n.streamRecreated.Add(1)
				c.cfg.Logger.Warn("durable: the " + what + " was deleted (by a client allowed to: see docs/security.md) and is created again; messages it held and no checkpoint had acknowledged are lost, rows already handled are still written")
			}
		}
		cancel()
	}
}

// consumerNow is the consumer consumed now (watchStream may replace it).
func (d *durableState) consumerNow() jetstream.Consumer {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.consumer
}

// handlerAck is a message's acknowledgement as handlers see it: Ack
// acknowledges (checkpoints call it, outside the lock); a handler that
// finds nothing to keep asks for it with ackNow, which only marks it, and
// onDurable acknowledges after the handler has released the lock.
type handlerAck struct {
	m   jetstream.Msg
	now bool
	// replay: handed back by a job reset, its records counted once already
	replay bool
}

// replayOf says whether ack is of a message a job reset handed back.
func replayOf(ack acker) bool {
	h, ok := ack.(*handlerAck)
	return ok && h.replay
}

func (h *handlerAck) Ack() error { return h.m.Ack() }

func (c *Collector) onDurable(m jetstream.Msg) {
	_, kind, _, err := wire.ParseSubject(m.Subject())
	h := &handlerAck{m: m}
	md, mdErr := m.Metadata()
	if mdErr == nil && md.NumDelivered > 1 {
		c.durable.replayMu.Lock()
		if c.durable.replays[md.Sequence.Stream] {
			delete(c.durable.replays, md.Sequence.Stream)
			h.replay = true
		}
		c.durable.replayMu.Unlock()
	}
	switch {
	case err != nil:
		c.reject("subject:invalid", 1)
		h.now = true
	case kind == "steps":
		c.handleSteps(m.Subject(), m.Data(), h)
	case kind == "partial" && c.cfg.Role == "aggregator":
		c.handlePartials(m.Subject(), m.Data(), h)
	case kind == "partial":
		h.now = true // the all role aggregates the records themselves
	case kind == "gpu":
		c.handleGPU(m.Subject(), m.Data(), h)
	case kind == "events":
		c.handleEvent(m.Subject(), m.Data(), h)
	default:
		c.handleMeta(m.Subject(), m.Data(), h)
	}
	if h.now {
		m.Ack() // network I/O: after the handler, outside the lock
	}
	if mdErr == nil {
		for {
			cur := c.durable.handled.Load()
			if md.Sequence.Stream <= cur || c.durable.handled.CompareAndSwap(cur, md.Sequence.Stream) {
				break
			}
		}
	}
}

// loadDiskKeys reads the keys of the rank_steps and cluster_steps parts
// that may hold data of messages still in the stream: the stream keeps only
// unacknowledged messages (it is a work queue), so any part finalised before
// its oldest message arrived holds acknowledged data alone and is skipped.
func (c *Collector) loadDiskKeys(ctx context.Context) error {
	info, err := c.streamInfo(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 {
		return nil
	}
	cutoff := info.State.FirstTime.Add(-time.Minute) // file times and the server's clock may differ a little
	entries, err := os.ReadDir(c.cfg.OutDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("collector: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || !tps.ValidJobID(e.Name()) {
			continue
		}
		d, n, err := c.diskKeysOf(e.Name(), cutoff)
		if err != nil {
			return err
		}
		if n > 0 {
			t := tally{now: time.Now()}
			if j := c.lockJob(e.Name(), &t); j != nil {
				j.disk = d
				j.mu.Unlock()
			}
			c.apply(&t)
			c.cfg.Logger.Info("durable restart: keys of recent parts loaded", "job", e.Name(), "parts", n,
				"closed_steps", len(d.closed), "steps_with_rank_rows", len(d.ranks), "unacknowledged_messages", info.State.Msgs)
		}
	}
	return nil
}

// diskKeysOf reads the step and rank keys of a job's rank_steps and
// cluster_steps parts finalised at or after cutoff; n is how many parts.
func (c *Collector) diskKeysOf(job string, cutoff time.Time) (d *diskKeys, n int, err error) {
	dir := filepath.Join(c.cfg.OutDir, job)
	d = &diskKeys{closed: map[stepKey]bool{}, ranks: map[stepKey]map[int64]bool{}}
	for _, table := range []string{trace.ClusterSteps, trace.RankSteps} {
		files, _ := trace.PartFiles(filepath.Join(dir, table))
		for _, f := range files {
			if fi, err := os.Stat(f); err != nil || fi.ModTime().Before(cutoff) {
				continue
			}
			n++
			var err error
			if table == trace.ClusterSteps {
				err = readKeys(f, func(r *tps.ClusterStep) { d.closed[stepKey{r.Attempt, r.Step}] = true })
			} else {
				err = readKeys(f, func(r *tps.StepRecord) { d.markRank(stepKey{r.Attempt, r.Step}, r.Rank) })
			}
			if trace.IsUnreadable(err) {
				c.quarantine(f, err)
				continue
			}
			if err != nil {
				return nil, 0, err
			}
		}
	}
	return d, n, nil
}

// readKeys reads a part and hands each row to fn.
func readKeys[T any](path string, fn func(*T)) error {
	rows, err := trace.ReadFile[T](path)
	if err != nil {
		return err
	}
	for i := range rows {
		fn(&rows[i])
	}
	return nil
}

// nakker is an acknowledgement that can also ask for redelivery.
type nakker interface{ NakWithDelay(time.Duration) error }

func (h *handlerAck) NakWithDelay(d time.Duration) error { return h.m.NakWithDelay(d) }

// redeliverAfter is how long a message whose data could not be written
// waits before the stream hands it back (a variable for tests).
var redeliverAfter = 2 * time.Second

// resetJob restarts a job whose part could not be finalised (a full
// disk): as a collector restart would, but for this job alone. Its
// messages not acknowledged are handed back by the stream (negative
// acknowledgement), and a fresh job, knowing what the parts now on disk
// hold, aggregates and writes them again. Keeping the old job would lose
// them: its dedupe windows took their redelivered records for duplicates
// or late ones, acknowledged without their rows in Parquet. The caller
// holds no lock.
func (c *Collector) resetJob(j *job) {
	j.mu.Lock()
	if j.evicted {
		j.mu.Unlock()
		return
	}
	j.evicted = true // handlers wait for the fresh job (lockJob)
	items, redo := j.unacked, j.redo
	// The steps it closed (and counted) whose rows its messages fed:
	// closed again by the fresh job, not counted again.
	reclose := map[stepKey]bool{}
	for k := range j.reclose {
		reclose[k] = true
	}
	for _, it := range items {
		for _, k := range it.steps {
			if _, closed := j.closed.seen[k]; closed || j.closed.forgotten(k) {
				reclose[k] = true
			}
		}
	}
	j.unacked, j.pending, j.rankBuf = nil, nil, nil
	j.release()
	j.mu.Unlock()
	c.n.writeErrors.Add(j.writerErrors())
	_ = j.closeWriters() // what it holds of other tables is finalised if it can be
	cutoff := time.Now().Add(-24 * time.Hour)
	if info, err := c.streamInfo(context.Background()); err == nil && info.State.Msgs > 0 {
		cutoff = info.State.FirstTime.Add(-time.Minute)
	}
	d, _, err := c.diskKeysOf(j.id, cutoff)
	if err != nil {
		c.cfg.Logger.Error("durable: cannot read the job's parts after a failed write; its messages stay in the stream until a restart", "job", j.id, "err", err)
		d = &diskKeys{closed: map[stepKey]bool{}, ranks: map[stepKey]map[int64]bool{}}
	}
	nj := newJob(c, j.id)
	nj.disk = d
	// Steps to aggregate again: those of the messages handed back now, and
	// those an earlier reset handed back whose messages have not come
	// again yet (a second failure before the redelivery).
	nj.redo, nj.reclose = map[stepKey]bool{}, map[stepKey]bool{}
	for k := range reclose {
		if !d.closed[k] {
			nj.reclose[k] = true
		}
	}
	for k := range redo {
		if !d.closed[k] {
			nj.redo[k] = true
		}
	}
	for _, it := range items {
		for _, k := range it.steps {
			if !d.closed[k] {
				nj.redo[k] = true
			}
		}
	}
	c.mu.Lock()
	if c.jobs[j.id] == j {
		c.jobs[j.id] = nj
	} else {
		c.jobs[j.id] = nj // evicted meanwhile (cannot be: it held messages); take its place
	}
	c.mu.Unlock()
	c.n.resets.Add(1)
	c.durable.replayMu.Lock()
	for _, it := range items {
		if h, ok := it.ack.(*handlerAck); ok {
			if md, err := h.m.Metadata(); err == nil {
				c.durable.replays[md.Sequence.Stream] = true
			}
		}
	}
	c.durable.replayMu.Unlock()
	for _, it := range items {
		if n, ok := it.ack.(nakker); ok {
			n.NakWithDelay(redeliverAfter)
		}
	}
	c.cfg.Logger.Warn("durable: a part of the job could not be written; its unacknowledged messages are redelivered and written again", "job", j.id, "messages", len(items))
}

// lastRotation is when the last checkpoint started.
func (d *durableState) lastRotation() time.Time { return time.Unix(0, d.lastRot.Load()) }

// checkpoint finalises every job's parts and acknowledges the messages whose
// data they now hold. The caller holds no lock: the rotations are queued
// under each job's lock (after every write they must cover), awaited and
// acknowledged outside it, so ingest never waits for the disk or the
// network. Messages of a job whose write failed stay unacknowledged: they
// wait in the stream. A job whose messages a checkpoint holds is not
// evicted until they are settled.
func (c *Collector) checkpoint(now time.Time) {
	if !c.durable.checkpointing.CompareAndSwap(false, true) {
		return // one at a time; the caller tries again later
	}
	defer c.durable.checkpointing.Store(false)
	c.durable.lastRot.Store(now.UnixNano())
	type rotation struct {
		j       *job
		replies [4]chan error
		written map[stepKey]bool
		items   []ackItem // these messages' rows were all queued before the rotations
		failed  bool
	}
	var rots []rotation
	for _, j := range c.jobList() {
		t := tally{now: now}
		j.mu.Lock()
		if j.evicted {
			j.mu.Unlock()
			continue
		}
		j.writeRows(false, &t)
		j.flushRanks()
		r := rotation{j: j, written: j.written, items: j.unacked}
		if j.ranks == nil {
			r.failed = true
		} else {
			r.replies = [4]chan error{j.ranks.rotateAsync(), j.cluster.rotateAsync(), j.events.rotateAsync(), j.gpus.rotateAsync()}
		}
		j.written, j.unacked, j.checkpointing = map[stepKey]bool{}, nil, true
		j.settle(&t)
		j.mu.Unlock()
		c.apply(&t)
		rots = append(rots, r)
	}
	for _, r := range rots {
		if !r.failed {
			for i, err := range [4]error{r.j.ranks.settle(r.replies[0]), r.j.cluster.settle(r.replies[1]),
				r.j.events.settle(r.replies[2]), r.j.gpus.settle(r.replies[3])} {
				if err != nil {
					c.n.writeErrors.Add(1)
					c.cfg.Logger.Error("durable: part not finalised; its messages stay in the stream", "job", r.j.id, "table", i, "err", err)
					r.failed = true
				}
			}
		}
		if r.failed && r.j.ranks != nil {
			r.j.mu.Lock()
			r.j.unacked = append(r.items, r.j.unacked...)
			r.j.checkpointing = false
			r.j.mu.Unlock()
			c.resetJob(r.j)
			continue
		}
		var kept []ackItem
		for _, it := range r.items {
			settled := !r.failed
			for _, k := range it.steps {
				if !r.written[k] {
					settled = false
					break
				}
			}
			if settled {
				it.ack.Ack() // network I/O: outside every lock
			} else {
				kept = append(kept, it)
			}
		}
		r.j.mu.Lock()
		r.j.unacked = append(kept, r.j.unacked...)
		r.j.checkpointing = false
		r.j.mu.Unlock()
	}
}

// unackedMessages counts the messages waiting for a checkpoint.
func (c *Collector) unackedMessages() int {
	n := 0
	for _, j := range c.jobList() {
		j.mu.Lock()
		n += len(j.unacked)
		j.mu.Unlock()
	}
	return n
}

// syncDurable waits until every message in the stream when it was called
// (of the collector's consumer) has been handled. A rank writer, whose
// consumer is shared, waits until the pool has handled and acknowledged
// everything, checkpointing its own part as it waits.
func (c *Collector) syncDurable(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last uint64
	switch c.cfg.Role {
	case "rank-writer":
		return c.syncShared(ctx, timeout)
	case "aggregator":
		// The consumer is this collector's alone: once it has nothing
		// left to deliver, the last message it delivered is the target.
		for {
			ci, err := c.durable.consumerNow().Info(ctx)
			if err != nil {
				return fmt.Errorf("collector: consumer info: %w", err)
			}
			if ci.NumPending == 0 {
				last = ci.Delivered.Stream
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("collector: %d messages still to deliver after %v", ci.NumPending, timeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	default:
		info, err := c.streamInfo(ctx)
		if err != nil {
			return err
		}
		last = info.State.LastSeq
	}
	for c.durable.handled.Load() < last {
		if ctx.Err() != nil {
			return fmt.Errorf("collector: stream messages up to %d not handled after %v (at %d)", last, timeout, c.durable.handled.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil // handled is advanced after a message's handler returns
}

// syncShared is syncDurable for a consumer shared by a pool of collectors.
func (c *Collector) syncShared(ctx context.Context, timeout time.Duration) error {
	for {
		if c.unackedMessages() > 0 {
			c.checkpoint(time.Now())
		}
		ci, err := c.durable.consumerNow().Info(ctx)
		if err != nil {
			return fmt.Errorf("collector: consumer info: %w", err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("collector: %d messages to deliver and %d to acknowledge after %v", ci.NumPending, ci.NumAckPending, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// closeDurable stops consuming, writes what is ready, and acknowledges what
// is in Parquet. Steps still open stay open: their messages are not
// acknowledged, and the next collector aggregates them from the stream.
func (c *Collector) closeDurable() error {
	close(c.durable.stopWatch)
	<-c.durable.watchDone
	c.durable.consume.Stop()
	<-c.durable.consume.Closed()
	c.stopCaptures()
	close(c.done)
	c.wg.Wait()
	now := time.Now()
	var err error
	for _, j := range c.jobList() {
		t := tally{now: now}
		j.mu.Lock()
		j.writeRows(true, &t)
		if j.ranks == nil {
			err = fmt.Errorf("collector: job %s: trace folders could not be created", j.id)
		}
		j.settle(&t)
		j.mu.Unlock()
		c.apply(&t)
	}
	c.checkpoint(now)
	if left := c.unackedMessages(); left > 0 {
		c.cfg.Logger.Info("durable: messages left for the next collector", "messages", left)
	}
	// the writers hold nothing since the checkpoint: stop their goroutines
	c.closeJobs(c.allJobs())
	c.nc.Close()
	return err
}

func (c *Collector) streamInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	st, err := c.durable.js.Stream(ctx, StreamName)
	if err != nil {
		return nil, fmt.Errorf("collector: stream: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("collector: stream info: %w", err)
	}
	return info, nil
}

// quarantine renames a part that is not readable Parquet out of the way
// (readers skip the new name) and says so, instead of failing start-up.
func (c *Collector) quarantine(path string, err error) {
	to := path + ".unreadable"
	if rerr := os.Rename(path, to); rerr != nil {
		to = path
	}
	c.n.quarantined.Add(1)
	c.cfg.Logger.Warn("unreadable part set aside", "part", to, "err", err)
}
