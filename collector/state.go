package collector

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// The state side of a job: what its records add up to. jobState holds the
// open steps, the dedupe windows, the GPU series rows wait for and the
// live figures; its methods take no lock, log nothing and touch neither
// the disk nor the network. What a call did (counts, rejections, warnings,
// the steps it closed) goes into the tally the caller passes; the rows
// ready to be written are taken with readyRows. The collector (job.go,
// collector.go) owns the lock around it and the I/O after it; state_test.go
// tests it alone.

type stepKey struct{ attempt, step int64 }

type openStep struct {
	acc   *tps.StepAccumulator
	first time.Time
	cost  int64 // bytes charged to the memory budget for acc
}

// stepBits remembers which ranks of the last limit steps were seen, so a
// repeated record is still recognised: the ranks that reported recently
// closed steps (all and aggregator roles) or whose rows a rank writer
// wrote. Memory: one bit per rank per step.
type stepBits struct {
	seen  map[stepKey][]uint64
	order []stepKey
	limit int
	floor map[int64]int64 // per attempt, the highest step forgotten
}

func newStepBits(limit int) stepBits {
	return stepBits{seen: map[stepKey][]uint64{}, limit: limit, floor: map[int64]int64{}}
}

// add remembers k's bits, forgetting the oldest step past the limit; it
// returns the bytes of the bits it forgot.
func (c *stepBits) add(k stepKey, bits []uint64) (freed int64) {
	if len(c.order) >= c.limit {
		old := c.order[0]
		freed = 8 * int64(len(c.seen[old]))
		delete(c.seen, old)
		if f, ok := c.floor[old.attempt]; !ok || old.step > f {
			c.floor[old.attempt] = old.step
		}
		c.order = c.order[1:]
	}
	c.seen[k] = bits
	c.order = append(c.order, k)
	return freed
}

// forgotten reports whether k is at or below a step already forgotten.
func (c *stepBits) forgotten(k stepKey) bool {
	f, ok := c.floor[k.attempt]
	return ok && k.step <= f
}

const liveWindow = 512

// rankSeenSteps is how many steps a rank writer remembers the rows of.
const rankSeenSteps = 256

// maxStepJump is how far past a job's current steps a new step may be:
// resuming from a checkpoint skips a few thousand, never ten million.
const maxStepJump = 10_000_000

// ewmaAlpha weighs the last step in a rank's recent compute time.
const ewmaAlpha = 0.1

// tally is what state calls did, for the caller to count and say once the
// job's lock is released. One tally serves one message (or one tick).
type tally struct {
	now                       time.Time
	records, duplicates, late int64
	stepsClosed, incomplete   int64
	// replay: the message was handed back by a job reset, its records
	// already counted once; they count as redelivered
	replay      bool
	reclosed    int64 // steps closed again after a reset
	rejected    map[string]int64
	warnings    []warning
	closed      []tps.ClusterStep // steps closed, in order (for OnStep)
	metaChanged bool              // the parts' metadata snapshot is stale
	liveChanged bool              // the figures /metrics reads changed
	captures    []captureAsk      // automatic captures to start
	// backpressure is the job a message handler locked: once the lock is
	// released, apply waits for its writers to catch up (waitWriters)
	backpressure *job
}

// warning is a log line the state asks for: key rate-limits it (empty:
// always said, once per occurrence).
type warning struct {
	key, msg string
	args     []any
}

func (t *tally) reject(reason string, n int64) {
	if t.rejected == nil {
		t.rejected = map[string]int64{}
	}
	t.rejected[reason] += n
}

func (t *tally) warn(key, msg string, args ...any) {
	if len(t.warnings) < 16 {
		t.warnings = append(t.warnings, warning{key, msg, args})
	}
}

// invalid counts a validation error by its code.
func (t *tally) invalid(err error) {
	var fe *tps.FieldError
	code := "record:invalid"
	if errors.As(err, &fe) {
		code = fe.Code()
	}
	t.reject(code, 1)
	t.warn(code, "record rejected", "err", err)
}

// limits are the collector's settings the state needs.
type limits struct {
	maxOpenSteps int
	gpuJoinWait  time.Duration
	metaWait     time.Duration // full steps of a job without metadata are held this long (Config.MetaWait)
	quietAfter   time.Duration
	mem          *memBudget // shared by the collector's jobs; nil: unbounded
}

