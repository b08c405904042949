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
// filter subjects (those of the role's handler table; the all role takes
// every subject and acknowledges what it does not need, such as node
// partials, so that nothing stays in the work queue), and how long a
// message may wait for its acknowledgement before the stream hands it to
// another reader.
func (d *durableSource) durableConsumer() jetstream.ConsumerConfig {
	c := d.c
	cc := jetstream.ConsumerConfig{Durable: ConsumerName, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour,
		MaxAckPending: 1 << 20, DeliverPolicy: jetstream.DeliverAllPolicy}
	if c.cfg.Role == RoleAll {
		return cc
	}
	for _, r := range c.table {
		cc.FilterSubjects = append(cc.FilterSubjects, r.subject)
	}
	slices.Sort(cc.FilterSubjects)
	cc.Durable = AggregatorConsumer
	if c.cfg.Role.pooled() {
		// Shared: not reset by a writer starting, so a writer that dies
		// leaves its unacknowledged messages to the others after AckWait.
		// Writers acknowledge at every checkpoint (PartAge).
		cc.Durable = RankWriterConsumer
		cc.AckWait = max(5*c.cfg.Writer.PartAge, 30*time.Second)
	}
	return cc
}

type acker interface{ Ack() error }

type durableSource struct {
	c  *Collector
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

// start creates (or updates) the stream and the durable consumer,
// loads the keys of unacknowledged parts, starts consuming, and watches
// the stream: one deleted (by anyone holding a credential that may) is
// created again with its consumer, so agents publishing to it stop
// retrying and nothing after the deletion is lost.
func (d *durableSource) start() error {
	c := d.c
	js, err := jetstream.New(c.nc)
	if err != nil {
		return fmt.Errorf("collector: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d.js, d.stopWatch, d.watchDone, d.replays = js, make(chan struct{}), make(chan struct{}), map[uint64]bool{}
	if err := d.ensureStream(ctx); err != nil {
		return err
	}
	// The stream is a work queue: acknowledged messages leave it, so it
	// holds exactly what no collector has secured in Parquet. A consumer
	// left by a collector that died still holds its messages as pending
	// acknowledgements until they time out; deleting it hands them all to
	// the new consumer at once. (One durable collector per stream.)
	if !c.cfg.Role.pooled() {
		if err := js.DeleteConsumer(ctx, StreamName, d.durableConsumer().Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("collector: reset consumer: %w", err)
		}
	}
	d.lastRot.Store(time.Now().UnixNano())
	if err := d.loadDiskKeys(ctx); err != nil {
		return err
	}
	if err := d.startConsumer(ctx); err != nil {
		return err
	}
	go d.watchStream()
	return nil
}

// ensureStream creates the stream, or updates it only if its limits
// differ: several collectors of a role start at once, and a stream update
// racing a consumer creation is a data race inside nats-server (seen under
// -race in TestDurableRankWriterSurvivesKill9).
func (d *durableSource) ensureStream(ctx context.Context) error {
	c := d.c
	js := d.js
	want := d.streamWant()
	st, err := js.Stream(ctx, StreamName)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		_, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			err = nil // another collector created it meanwhile
		}
	case err == nil:
		if streamDrift(st.CachedInfo().Config, want) != "" {
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

// streamWant is the stream's configuration.
func (d *durableSource) streamWant() jetstream.StreamConfig {
	c := d.c
	return jetstream.StreamConfig{
		Name: StreamName, Subjects: []string{wire.Prefix + ".>"}, Storage: jetstream.FileStorage,
		Retention: jetstream.WorkQueuePolicy, MaxAge: c.cfg.StreamMaxAge, MaxBytes: c.cfg.StreamMaxBytes, Discard: jetstream.DiscardOld,
		Replicas: max(c.cfg.StreamReplicas, 1), MaxMsgs: -1, MaxMsgSize: -1, MaxMsgsPerSubject: -1, MaxConsumers: -1,
	}
}

// streamDrift names what of the stream's configuration is not what the
// collector set ("" when nothing): anyone holding a credential that may
// update streams can change it in place (its subjects, so records no
// longer land in it; its limits, so it keeps nothing; seal it), which
// the watch puts back.
func streamDrift(have, want jetstream.StreamConfig) string {
	var d []string
	check := func(name string, differs bool) {
		if differs {
			d = append(d, name)
		}
	}
	check("subjects", !slices.Equal(have.Subjects, want.Subjects))
	check("retention", have.Retention != want.Retention)
	check("max_age", have.MaxAge != want.MaxAge)
	check("max_bytes", have.MaxBytes != want.MaxBytes)
	check("discard", have.Discard != want.Discard)
	check("replicas", have.Replicas != want.Replicas)
	check("max_msgs", have.MaxMsgs > 0)
	check("max_msg_size", have.MaxMsgSize > 0)
	check("max_msgs_per_subject", have.MaxMsgsPerSubject > 0)
	check("max_consumers", have.MaxConsumers > 0)
	check("sealed", have.Sealed)
	check("deny_delete", have.DenyDelete)
	check("deny_purge", have.DenyPurge)
	check("no_ack", have.NoAck)
	return strings.Join(d, ", ")
}

// startConsumer creates the role's consumer (or takes the existing one)
// and starts consuming from it.
func (d *durableSource) startConsumer(ctx context.Context) error {
	cfg := d.durableConsumer()
	cons, err := d.js.CreateOrUpdateConsumer(ctx, StreamName, cfg)
	if err != nil {
		return fmt.Errorf("collector: create consumer %s (a work-queue stream takes one all-role collector, or an aggregator and rank writers, not both): %w", cfg.Durable, err)
	}
	cc, err := cons.Consume(d.receive, jetstream.PullMaxMessages(4096))
	if err != nil {
		return fmt.Errorf("collector: consume: %w", err)
	}
	d.mu.Lock()
	d.consumer, d.consume = cons, cc
	d.mu.Unlock()
	return nil
}

// watchStream creates the stream and the consumer again when they have
// been deleted. It runs until stopWatch is closed (closeDurable).
func (d *durableSource) watchStream() {
	c := d.c
	defer close(d.watchDone)
	every := c.cfg.StreamCheck
	if every <= 0 {
		every = 5 * time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-d.stopWatch:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := d.js.Stream(ctx, StreamName)
		streamGone := errors.Is(err, jetstream.ErrStreamNotFound)
		if err == nil {
			// changed in place: put its configuration back
			if drift := streamDrift(st.CachedInfo().Config, d.streamWant()); drift != "" {
				if _, uerr := d.js.UpdateStream(ctx, d.streamWant()); uerr != nil {
					c.cfg.Logger.Error("durable: the stream's configuration was changed ("+drift+") and cannot be put back; trying again", "err", uerr)
				} else {
					c.n.streamRecreated.Add(1)
					c.cfg.Logger.Warn("durable: the stream's configuration was changed in place (" + drift + ", by a client allowed to: see docs/security.md) and is put back")
				}
			}
		}
		consumerGone := false
		if err == nil {
			var cons jetstream.Consumer
			cons, err = d.js.Consumer(ctx, StreamName, d.durableConsumer().Durable)
			consumerGone = errors.Is(err, jetstream.ErrConsumerNotFound)
			if err == nil {
				consumerGone = d.restoreConsumer(ctx, cons)
			}
		}
		if streamGone || consumerGone {
			what := "consumer " + d.durableConsumer().Durable
			if streamGone {
				what = "stream " + StreamName
			}
			d.mu.Lock()
			old := d.consume
			d.mu.Unlock()
			old.Stop()
			select { // its handler calls end before the new consumer's begin
			case <-old.Closed():
			case <-ctx.Done():
			}
			if err := d.ensureStream(ctx); err != nil {
				c.cfg.Logger.Error("durable: the "+what+" was deleted and cannot be created again; trying again", "err", err)
			} else if err := d.startConsumer(ctx); err != nil {
				c.cfg.Logger.Error("durable: the "+what+" was deleted; its consumer cannot be created again; trying again", "err", err)
			} else {
				c.n.streamRecreated.Add(1)
				lost := "messages it held and no checkpoint had acknowledged are lost, rows already handled are still written"
				if !streamGone {
					lost = "the stream's unacknowledged messages come to it again"
				}
				c.cfg.Logger.Warn("durable: the " + what + " was deleted or changed (by a client allowed to: see docs/security.md) and is created again; " + lost)
			}
		}
		cancel()
	}
}

// restoreConsumer deletes the consumer where a client changed its
// configuration in place (a filter that takes no records' subjects, a max
// ack pending of 1: 0 or 32 of 80 records came until the collector
// restarted) and reports it gone, to be made again and consumed afresh.
// Updating it back in place is not enough: the server does not rewind a
// consumer whose filter changes, so records stored meanwhile were stepped
// over, and the consumption's pull requests may no longer match what the
// server holds (a CI run waited 10 s for a record; not reproduced here).
// The stream is a work queue: what was not acknowledged is still in it,
// and comes to the new consumer from the first message.
func (d *durableSource) restoreConsumer(ctx context.Context, cons jetstream.Consumer) (gone bool) {
	c := d.c
	want := d.durableConsumer()
	info := cons.CachedInfo()
	if info == nil {
		return false
	}
	drift := consumerDrift(info.Config, want)
	if drift == "" {
		return false
	}
	if err := d.js.DeleteConsumer(ctx, StreamName, want.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		c.cfg.Logger.Error("durable: the consumer's configuration was changed ("+drift+") and the consumer cannot be deleted to make it again; trying again", "err", err)
		return false
	}
	c.cfg.Logger.Warn("durable: the consumer " + want.Durable + "'s configuration was changed in place (" + drift + ", by a client allowed to: see docs/security.md); it is made again")
	return true
}

// filtersOf is a consumer's filter subjects, sorted.
func filtersOf(c jetstream.ConsumerConfig) []string {
	f := slices.Clone(c.FilterSubjects)
	if c.FilterSubject != "" {
		f = append(f, c.FilterSubject)
	}
	slices.Sort(f)
	return f
}

// consumerDrift names what of a consumer's configuration differs from
// what the collector made ("" when nothing does).
func consumerDrift(have, want jetstream.ConsumerConfig) string {
	var d []string
	check := func(name string, differs bool) {
		if differs {
			d = append(d, name)
		}
	}
	check("filter_subjects", !slices.Equal(filtersOf(have), filtersOf(want)))
	check("ack_policy", have.AckPolicy != want.AckPolicy)
	check("ack_wait", have.AckWait != want.AckWait)
	check("max_ack_pending", have.MaxAckPending != want.MaxAckPending)
	check("max_deliver", have.MaxDeliver > 0 && have.MaxDeliver != want.MaxDeliver)
	return strings.Join(d, ", ")
}

// consumerNow is the consumer consumed now (watchStream may replace it).
func (d *durableSource) consumerNow() jetstream.Consumer {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.consumer
}

// handlerAck is a message's acknowledgement as handlers see it: Ack
// acknowledges (checkpoints call it, outside the lock); a handler that
// finds nothing to keep asks for it with ackNow, which only marks it, and
// receive acknowledges after the handler has released the lock.
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

// receive is the consumer's callback: ingest, then the acknowledgement of
// a message with nothing to keep, outside every lock.
func (d *durableSource) receive(m jetstream.Msg) {
	c := d.c
	h := &handlerAck{m: m}
	md, mdErr := m.Metadata()
	if mdErr == nil && md.NumDelivered > 1 {
		d.replayMu.Lock()
		if d.replays[md.Sequence.Stream] {
			delete(d.replays, md.Sequence.Stream)
			h.replay = true
		}
		d.replayMu.Unlock()
	}
	c.ingest(m.Subject(), m.Data(), h)
	if h.now {
		m.Ack() // network I/O: after the handler, outside the lock
	}
	if mdErr == nil {
		for {
			cur := d.handled.Load()
			if md.Sequence.Stream <= cur || d.handled.CompareAndSwap(cur, md.Sequence.Stream) {
				break
			}
		}
	}
}

// loadDiskKeys reads the keys of the rank_steps and cluster_steps parts
// that may hold data of messages still in the stream: the stream keeps only
// unacknowledged messages (it is a work queue), so any part finalised before
// its oldest message arrived holds acknowledged data alone and is skipped.
func (d *durableSource) loadDiskKeys(ctx context.Context) error {
	c := d.c
	info, err := d.streamInfo(ctx)
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
		dk, n, err := d.diskKeysOf(e.Name(), cutoff)
		if err != nil {
			return err
		}
		if n > 0 {
			t := tally{now: time.Now()}
			c.withJob(e.Name(), &t, func(j *job) { j.st.led.disk = dk })
			c.cfg.Logger.Info("durable restart: keys of recent parts loaded", "job", e.Name(), "parts", n,
				"closed_steps", len(dk.closed), "steps_with_rank_rows", len(dk.ranks), "unacknowledged_messages", info.State.Msgs)
		}
	}
	return nil
}

// diskKeysOf reads the step and rank keys of a job's rank_steps and
// cluster_steps parts finalised at or after cutoff; n is how many parts.
func (d *durableSource) diskKeysOf(job string, cutoff time.Time) (dk *diskKeys, n int, err error) {
	c := d.c
	dir := filepath.Join(c.cfg.OutDir, job)
	dk = &diskKeys{closed: map[stepKey]bool{}, ranks: map[stepKey]map[int64]bool{}}
	for _, table := range []string{trace.ClusterSteps, trace.RankSteps} {
		files, _ := trace.PartFiles(filepath.Join(dir, table))
		for _, f := range files {
			if fi, err := os.Stat(f); err != nil || fi.ModTime().Before(cutoff) {
				continue
			}
			n++
			var err error
			if table == trace.ClusterSteps {
				err = readKeys(f, func(r *tps.ClusterStep) { dk.closed[stepKey{r.Attempt, r.Step}] = true })
			} else {
				err = readKeys(f, func(r *tps.StepRecord) { dk.markRank(stepKey{r.Attempt, r.Step}, r.Rank) })
			}
			if trace.IsUnreadable(err) {
				d.quarantine(f, err)
				continue
			}
			if err != nil {
				return nil, 0, err
			}
		}
	}
	return dk, n, nil
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
func (d *durableSource) resetJob(j *job) {
	c := d.c
	j.mu.Lock()
	if j.evicted {
		j.mu.Unlock()
		return
	}
	j.evicted = true // handlers wait for the fresh job (lockJob)
	items, redo := j.st.led.unacked, j.st.led.redo
	reclose := j.st.closedAndCounted(items)
	j.st.led.unacked, j.st.pending, j.rankBuf = nil, nil, nil
	j.st.release()
	j.mu.Unlock()
	c.n.writeErrors.Add(j.out.writerErrors())
	_ = j.out.closeWriters() // what it holds of other tables is finalised if it can be
	cutoff := time.Now().Add(-24 * time.Hour)
	if info, err := d.streamInfo(context.Background()); err == nil && info.State.Msgs > 0 {
		cutoff = info.State.FirstTime.Add(-time.Minute)
	}
	dk, _, err := d.diskKeysOf(j.st.id, cutoff)
	if err != nil {
		c.cfg.Logger.Error("durable: cannot read the job's parts after a failed write; its messages stay in the stream until a restart", "job", j.st.id, "err", err)
		dk = &diskKeys{closed: map[stepKey]bool{}, ranks: map[stepKey]map[int64]bool{}}
	}
	nj := newJob(c, j.st.id)
	nj.st.led.disk = dk
	// Steps to aggregate again: those of the messages handed back now, and
	// those an earlier reset handed back whose messages have not come
	// again yet (a second failure before the redelivery).
	nj.st.led.redo, nj.st.led.reclose = map[stepKey]bool{}, map[stepKey]bool{}
	for k := range reclose {
		if !dk.closed[k] {
			nj.st.led.reclose[k] = true
		}
	}
	for k := range redo {
		if !dk.closed[k] {
			nj.st.led.redo[k] = true
		}
	}
	for _, it := range items {
		for _, k := range it.steps {
			if !dk.closed[k] {
				nj.st.led.redo[k] = true
			}
		}
	}
	c.mu.Lock()
	if c.jobs[j.st.id] == j {
		c.jobs[j.st.id] = nj
	} else {
		c.jobs[j.st.id] = nj // evicted meanwhile (cannot be: it held messages); take its place
	}
	c.mu.Unlock()
	c.n.resets.Add(1)
	d.replayMu.Lock()
	for _, it := range items {
		if h, ok := it.ack.(*handlerAck); ok {
			if md, err := h.m.Metadata(); err == nil {
				d.replays[md.Sequence.Stream] = true
			}
		}
	}
	d.replayMu.Unlock()
	for _, it := range items {
		if n, ok := it.ack.(nakker); ok {
			n.NakWithDelay(redeliverAfter)
		}
	}
	c.cfg.Logger.Warn("durable: a part of the job could not be written; its unacknowledged messages are redelivered and written again", "job", j.st.id, "messages", len(items))
}

// lastRotation is when the last checkpoint started.
func (d *durableSource) lastRotation() time.Time { return time.Unix(0, d.lastRot.Load()) }

// checkpoint finalises every job's parts and acknowledges the messages whose
// data they now hold. The caller holds no lock: the rotations are queued
// under each job's lock (after every write they must cover), awaited and
// acknowledged outside it, so ingest never waits for the disk or the
// network. Messages of a job whose write failed stay unacknowledged: they
// wait in the stream. A job whose messages a checkpoint holds is not
// evicted until they are settled.
func (d *durableSource) checkpoint(now time.Time) {
	c := d.c
	if !d.checkpointing.CompareAndSwap(false, true) {
		return // one at a time; the caller tries again later
	}
	defer d.checkpointing.Store(false)
	d.lastRot.Store(now.UnixNano())
	type rotation struct {
		j       *job
		replies []chan error
		written map[stepKey]bool
		items   []ackItem // these messages' rows were all queued before the rotations
		failed  bool
	}
	var rots []rotation
	for _, j := range c.jobList() {
		t := tally{now: now}
		c.onJob(j, &t, func(j *job) {
			if j.evicted {
				return
			}
			j.writeRows(false, &t)
			j.flushRanks(true)
			led := j.st.led
			r := rotation{j: j, written: led.written, items: led.unacked, failed: len(j.out.tables) == 0, replies: j.out.rotateAsync()}
			led.written, led.unacked, led.checkpointing = map[stepKey]bool{}, nil, true
			rots = append(rots, r)
		})
	}
	for _, r := range rots {
		if !r.failed {
			if err := r.j.out.settle(r.replies); err != nil {
				c.n.writeErrors.Add(1)
				c.cfg.Logger.Error("durable: part not finalised; its messages stay in the stream", "job", r.j.st.id, "err", err)
				r.failed = true
			}
		}
		if r.failed && len(r.j.out.tables) > 0 {
			r.j.mu.Lock()
			r.j.st.led.unacked = append(r.items, r.j.st.led.unacked...)
			r.j.st.led.checkpointing = false
			r.j.mu.Unlock()
			d.resetJob(r.j)
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
		r.j.st.led.unacked = append(kept, r.j.st.led.unacked...)
		r.j.st.led.checkpointing = false
		r.j.mu.Unlock()
	}
}

// unackedMessages counts the messages waiting for a checkpoint.
func (d *durableSource) unackedMessages() int {
	c := d.c
	n := 0
	for _, j := range c.jobList() {
		j.mu.Lock()
		n += j.st.led.waiting()
		j.mu.Unlock()
	}
	return n
}

// sync waits until every message in the stream when it was called (of
// the collector's consumer) has been handled. A rank writer, whose
// consumer is shared, waits until the pool has handled and acknowledged
// everything, checkpointing its own part as it waits.
//
// The target is read from the stream, not from the consumer: the server
// acknowledges a publish before it tells the stream's consumers of the
// message (nats-server signals them from a queue), so a consumer's
// num_pending can read 0 for a message already stored.
func (d *durableSource) sync(timeout time.Duration) error {
	c := d.c
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	last, err := d.lastOfConsumer(ctx)
	if err != nil {
		return err
	}
	if c.cfg.Role.pooled() {
		return d.syncShared(ctx, timeout, last)
	}
	for d.handled.Load() < last {
		if ctx.Err() != nil {
			return fmt.Errorf("collector: stream messages up to %d not handled after %v (at %d)", last, timeout, d.handled.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil // handled is advanced after a message's handler returns
}

// lastOfConsumer is the stream sequence of the last message stored now
// that the collector's consumer takes (0 when none is): the stream's last
// for a consumer of everything, else the latest over its filters.
func (d *durableSource) lastOfConsumer(ctx context.Context) (uint64, error) {
	filters := filtersOf(d.durableConsumer())
	if len(filters) == 0 {
		info, err := d.streamInfo(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.LastSeq, nil
	}
	st, err := d.js.Stream(ctx, StreamName)
	if err != nil {
		return 0, fmt.Errorf("collector: stream: %w", err)
	}
	var last uint64
	for _, subj := range filters {
		m, err := st.GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("collector: the stream's last message on %s: %w", subj, err)
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}

// syncShared is sync for a consumer shared by a pool of collectors: the
// pool has been delivered the stream's last message it takes and has
// acknowledged everything.
func (d *durableSource) syncShared(ctx context.Context, timeout time.Duration, last uint64) error {
	for {
		if d.unackedMessages() > 0 {
			d.checkpoint(time.Now())
		}
		ci, err := d.consumerNow().Info(ctx)
		if err != nil {
			return fmt.Errorf("collector: consumer info: %w", err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Delivered.Stream >= last {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("collector: %d messages to deliver and %d to acknowledge after %v (delivered up to %d of %d)",
				ci.NumPending, ci.NumAckPending, timeout, ci.Delivered.Stream, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *durableSource) ledger() *ledger { return newLedger() }

// tick checkpoints once a part age has passed since the last checkpoint.
func (d *durableSource) tick(now time.Time) {
	if now.Sub(d.lastRotation()) >= d.c.cfg.Writer.PartAge {
		d.checkpoint(now) // waits for the disk: the caller holds no lock
	}
}

// stop stops watching the stream and consuming; the consumer's Closed
// says its handler calls have returned.
func (d *durableSource) stop() {
	close(d.stopWatch)
	<-d.watchDone
	d.mu.Lock()
	cc := d.consume
	d.mu.Unlock()
	cc.Stop()
	<-cc.Closed()
}

// finish writes what is ready and acknowledges what is in Parquet. Steps
// still open stay open: their messages are not acknowledged, and the next
// collector aggregates them from the stream.
func (d *durableSource) finish() error {
	c := d.c
	now := time.Now()
	var err error
	for _, j := range c.jobList() {
		t := tally{now: now}
		c.onJob(j, &t, func(j *job) {
			j.writeRows(true, &t)
			if j.out.ranks == nil {
				err = fmt.Errorf("collector: job %s: trace folders could not be created", j.st.id)
			}
		})
	}
	d.checkpoint(now)
	if left := d.unackedMessages(); left > 0 {
		c.cfg.Logger.Info("durable: messages left for the next collector", "messages", left)
	}
	// the writers hold nothing since the checkpoint: stop their goroutines
	c.closeJobs(c.allJobs())
	return err
}

func (d *durableSource) streamInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	st, err := d.js.Stream(ctx, StreamName)
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
func (d *durableSource) quarantine(path string, err error) {
	c := d.c
	to := path + ".unreadable"
	if rerr := os.Rename(path, to); rerr != nil {
		to = path
	}
	c.n.quarantined.Add(1)
	c.cfg.Logger.Warn("unreadable part set aside", "part", to, "err", err)
}