// memBudget bounds the memory the declared world sizes of all jobs may
// claim: per open step an accumulator sized to the world
// (tps.StepAccumulatorBytes) and the rank bits kept once it closes, per
// job 128 KiB (jobBaseBytes) and 32 bytes a rank (node names, compute
// averages, slow-since steps). A record whose step
// would go past it is rejected (world_size:memory) instead of the
// collector being killed for memory: one record claiming the largest
// world costs ~67 MB of open step. It is an atomic, not a lock.
type memBudget struct {
	used atomic.Int64
	max  int64
}

// take charges n bytes, or reports false (and charges nothing) when they
// do not fit.
func (m *memBudget) take(n int64) bool {
	if m == nil || m.max <= 0 {
		return true
	}
	if m.used.Add(n) > m.max {
		m.used.Add(-n)
		return false
	}
	return true
}

func (m *memBudget) give(n int64) {
	if m != nil && m.max > 0 && n != 0 {
		m.used.Add(-n)
	}
}

// jobBaseBytes is what a job that sent a record costs before its tables'
// Parquet writers are made (they are made per table once it has 512 rows
// or a part rotates: trace.PartWriter stages the first rows): measured at
// 116 KiB with its step closed (TestOneRecordJobMemory).
const jobBaseBytes = 128 << 10

// jobBytesPerRank is what a job holds per rank of its world besides its
// open steps: a node name (a string header), an own-time average and the
// step its current run of slow own times began. (The data-wait and work
// averages and the last slow step, 24 bytes more, are not counted.)
const jobBytesPerRank = 32

type pendingRow struct {
	row      tps.ClusterStep
	closedAt time.Time
}

type jobState struct {
	id      string
	lim     limits
	meta    tps.RunMeta
	hasMeta bool
	gpuSeen string // GPU name NVML reported on this job's nodes

	world        int64
	worldAttempt int64 // the newest attempt seen: only a newer one may change world
	cfg          tps.AccumulatorConfig
	cfgErr       string

	held int64 // bytes this job has charged to lim.mem

	own ownLive // what measuring costs the ranks, and the fullest rank's memory (the live page)

	open        map[stepKey]*openStep
	closed      stepBits          // ranks of the recently closed steps
	rowsSeen    stepBits          // rank-writer role: rows written recently
	maxClosed   map[int64]int64   // highest closed step per attempt
	rankNode    []string          // by rank, world entries
	lastKey     stepKey           // the step of the last record added...
	lastOpen    *openStep         // ...while it is open
	recent      []tps.ClusterStep // ring of the last liveWindow cluster steps
	history     runHistory        // the whole run, bucketed, for the live page
	recentNext  int
	newSinceLog bool

	clocks  clockEstimator // nodes' clock offsets from rank 0's node
	prevKey stepKey        // the newest step closed...
	prevEnd int64          // ...and where it ended, on the reference clock (0: none yet)

	// rank windows (tps.RankWindow): each rank's current one, and those
	// complete waiting to be written
	rankWins  map[int64]*tps.RankWindow
	winsReady []tps.RankWindow

	// led is the durable source's bookkeeping (ledger.go); nil in core mode
	led *ledger

	finalising                  // when its parts are finalised (finalise.go)
	gpuJoin                     // its GPUs' samples, joined to its rows (gpujoin.go)
	runTotals                   // what the live page and metrics show
	stragglerTrack              // stragglers and their episodes (straggling.go)
	counted        countedFLOPs // FLOPs PyTorch counted on sampled steps (counted.go)
	rolloutWindow               // generation latencies of the last steps (rollouts.go)
}

// newJobState is a job with nothing heard yet: meta (may be nil) is the
// metadata every job starts from; led is the durable source's ledger (nil
// in core mode).
func newJobState(id string, lim limits, meta *tps.RunMeta, led *ledger) jobState {
	s := jobState{id: id, lim: lim, open: map[stepKey]*openStep{}, maxClosed: map[int64]int64{}, closed: newStepBits(64), led: led,
		gpuJoin: gpuJoin{gpuSeries: map[string]*gpuSeries{}, nodes: map[string]struct{}{}, gpuNodes: map[string]struct{}{}}}
	if meta != nil {
		s.meta = *meta
		s.meta.Job = id
		s.hasMeta = true
	}
	return s
}

// writeOnce reports whether r's rank row is to be written (rank-writer
// role): not already written by this collector within the window. A step
// older than the window is written unchecked (and counted late).
func (s *jobState) writeOnce(r *tps.StepRecord, t *tally) bool {
	w := &s.rowsSeen
	if w.seen == nil {
		*w = newStepBits(rankSeenSteps)
	}
	k := stepKey{r.Attempt, r.Step}
	if s.led.rankOnDisk(k, r.Rank) { // written before a restart (durable mode)
		t.duplicates++
		return false
	}
	bits, ok := w.seen[k]
	if !ok {
		if w.forgotten(k) {
			t.late++
			return true
		}
		cost := 8 * ((r.WorldSize + 63) / 64)
		if !s.lim.mem.take(cost) {
			t.reject("world_size:memory", 1)
			t.warn("memory", "record rejected: the collector's memory budget for declared world sizes is spent", "job", s.id, "world_size", r.WorldSize)
			return false
		}
		s.held += cost
		bits = make([]uint64, (r.WorldSize+63)/64)
		freed := w.add(k, bits)
		s.lim.mem.give(freed)
		s.held -= freed
	}
	i, b := r.Rank/64, uint64(1)<<(r.Rank%64)
	if i < int64(len(bits)) { // else the world size changed within a step: cannot check
		if bits[i]&b != 0 {
			t.duplicates++
			return false
		}
		bits[i] |= b
	}
	t.records++
	return true
}

// slowRanks returns the ranks with their score (the fastest rank's recent
// own time, compute, data wait and host work, over theirs: what the episodes score
// too), slowest first (ties by rank), at most n. It keeps the n
// slowest in a small sorted slice instead of scoring and sorting every
// rank through maps (70 ms at 131,072 ranks; see BenchmarkLiveScores).
func (s *jobState) slowRanks(n int) []tps.RankScore {
	_, best := s.bestOwn()
	if best == 0 || n <= 0 {
		return nil
	}
	top := make([]tps.RankScore, 0, min(n, len(s.ownEWMA))+1)
	after := func(a tps.RankScore, score float64, rank int64) bool { // a sorts after (score, rank)
		return a.Score > score || (a.Score == score && a.Rank > rank)
	}
	for r, v := range s.ownEWMA {
		if v <= 0 {
			continue
		}
		score, rank := best/v, int64(r)
		if len(top) == n && !after(top[n-1], score, rank) {
			continue
		}
		i := len(top)
		for i > 0 && after(top[i-1], score, rank) {
			i--
		}
		top = slices.Insert(top, i, tps.RankScore{Rank: rank, MedianComputeNs: v, Score: score})
		if len(top) > n {
			top = top[:n]
		}
	}
	for i := range top {
		if top[i].Rank < int64(len(s.rankNode)) {
			top[i].Node = s.rankNode[top[i].Rank]
		}
		top[i].Straggler = top[i].Score < tps.StragglerThreshold && s.keepsSlow(int(top[i].Rank))
	}
	return top
}

// stragglers counts ranks below the straggler threshold that keep slow
// (keepsSlow); none once the job ended (its episodes are closed: the
// gauge stayed up and the alert fired for a job that was over).
func (s *jobState) stragglers() int {
	if s.ended {
		return 0
	}
	_, best := s.bestOwn()
	n := 0
	for r, v := range s.ownEWMA {
		if v > 0 && best/v < tps.StragglerThreshold && s.keepsSlow(r) {
			n++
		}
	}
	return n
}

func (s *jobState) lastRow() tps.ClusterStep {
	if len(s.recent) < liveWindow {
		return s.recent[len(s.recent)-1]
	}
	return s.recent[(s.recentNext+liveWindow-1)%liveWindow]
}

// fileMetadata is stored in every part: the run metadata as known when the
// part is finalised.
func (s *jobState) fileMetadata() map[string]string {
	m := s.meta
	m.Job = s.id
	if m.GPU == "" {
		m.GPU = s.gpuSeen
	}
	b, _ := json.Marshal(m)
	out := map[string]string{trace.MetaRun: string(b)}
	if s.cfg.PeakFLOPSPerGPU > 0 {
		out["tpsprof.peak_tflops"] = fmt.Sprint(s.cfg.PeakFLOPSPerGPU / 1e12)
	}
	if s.cfg.FLOPsPerToken > 0 {
		out["tpsprof.flops_per_token"] = fmt.Sprint(s.cfg.FLOPsPerToken)
	}
	out["tpsprof.topology"] = s.cfg.Topology.String()
	if offs := s.clocks.offsets(); offs != nil {
		b, _ := json.Marshal(offs)
		out[trace.MetaClockOffsets] = string(b)
	}
	return out
}

func (s *jobState) setMeta(m tps.RunMeta, t *tally) {
	s.meta.Merge(m)
	s.hasMeta = true
	if s.world > 0 {
		s.configure(s.world, t)
		s.reconfigureOpen(t)
	}
	s.closeHeld(t)
	t.metaChanged = true
}

// configure derives the aggregation settings for world; steps opened from
// now on use them.
func (s *jobState) configure(world int64, t *tally) {
	if world != s.world || s.rankNode == nil {
		s.rankNode = make([]string, world)
	}
	s.world = world
	cfg, err := s.meta.AccumulatorConfig(int(world), s.gpuSeen)
	s.cfg = cfg
	t.metaChanged, t.liveChanged = true, true
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != s.cfgErr && msg != "" {
		t.warn("", "MFU not computed for this job", "job", s.id, "why", msg)
	}
	s.cfgErr = msg
	if tp := s.meta.Topology; tp != (tps.Topology{}) && tp.Validate(int(world)) != nil {
		t.warn("", "the job's topology does not match its world size; assuming pure data parallelism", "job", s.id, "topology", tp.String(), "world_size", world)
	}
}

// window is the attempt's current step: the highest closed step, else the
// lowest open one; ok is false before any.
func (s *jobState) window(attempt int64) (int64, bool) {
	if hi, ok := s.maxClosed[attempt]; ok {
		return hi, true
	}
	lo, ok := int64(0), false
	for k := range s.open {
		if k.attempt == attempt && (!ok || k.step < lo) {
			lo, ok = k.step, true
		}
	}
	return lo, ok
}

// admission is where a record or partial of step k goes.
type admission int

const (
	admitOpen      admission = iota // into an open step (opened now if new)
	admitLate                       // after its step closed: not aggregated
	admitStale                      // after its step closed too long ago to check for duplicates
	admitDuplicate                  // already counted
	admitRejected                   // refused; the reason is in the tally
)

// admit finds or opens the step of a record or partial: the one path both
// take. ranks are the ranks it carries (one for a record); n counts them.
// A step closed recently is checked rank by rank (rerun says a closed
// step's rank came again); one closed before a restart (durable mode) or
// long ago is late; a step far ahead of the job's window is rejected.
func (s *jobState) admit(k stepKey, world int64, ranks func(yield func(int64) bool), n int64, t *tally) (*openStep, admission) {
	st := s.lastOpen
	if st == nil || s.lastKey != k {
		st = s.open[k]
	}
	if st != nil {
		return st, admitOpen
	}
	if bits, closed := s.closed.seen[k]; closed {
		if n == 1 {
			for r := range ranks {
				i, b := r/64, uint64(1)<<(r%64)
				if i < int64(len(bits)) && bits[i]&b != 0 {
					t.duplicates++
					return nil, admitDuplicate
				}
				if i < int64(len(bits)) {
					bits[i] |= b
				}
			}
		}
		t.late += n
		return nil, admitLate
	}
	if s.led.closedOnDisk(k) { // closed before a restart (durable mode)
		if n != 1 { // a partial: its row was written before the restart
			t.duplicates += n
			return nil, admitDuplicate
		}
		for r := range ranks {
			if s.led.rankOnDisk(k, r) {
				t.duplicates++
				return nil, admitDuplicate
			}
			s.led.markOnDisk(k, r)
		}
		t.late++
		return nil, admitLate
	}
	redo := s.led.redoes(k) // redelivered after a failed write: its row is not on disk
	// Below the highest closed step, a step the closed window does not
	// hold was either closed and forgotten (at or below the window's
	// floor: late, unchecked) or never closed: its records arrive out of
	// order (a NATS server failing over reorders publishes) and it opens.
	if hi, ok := s.maxClosed[k.attempt]; ok && k.step <= hi && !redo && s.closed.forgotten(k) {
		t.late += n // closed too long ago to check for duplicates
		return nil, admitStale
	}
	if ref, ok := s.window(k.attempt); ok && k.step > ref+maxStepJump && !redo {
		// One absurd step number would move the window: every later step
		// would count as late (2^62 from one rank stopped a job's cluster
		// rows).
		t.reject("step:jump", n)
		t.warn("step-jump", "record far ahead of the job's steps rejected", "job", s.id, "step", k.step, "current", ref)
		return nil, admitRejected
	}
	// The accumulator, and the rank bits kept once the step closes.
	cost, bits := tps.StepAccumulatorBytes(world, s.cfg.Topology), 8*((world+63)/64)
	if !s.lim.mem.take(cost + bits) {
		t.reject("world_size:memory", n)
		t.warn("memory", "step not opened: the collector's memory budget for declared world sizes is spent (open steps hold memory for Grace)",
			"job", s.id, "world_size", world, "step_bytes", cost+bits)
		return nil, admitRejected
	}
	acc, err := tps.NewStepAccumulator(s.id, k.attempt, k.step, world, s.cfg)
	if err != nil {
		s.lim.mem.give(cost + bits)
		t.invalid(err)
		return nil, admitRejected
	}
	s.held += cost + bits
	st = &openStep{acc: acc, first: t.now, cost: cost}
	s.open[k] = st
	if len(s.open) > s.lim.maxOpenSteps {
		s.closeOldest(t)
	}
	return st, admitOpen
}

// setWorld adopts a record's world size: only a new attempt may change it
// (strict; partials, grouped by agents per attempt, are not checked)
// (a stray record with another size, an older attempt's late one, used to
// close every open step, written with missing ranks and wrong tokens). A
// relaunch at another size closes what the old size left open.
func (s *jobState) setWorld(world, attempt int64, strict bool, t *tally) bool {
	if s.world == world {
		return true
	}
	if strict && s.world != 0 && attempt <= s.worldAttempt {
		t.reject("world_size:mismatch", 1)
		t.warn("world", "record with another world size than its attempt's rejected", "job", s.id, "attempt", attempt, "world_size", world, "attempt_world_size", s.world)
		return false
	}
	base := int64(0)
	if s.world == 0 {
		base = jobBaseBytes // the job's first world size: its own cost too
	}
	if !s.lim.mem.take(base + jobBytesPerRank*world) {
		t.reject("world_size:memory", 1)
		t.warn("memory", "record rejected: the collector's memory budget for declared world sizes is spent", "job", s.id, "world_size", world)
		return false
	}
	s.lim.mem.give(jobBytesPerRank * s.world)
	s.held += base + jobBytesPerRank*(world-s.world)
	if s.world != 0 && len(s.open) > 0 {
		s.closeAll(t)
	}
	s.configure(world, t)
	return true
}

// release gives back everything the job charged to the memory budget;
// the job is being closed.
func (s *jobState) release() {
	s.lim.mem.give(s.held)
	s.held = 0
}

// add folds a record in. It returns the step's key, whether the record
// went into an open step (whose cluster row is still to be written), and
// whether its rank row is to be written (not a duplicate, not invalid, not
// already on disk from before a restart).
func (s *jobState) add(r *tps.StepRecord, t *tally) (k stepKey, open, keep bool) {
	s.lastActive, s.unfinalised = t.now, true
	if s.firstRecord.IsZero() {
		s.firstRecord = t.now
	}
	if s.ended {
		s.ended, t.liveChanged = false, true
	}
	k = stepKey{r.Attempt, r.Step}
	if !s.setWorld(r.WorldSize, r.Attempt, true, t) {
		return k, false, false
	}
	s.worldAttempt = max(s.worldAttempt, r.Attempt)
	if r.Node != "" && s.rankNode[r.Rank] != r.Node {
		s.rankNode[r.Rank] = r.Node // Validate bounds Rank by WorldSize == len(rankNode)
		if _, ok := s.nodes[r.Node]; !ok && len(s.nodes) < 1<<16 {
			s.nodes[r.Node] = struct{}{}
		}
	}
	// Records of a step arrive together: admit remembers the last open
	// step rather than hashing its key for every record.
	// Whether its row is on disk is asked before admit: admitting a late
	// record of a step closed before a restart marks its row as written
	// (it is written now, once), and asking after would drop it.
	onDisk := s.led.rankOnDisk(k, r.Rank)
	st, how := s.admit(k, r.WorldSize, func(yield func(int64) bool) { yield(r.Rank) }, 1, t)
	switch how {
	case admitLate:
		return k, false, !onDisk
	case admitStale:
		s.warnRerun(r, t)
		return k, false, !onDisk
	case admitDuplicate:
		s.warnRerun(r, t)
		return k, false, false
	case admitRejected:
		return k, false, false
	}
	s.lastKey, s.lastOpen = k, st
	added, err := st.acc.Add(r)
	if err != nil {
		t.invalid(err)
		return k, false, false
	}
	if !added {
		t.duplicates++
		return k, false, false
	}
	t.records++
	s.observeRank(r, s.world)
	// a step a profiler traced (the agent attached its trace's figures)
	// or PyTorch's FLOP counter counted ran slower: its cost is apart
	_, counted := s.counted.samples[[2]int64{r.Attempt, r.Step}]
	s.own.observe(r, r.TraceComputeNs > 0 || r.TraceCommNs > 0 || counted)
	if st.acc.Full() {
		s.closeFull(k, st, t)
	}
	// A rank row already written before a restart is aggregated again
	// (its step's cluster row was not written) but not written twice.
	return k, true, !onDisk
}

// addPartial merges a node partial (aggregator role). It returns the step's
// key and whether the partial went into an open step.
func (s *jobState) addPartial(p *tps.Partial, t *tally) (stepKey, bool) {
	s.lastActive, s.unfinalised = t.now, true
	if s.firstRecord.IsZero() {
		s.firstRecord = t.now
	}
	k := stepKey{p.Attempt, p.Step}
	n := int64(len(p.Ranks))
	if s.world != p.WorldSize {
		// Partials come from agents, which group a node's records of one
		// attempt: a new size is a relaunch.
		if !s.setWorld(p.WorldSize, p.Attempt, false, t) {
			return k, false
		}
	}
	st, how := s.admit(k, p.WorldSize, func(yield func(int64) bool) {
		for _, r := range p.Ranks {
			if !yield(r) {
				return
			}
		}
	}, n, t)
	if how != admitOpen {
		return k, false
	}
	added, err := st.acc.AddPartial(p)
	switch {
	case errors.Is(err, tps.ErrPartialOverlap):
		t.reject("partial:overlap", 1)
		return k, false
	case err != nil:
		t.invalid(err)
		return k, false
	case !added:
		t.duplicates += n
		return k, false
	}
	t.records += n
	// The nodes the GPU join waits for (gpuCovered), as records name them.
	for _, x := range p.Nodes {
		if _, ok := s.nodes[x.Node]; !ok && x.Node != "" && len(s.nodes) < 1<<16 {
			s.nodes[x.Node] = struct{}{}
		}
	}
	if st.acc.Full() {
		s.closeFull(k, st, t)
	}
	return k, true
}

// holding: the job has no run metadata yet and its first record is less
// than metaWait old, so full steps wait for it (Config.MetaWait).
func (s *jobState) holding(now time.Time) bool {
	return !s.hasMeta && s.lim.metaWait > 0 && now.Sub(s.firstRecord) < s.lim.metaWait
}

// closeFull closes a step every rank reported, unless it is held for the
// job's metadata.
func (s *jobState) closeFull(k stepKey, st *openStep, t *tally) {
	if s.holding(t.now) {
		s.heldFull = true
		return
	}
	s.closeStep(k, st, t)
}

// closeHeld closes the full steps held for metadata once it arrived or
// the wait is over.
func (s *jobState) closeHeld(t *tally) {
	if !s.heldFull || s.holding(t.now) {
		return
	}
	s.heldFull = false
	for _, k := range slices.SortedFunc(maps.Keys(s.open), cmpKey) {
		if st := s.open[k]; st.acc.Full() {
			s.closeStep(k, st, t)
		}
	}
}

// reconfigureOpen applies a configuration learnt while steps were open
// (run metadata after the first records) to them, and adjusts what they
// charge to the memory budget.
func (s *jobState) reconfigureOpen(t *tally) {
	for k, st := range s.open {
		if !st.acc.Reconfigure(s.cfg) {
			t.warn("regroup", "a step opened before the job's metadata could not be regrouped under its topology", "job", s.id, "step", k.step)
			continue
		}
		cost := tps.StepAccumulatorBytes(s.world, s.cfg.Topology)
		if d := st.cost - cost; d > 0 {
			s.lim.mem.give(d)
			s.held -= d
			st.cost = cost
		}
	}
}

func (s *jobState) closeStep(k stepKey, st *openStep, t *tally) {
	delete(s.open, k)
	again := s.led.closing(k)
	if s.lastOpen == st {
		s.lastOpen = nil
	}
	if s.clocks.observe(st.acc.NodeSpans()) {
		t.metaChanged, t.liveChanged = true, true
	}
	ctx := tps.StepContext{ClockOffsetNs: s.clocks.offsetFunc()}
	if s.prevEnd != 0 && s.prevKey.attempt == k.attempt && s.prevKey.step == k.step-1 {
		ctx.PrevEndUnixNs = s.prevEnd
	}
	row := st.acc.ResultIn(ctx)
	if row.ClockHeldOut {
		t.warn("clock:held_out", "a rank's step began more than two step durations before the step ended: its clock is off; held out of the step's start (the nodes' clock offsets correct whole nodes: docs/report.md, \"Clocks\")",
			"job", s.id, "attempt", k.attempt, "step", k.step)
	}
	if s.prevEnd == 0 || cmpKey(k, s.prevKey) > 0 {
		s.prevKey, s.prevEnd = k, row.EndUnixNs
	}
	t.closed = append(t.closed, row)
	s.lim.mem.give(st.cost)
	freed := s.closed.add(k, st.acc.SeenBits())
	s.lim.mem.give(freed)
	s.held -= st.cost + freed
	if hi, ok := s.maxClosed[k.attempt]; !ok || k.step > hi {
		s.maxClosed[k.attempt] = k.step
	}
	if again {
		t.reclosed++
	} else {
		t.stepsClosed++
		if !row.Complete() {
			t.incomplete++
		}
	}
	t.liveChanged = true
	s.closedSteps++
	s.lastClosedAt = t.now
	s.mostRanks = max(s.mostRanks, row.RanksReported)
	s.tokens += row.Tokens
	if row.StepTimeNs > 0 {
		s.stepSeconds += float64(row.StepTimeNs) / 1e9
	}
	if !row.Complete() {
		s.incompleteSteps++
	}
	s.history.add(row)
	s.nextRolloutStep()
	if len(s.recent) < liveWindow {
		s.recent = append(s.recent, row)
	} else {
		s.recent[s.recentNext] = row
		s.recentNext = (s.recentNext + 1) % liveWindow
	}
	s.countedRow(&row)
	s.newSinceLog, s.newSinceEpisodes = true, true
	s.pending = append(s.pending, pendingRow{row: row, closedAt: t.now})
}

func (s *jobState) closeOldest(t *tally) {
	keys := slices.SortedFunc(maps.Keys(s.open), cmpKey)
	s.closeStep(keys[0], s.open[keys[0]], t)
}

func cmpKey(a, b stepKey) int {
	if a.attempt != b.attempt {
		return int(a.attempt - b.attempt)
	}
	switch {
	case a.step < b.step:
		return -1
	case a.step > b.step:
		return 1
	}
	return 0
}

// closeExpired closes the steps open for grace or longer.
func (s *jobState) closeExpired(grace time.Duration, t *tally) {
	if len(s.open) == 0 {
		return
	}
	for _, k := range slices.SortedFunc(maps.Keys(s.open), cmpKey) {
		if st := s.open[k]; t.now.Sub(st.first) >= grace {
			s.closeStep(k, st, t)
		}
	}
}

func (s *jobState) closeAll(t *tally) {
	for _, k := range slices.SortedFunc(maps.Keys(s.open), cmpKey) {
		s.closeStep(k, s.open[k], t)
	}
}

// addGPU folds GPU samples into the series closed rows join.
func (s *jobState) addGPU(samples []tps.GPUSample, t *tally) {
	if len(samples) == 0 {
		return
	}
	for i := range samples {
		key := samples[i].Node + "/" + samples[i].UUID
		g, ok := s.gpuSeries[key]
		if !ok {
			if len(s.gpuSeries) >= 1<<16 {
				continue
			}
			g = &gpuSeries{node: samples[i].Node}
			s.gpuSeries[key] = g
			s.gpuNodes[samples[i].Node] = struct{}{}
		}
		g.add(&samples[i])
	}
	if s.gpuSeen == "" && samples[0].Name != "" {
		s.gpuSeen = samples[0].Name
		t.metaChanged = true
		if s.world > 0 {
			s.configure(s.world, t) // the GPU model may make MFU computable
		}
	}
}

// readyRows takes the closed cluster rows whose GPU data has arrived (or
// that waited GPUJoinWait, or all with force), GPU figures joined, in
// closing order.
func (s *jobState) readyRows(force bool, t *tally) []tps.ClusterStep {
	n := 0
	for n < len(s.pending) {
		p := &s.pending[n]
		if !force && len(s.gpuSeries) > 0 && !s.gpuCovered(p.row.EndUnixNs) && t.now.Sub(p.closedAt) < s.lim.gpuJoinWait {
			break // rows are written in closing order
		}
		if len(s.gpuSeries) > 0 {
			s.joinGPU(&p.row)
			t.liveChanged = true
		}
		n++
	}
	if n == 0 {
		return nil
	}
	rows := make([]tps.ClusterStep, n)
	for i := range rows {
		rows[i] = s.pending[i].row
		s.led.wrote(stepKey{rows[i].Attempt, rows[i].Step})
	}
	s.pending = s.pending[n:]
	return rows
}

// finaliseDue: rows since the last finalisation, no open step, and an
// attempt that ended or a job quiet for QuietAfter.
func (s *jobState) finaliseDue(now time.Time) bool {
	return s.unfinalised && len(s.open) == 0 && (s.attemptEnded || now.Sub(s.lastActive) >= s.lim.quietAfter)
}

func (s *jobState) recentSteps() []tps.ClusterStep {
	out := make([]tps.ClusterStep, 0, len(s.recent))
	out = append(out, s.recent[s.recentNext:]...)
	out = append(out, s.recent[:s.recentNext]...)
	return out
}

// liveLine is the job's line for the live output, or "" when no step
// closed since the last one.
func (s *jobState) liveLine(now time.Time) string {
	if !s.newSinceLog || len(s.recent) == 0 {
		return ""
	}
	s.newSinceLog = false
	last := s.lastRow()
	f := s.liveFigures(LiveWindowSteps)
	tpsText := "TPS n/a (no tokens counted)"
	if f.tpsUnknown == "" {
		tpsText = fmt.Sprintf("TPS %s (%s/GPU)", tps.SI(f.tps), tps.SI(f.perGPU))
	}
	mfuText := "MFU n/a"
	if f.mfu != nil {
		mfuText = fmt.Sprintf("MFU %.1f%%", 100**f.mfu)
		if f.counted {
			mfuText += " (counted FLOPs)"
		}
	} else if f.counted && f.hfu != nil {
		mfuText = fmt.Sprintf("HFU %.1f%% (counted FLOPs, recomputed)", 100**f.hfu)
	} else if last.MFUUnknown != "" {
		mfuText = "MFU n/a (" + shortReason(last.MFUUnknown) + ")"
	} else if f.tpsUnknown != "" {
		mfuText = "MFU n/a (no tokens counted)"
	}
	node := ""
	if last.SlowestRank >= 0 && last.SlowestRank < int64(len(s.rankNode)) {
		node = s.rankNode[last.SlowestRank]
	}
	if node != "" {
		node = " on " + node
	}
	waiting := fmt.Sprintf("waiting for rank %d%s %.1f%%", last.SlowestRank, node, 100*f.shares.WaitingForPeers)
	if last.WorldSize <= 1 {
		waiting = "one rank: no peer to wait for" // ("waiting for rank 0 0.0%")
	}
	return fmt.Sprintf("[%s] %s step %d | %s | %s | comm %.1f%% | %s | ranks %d/%d",
		now.Format("15:04:05"), s.id, last.Step, tpsText,
		mfuText, 100*f.shares.ExposedComm, waiting, last.RanksReported, last.WorldSize)
}

// warnRerun says, rate-limited, why records of closed steps arrive: most
// often a second run under the job id and attempt of an earlier one.
// They are counted (duplicate or late), never merged into the closed rows.
func (s *jobState) warnRerun(r *tps.StepRecord, t *tally) {
	t.warn("rerun", "records for steps this job and attempt closed already: a second run under the same job id? "+
		"tpsprof launch gives a new launch the next attempt; or use a new job id",
		"job", s.id, "attempt", r.Attempt, "step", r.Step, "rank", r.Rank)
}

// shortReason is the first clause of a reason, for one-line displays.
func shortReason(s string) string {
	if i := strings.IndexAny(s, ":;("); i > 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// sumWindow folds a rank row that is written into its rank's window (the
// rank_windows table). A row of a later window closes the rank's current
// one (ready to write); a row of an earlier one (late) is written as a
// window row of its own, which readers merge with the first.
func (s *jobState) sumWindow(r *tps.StepRecord) {
	if s.rankWins == nil {
		s.rankWins = map[int64]*tps.RankWindow{}
	}
	win := tps.WindowOf(r.Step)
	w := s.rankWins[r.Rank]
	switch {
	case w == nil:
	case w.Attempt == r.Attempt && w.Window == win:
		w.Add(r)
		return
	case r.Attempt < w.Attempt || (r.Attempt == w.Attempt && win < w.Window):
		var late tps.RankWindow
		late.Add(r)
		late.Seal()
		s.winsReady = append(s.winsReady, late)
		return
	default:
		w.Seal()
		s.winsReady = append(s.winsReady, *w)
	}
	w = &tps.RankWindow{}
	w.Add(r)
	s.rankWins[r.Rank] = w
}

// takeWindows hands out the rank windows ready to write; with all, the
// ranks' current ones too (a part is finalised: what it covers is written
// whole; rows that come later for the same window make a second row).
func (s *jobState) takeWindows(all bool) []tps.RankWindow {
	if all {
		for rank, w := range s.rankWins {
			w.Seal()
			s.winsReady = append(s.winsReady, *w)
			delete(s.rankWins, rank)
		}
	}
	out := s.winsReady
	s.winsReady = nil
	return out
}

// runTotals are a job's running totals for metrics and the live page.
type runTotals struct {
	closedSteps, incompleteSteps, tokens int64
	// duplicates are the job's records that repeated a (attempt, step,
	// rank) already taken: two processes claiming one rank, or a replay
	duplicates   int64
	stepSeconds  float64   // Σ step time of the closed steps (tpsprof_step_seconds_total)
	mostRanks    int64     // the most ranks a closed step had
	lastClosedAt time.Time // when the last step closed, on the collector's clock
}
