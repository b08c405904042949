package collector

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

type stepKey struct{ attempt, step int64 }

type openStep struct {
	acc   *tps.StepAccumulator
	first time.Time
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

// add remembers k's bits, forgetting the oldest step past the limit.
func (c *stepBits) add(k stepKey, bits []uint64) {
	if len(c.order) >= c.limit {
		old := c.order[0]
		delete(c.seen, old)
		if f, ok := c.floor[old.attempt]; !ok || old.step > f {
			c.floor[old.attempt] = old.step
		}
		c.order = c.order[1:]
	}
	c.seen[k] = bits
	c.order = append(c.order, k)
}

// forgotten reports whether k is at or below a step already forgotten.
func (c *stepBits) forgotten(k stepKey) bool {
	f, ok := c.floor[k.attempt]
	return ok && k.step <= f
}

const liveWindow = 512

// rankSeenSteps is how many steps a rank writer remembers the rows of.
const rankSeenSteps = 256

// writeOnce reports whether r's rank row is to be written: not already
// written by this collector within the window. A step older than the
// window is written unchecked (and counted late).
func (j *job) writeOnce(c *Collector, r *tps.StepRecord) bool {
	s := &j.rowsSeen
	if s.seen == nil {
		*s = newStepBits(rankSeenSteps)
	}
	k := stepKey{r.Attempt, r.Step}
	if j.disk != nil && j.disk.ranks[k][r.Rank] { // written before a restart (durable mode)
		c.stats.Duplicates++
		return false
	}
	bits, ok := s.seen[k]
	if !ok {
		if s.forgotten(k) {
			c.stats.Late++
			return true
		}
		bits = make([]uint64, (r.WorldSize+63)/64)
		s.add(k, bits)
	}
	w, b := r.Rank/64, uint64(1)<<(r.Rank%64)
	if w < int64(len(bits)) { // else the world size changed within a step: cannot check
		if bits[w]&b != 0 {
			c.stats.Duplicates++
			return false
		}
		bits[w] |= b
	}
	c.stats.Records++
	return true
}

type job struct {
	id      string
	meta    tps.RunMeta
	hasMeta bool
	gpuSeen string // GPU name NVML reported on this job's nodes

	world        int64
	worldAttempt int64 // the newest attempt seen: only a newer one may change world
	cfg          tps.AccumulatorConfig
	cfgErr       string

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
	// a step closed since straggler episodes were last tracked
	newSinceEpisodes bool

	// finalising parts when an attempt ends or the job goes quiet
	lastActive   time.Time // the last step record
	touched      time.Time // the last message of any kind (eviction)
	unfinalised  bool      // rows written since the parts were last finalised
	attemptEnded bool      // an attempt_end event since then

	sink    // the job's four tables on their writer goroutines (sink.go)
	rankBuf []tps.StepRecord

	gpuSeries map[string]*gpuSeries // node/uuid → samples
	nodes     map[string]struct{}   // nodes named by the job's records
	gpuNodes  map[string]struct{}   // nodes that sent GPU samples
	pending   []pendingRow          // closed rows waiting for GPU samples

	// durable mode
	disk    *diskKeys        // what parts not yet covered by acknowledgements hold
	written map[stepKey]bool // steps whose cluster rows were written since the last checkpoint

	// live figures for metrics and the live page
	closedSteps, incompleteSteps, tokens int64
	lastTPJ                              float64
	computeEWMA                          []float64 // per rank, ns
	openEpisodes                         map[string]*LiveEpisode
	episodes                             []LiveEpisode // closed, the last maxEpisodes
}

// ewmaAlpha weighs the last step in a rank's recent compute time.
const ewmaAlpha = 0.1

// observeCompute folds a rank's compute time into its moving average.
func (j *job) observeCompute(rank int64, ns float64) {
	if int64(len(j.computeEWMA)) != j.world {
		j.computeEWMA = make([]float64, j.world)
	}
	if rank < 0 || rank >= int64(len(j.computeEWMA)) {
		return
	}
	if e := j.computeEWMA[rank]; e == 0 {
		j.computeEWMA[rank] = ns
	} else {
		j.computeEWMA[rank] = e + ewmaAlpha*(ns-e)
	}
}

// slowRanks returns the ranks with their score (fastest recent compute /
// theirs), slowest first (ties by rank), at most n. It runs under the
// collector's lock for every scrape and live line, so it keeps the n
// slowest in a small sorted slice instead of scoring and sorting every
// rank through maps (70 ms at 131,072 ranks; see BenchmarkLiveScores).
func (j *job) slowRanks(n int) []tps.RankScore {
	best := j.bestCompute()
	if best == 0 || n <= 0 {
		return nil
	}
	top := make([]tps.RankScore, 0, min(n, len(j.computeEWMA))+1)
	after := func(a tps.RankScore, score float64, rank int64) bool { // a sorts after (score, rank)
		return a.Score > score || (a.Score == score && a.Rank > rank)
	}
	for r, v := range j.computeEWMA {
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
		if top[i].Rank < int64(len(j.rankNode)) {
			top[i].Node = j.rankNode[top[i].Rank]
		}
		top[i].Straggler = top[i].Score < tps.StragglerThreshold
	}
	return top
}

// bestCompute is the fastest recent compute time over ranks (0: none yet).
func (j *job) bestCompute() float64 {
	best := 0.0
	for _, v := range j.computeEWMA {
		if v > 0 && (best == 0 || v < best) {
			best = v
		}
	}
	return best
}

// stragglers counts ranks below the straggler threshold.
func (j *job) stragglers() int {
	best := j.bestCompute()
	n := 0
	for _, v := range j.computeEWMA {
		if v > 0 && best/v < tps.StragglerThreshold {
			n++
		}
	}
	return n
}

func (j *job) lastRow() tps.ClusterStep {
	if len(j.recent) < liveWindow {
		return j.recent[len(j.recent)-1]
	}
	return j.recent[(j.recentNext+liveWindow-1)%liveWindow]
}

func newJob(c *Collector, id string) *job {
	j := &job{id: id, open: map[stepKey]*openStep{}, maxClosed: map[int64]int64{}, gpuSeries: map[string]*gpuSeries{}, nodes: map[string]struct{}{}, gpuNodes: map[string]struct{}{},
		closed: newStepBits(64), sink: sink{job: id}}
	if c.durable != nil {
		j.written = map[stepKey]bool{}
	}
	if c.cfg.Meta != nil {
		j.meta = *c.cfg.Meta
		j.meta.Job = id
		j.hasMeta = true
	}
	opt := c.cfg.Writer
	// Writers finalise parts on their own goroutines: they read a snapshot
	// of the metadata, replaced (under the collector's lock) whenever the
	// run metadata, the GPU seen or the job's settings change.
	j.refreshMeta()
	opt.Metadata = func() map[string]string { return *j.metaSnap.Load() }
	// Creating the folders cannot fail silently: the first write reports it.
	var err error
	var rw *trace.PartWriter[tps.StepRecord]
	var cw *trace.PartWriter[tps.ClusterStep]
	var ew *trace.PartWriter[tps.Event]
	var gw *trace.PartWriter[tps.GPUSample]
	onError := func(err error) { c.cfg.Logger.Error("parquet write failed", "job", id, "err", err) }
	if rw, err = trace.NewPartWriter[tps.StepRecord](c.cfg.OutDir, id, trace.RankSteps, opt); err == nil {
		if cw, err = trace.NewPartWriter[tps.ClusterStep](c.cfg.OutDir, id, trace.ClusterSteps, opt); err == nil {
			if ew, err = trace.NewPartWriter[tps.Event](c.cfg.OutDir, id, trace.Events, opt); err == nil {
				gw, err = trace.NewPartWriter[tps.GPUSample](c.cfg.OutDir, id, trace.GPUSamples, opt)
			}
		}
	}
	if err == nil {
		j.ranks = newAsyncWriter(rw, releaseRecords, onError)
		j.cluster = newAsyncWriter(cw, nil, onError)
		j.events = newAsyncWriter(ew, nil, onError)
		j.gpus = newAsyncWriter(gw, nil, onError)
	}
	if err != nil {
		c.cfg.Logger.Error("cannot create the trace folders; nothing of this job is written", "job", id, "err", err)
		c.stats.WriteErrors++
	}
	return j
}

// refreshMeta replaces the metadata snapshot the writers store in parts.
func (j *job) refreshMeta() {
	m := j.fileMetadata()
	j.metaSnap.Store(&m)
}

// fileMetadata is stored in every part: the run metadata as known when the
// part is finalised.
func (j *job) fileMetadata() map[string]string {
	m := j.meta
	m.Job = j.id
	if m.GPU == "" {
		m.GPU = j.gpuSeen
	}
	b, _ := json.Marshal(m)
	out := map[string]string{trace.MetaRun: string(b)}
	if j.cfg.PeakFLOPSPerGPU > 0 {
		out["tpsprof.peak_tflops"] = fmt.Sprint(j.cfg.PeakFLOPSPerGPU / 1e12)
	}
	if j.cfg.FLOPsPerToken > 0 {
		out["tpsprof.flops_per_token"] = fmt.Sprint(j.cfg.FLOPsPerToken)
	}
	out["tpsprof.topology"] = j.cfg.Topology.String()
	return out
}

func (j *job) setMeta(c *Collector, m tps.RunMeta) {
	j.meta.Merge(m)
	j.hasMeta = true
	if j.world > 0 {
		j.configure(c, j.world)
	}
	j.refreshMeta()
}

// configure derives the aggregation settings for world; steps opened from
// now on use them.
func (j *job) configure(c *Collector, world int64) {
	if world != j.world || j.rankNode == nil {
		j.rankNode = make([]string, world)
	}
	j.world = world
	cfg, err := j.meta.AccumulatorConfig(int(world), j.gpuSeen)
	j.cfg = cfg
	j.refreshMeta()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg != j.cfgErr && msg != "" {
		c.cfg.Logger.Warn("MFU not computed for this job", "job", j.id, "why", msg)
	}
	j.cfgErr = msg
	if t := j.meta.Topology; t != (tps.Topology{}) && t.Validate(int(world)) != nil {
		c.cfg.Logger.Warn("the job's topology does not match its world size; assuming pure data parallelism", "job", j.id, "topology", t.String(), "world_size", world)
	}
}

// add folds a record in. It returns the step's key, whether the record
// went into an open step (whose cluster row is still to be written), and
// whether its rank row is to be written (not a duplicate, not invalid, not
// already on disk from before a restart).
// maxStepJump is how far past a job's current steps a new step may be:
// resuming from a checkpoint skips a few thousand, never ten million.
const maxStepJump = 10_000_000

// window is the attempt's current step: the highest closed step, else the
// lowest open one; ok is false before any.
func (j *job) window(attempt int64) (int64, bool) {
	if hi, ok := j.maxClosed[attempt]; ok {
		return hi, true
	}
	lo, ok := int64(0), false
	for k := range j.open {
		if k.attempt == attempt && (!ok || k.step < lo) {
			lo, ok = k.step, true
		}
	}
	return lo, ok
}

func (j *job) add(c *Collector, r *tps.StepRecord, now time.Time) (k stepKey, open, keep bool) {
	j.lastActive, j.unfinalised = now, true
	if j.world != r.WorldSize {
		if j.world != 0 && r.Attempt <= j.worldAttempt {
			// Only a new attempt may change the world size: a stray record
			// (an older attempt's late one, a misconfigured rank) used to
			// close every open step, written with missing ranks and wrong
			// tokens.
			c.rejected["world_size:mismatch"]++
			c.log.Warn("world", "record with another world size than its attempt's rejected", "job", j.id, "attempt", r.Attempt, "world_size", r.WorldSize, "attempt_world_size", j.world)
			return stepKey{r.Attempt, r.Step}, false, false
		}
		if j.world != 0 && len(j.open) > 0 {
			// A relaunch at another size: close what the old size left open.
			j.closeAll(c)
		}
		j.configure(c, r.WorldSize)
	}
	j.worldAttempt = max(j.worldAttempt, r.Attempt)
	if r.Node != "" && j.rankNode[r.Rank] != r.Node {
		j.rankNode[r.Rank] = r.Node // Validate bounds Rank by WorldSize == len(rankNode)
		if _, ok := j.nodes[r.Node]; !ok && len(j.nodes) < 1<<16 {
			j.nodes[r.Node] = struct{}{}
		}
	}
	k = stepKey{r.Attempt, r.Step}
	// Records of a step arrive together: remember the last open step
	// rather than hashing its key for every record.
	st := j.lastOpen
	if st == nil || j.lastKey != k {
		st = j.open[k]
	}
	if st == nil {
		if bits, closed := j.closed.seen[k]; closed {
			w, b := r.Rank/64, uint64(1)<<(r.Rank%64)
			if w < int64(len(bits)) && bits[w]&b != 0 {
				c.stats.Duplicates++
				j.warnRerun(c, r)
				return k, false, false
			}
			if w < int64(len(bits)) {
				bits[w] |= b
			}
			c.stats.Late++
			return k, false, true
		}
		if j.disk != nil && j.disk.closed[k] { // closed before a restart (durable mode)
			if j.disk.ranks[k][r.Rank] {
				c.stats.Duplicates++
				j.warnRerun(c, r)
				return k, false, false
			}
			j.disk.markRank(k, r.Rank)
			c.stats.Late++
			return k, false, true
		}
		if hi, ok := j.maxClosed[r.Attempt]; ok && r.Step <= hi {
			c.stats.Late++ // closed too long ago to check for duplicates
			j.warnRerun(c, r)
			return k, false, true
		}
		if ref, ok := j.window(r.Attempt); ok && r.Step > ref+maxStepJump {
			// One absurd step number would move the window: every later
			// step would count as late (2^62 from one rank stopped a job's
			// cluster rows).
			c.rejected["step:jump"]++
			c.log.Warn("step-jump", "record far ahead of the job's steps rejected", "job", j.id, "step", r.Step, "current", ref)
			return k, false, false
		}
		acc, err := tps.NewStepAccumulator(j.id, r.Attempt, r.Step, r.WorldSize, j.cfg)
		if err != nil {
			c.countInvalid(err)
			return k, false, false
		}
		st = &openStep{acc: acc, first: now}
		j.open[k] = st
		if len(j.open) > c.cfg.MaxOpenSteps {
			j.closeOldest(c)
		}
	}
	j.lastKey, j.lastOpen = k, st
	added, err := st.acc.Add(r)
	if err != nil {
		c.countInvalid(err)
		return k, false, false
	}
	if !added {
		c.stats.Duplicates++
		return k, false, false
	}
	c.stats.Records++
	j.observeCompute(r.Rank, float64(r.ComputeNs()))
	if st.acc.Full() {
		j.closeStep(c, k, st)
	}
	// A rank row already written before a restart is aggregated again
	// (its step's cluster row was not written) but not written twice.
	return k, true, j.disk == nil || !j.disk.ranks[k][r.Rank]
}

// addPartial merges a node partial (aggregator role). It returns the step's
// key and whether the partial went into an open step.
func (j *job) addPartial(c *Collector, p *tps.Partial, now time.Time) (stepKey, bool) {
	j.lastActive, j.unfinalised = now, true
	if j.world != p.WorldSize {
		if j.world != 0 && len(j.open) > 0 {
			j.closeAll(c)
		}
		j.configure(c, p.WorldSize)
	}
	k := stepKey{p.Attempt, p.Step}
	st, ok := j.open[k]
	if !ok {
		if _, closed := j.closed.seen[k]; closed {
			c.stats.Late += int64(len(p.Ranks))
			return k, false
		}
		if j.disk != nil && j.disk.closed[k] { // its row was written before a restart (durable mode)
			c.stats.Duplicates += int64(len(p.Ranks))
			return k, false
		}
		if hi, ok := j.maxClosed[p.Attempt]; ok && p.Step <= hi {
			c.stats.Late += int64(len(p.Ranks))
			return k, false
		}
		acc, err := tps.NewStepAccumulator(j.id, p.Attempt, p.Step, p.WorldSize, j.cfg)
		if err != nil {
			c.countInvalid(err)
			return k, false
		}
		st = &openStep{acc: acc, first: now}
		j.open[k] = st
		if len(j.open) > c.cfg.MaxOpenSteps {
			j.closeOldest(c)
		}
	}
	added, err := st.acc.AddPartial(p)
	switch {
	case errors.Is(err, tps.ErrPartialOverlap):
		c.rejected["partial:overlap"]++
		return k, false
	case err != nil:
		c.countInvalid(err)
		return k, false
	case !added:
		c.stats.Duplicates += int64(len(p.Ranks))
		return k, false
	}
	c.stats.Records += int64(len(p.Ranks))
	if st.acc.Full() {
		j.closeStep(c, k, st)
	}
	return k, true
}

// flushRanks hands the buffered rank rows to the job's writer goroutine.
func (j *job) flushRanks(c *Collector) {
	if len(j.rankBuf) == 0 || j.ranks == nil {
		return
	}
	j.ranks.write(j.rankBuf)
	j.rankBuf = recordBuffer()
}

func (j *job) closeStep(c *Collector, k stepKey, st *openStep) {
	delete(j.open, k)
	if j.lastOpen == st {
		j.lastOpen = nil
	}
	row := st.acc.Result()
	if c.cfg.OnStep != nil {
		c.cfg.OnStep(row)
	}
	j.closed.add(k, st.acc.SeenBits())
	if hi, ok := j.maxClosed[k.attempt]; !ok || k.step > hi {
		j.maxClosed[k.attempt] = k.step
	}
	c.stats.StepsClosed++
	j.closedSteps++
	j.tokens += row.Tokens
	if !row.Complete() {
		c.stats.Incomplete++
		j.incompleteSteps++
	}
	j.history.add(row)
	if len(j.recent) < liveWindow {
		j.recent = append(j.recent, row)
	} else {
		j.recent[j.recentNext] = row
		j.recentNext = (j.recentNext + 1) % liveWindow
	}
	j.newSinceLog, j.newSinceEpisodes = true, true
	j.pending = append(j.pending, pendingRow{row: row, closedAt: time.Now()})
	j.writeRows(c, time.Now(), false)
}

func (j *job) closeOldest(c *Collector) {
	keys := slices.SortedFunc(maps.Keys(j.open), cmpKey)
	j.closeStep(c, keys[0], j.open[keys[0]])
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

func (j *job) closeExpired(c *Collector, now time.Time) {
	if len(j.open) == 0 {
		return
	}
	for _, k := range slices.SortedFunc(maps.Keys(j.open), cmpKey) {
		if st := j.open[k]; now.Sub(st.first) >= c.cfg.Grace {
			j.closeStep(c, k, st)
		}
	}
}

func (j *job) closeAll(c *Collector) {
	for _, k := range slices.SortedFunc(maps.Keys(j.open), cmpKey) {
		j.closeStep(c, k, j.open[k])
	}
}

func (j *job) addGPU(c *Collector, s []tps.GPUSample) {
	if len(s) == 0 || j.gpus == nil {
		return
	}
	for i := range s {
		key := s[i].Node + "/" + s[i].UUID
		g, ok := j.gpuSeries[key]
		if !ok {
			if len(j.gpuSeries) >= 1<<16 {
				continue
			}
			g = &gpuSeries{}
			j.gpuSeries[key] = g
			j.gpuNodes[s[i].Node] = struct{}{}
		}
		g.add(&s[i])
	}
	if j.gpuSeen == "" && s[0].Name != "" {
		j.gpuSeen = s[0].Name
		j.refreshMeta()
		if j.world > 0 {
			j.configure(c, j.world) // the GPU model may make MFU computable
		}
	}
	j.gpus.write(s) // s is not touched again
}

// finaliseDue: rows since the last finalisation, no open step, and an
// attempt that ended or a job quiet for QuietAfter.
func (j *job) finaliseDue(c *Collector, now time.Time) bool {
	return j.unfinalised && j.ranks != nil && len(j.open) == 0 && (j.attemptEnded || now.Sub(j.lastActive) >= c.cfg.QuietAfter)
}

// finalise writes what waits (closed rows still waiting for GPU samples
// included) and finalises every open part, so readers see the whole job.
func (j *job) finalise(c *Collector, now time.Time) {
	j.flushRanks(c)
	j.writeRows(c, now, true)
	j.ranks.rotateNow()
	j.cluster.rotateNow()
	j.events.rotateNow()
	j.gpus.rotateNow()
	j.unfinalised, j.attemptEnded = false, false
}

func (j *job) rotateDue(c *Collector, now time.Time) {
	j.flushRanks(c)
	j.writeRows(c, now, false)
	if j.ranks == nil {
		return
	}
	j.ranks.rotateIfDue(now)
	j.cluster.rotateIfDue(now)
	j.events.rotateIfDue(now)
	j.gpus.rotateIfDue(now)
}

func (j *job) recentSteps() []tps.ClusterStep {
	out := make([]tps.ClusterStep, 0, len(j.recent))
	out = append(out, j.recent[j.recentNext:]...)
	out = append(out, j.recent[:j.recentNext]...)
	return out
}

func (j *job) liveLine() string {
	if !j.newSinceLog || len(j.recent) == 0 {
		return ""
	}
	j.newSinceLog = false
	steps := j.recentSteps()
	last := steps[len(steps)-1]
	// Average over the last few steps so the line does not jitter.
	n := min(len(steps), 10)
	var tpsSum, mfuSum, commSum float64
	for _, s := range steps[len(steps)-n:] {
		tpsSum += s.TPS
		mfuSum += s.MFU
		commSum += s.CommFractionMean
	}
	mfuText := "MFU n/a"
	if last.MFUUnknown != "" {
		mfuText = "MFU n/a (" + shortReason(last.MFUUnknown) + ")"
	} else if last.MFU > 0 {
		mfuText = fmt.Sprintf("MFU %.1f%%", 100*mfuSum/float64(n))
	}
	node := ""
	if last.SlowestRank >= 0 && last.SlowestRank < int64(len(j.rankNode)) {
		node = j.rankNode[last.SlowestRank]
	}
	if node != "" {
		node = " on " + node
	}
	return fmt.Sprintf("[%s] %s step %d | TPS %s (%s/GPU) | %s | comm %.1f%% | slowest rank %d%s | ranks %d/%d",
		time.Now().Format("15:04:05"), j.id, last.Step, tps.SI(tpsSum/float64(n)), tps.SI(tpsSum/float64(n)/float64(max(last.WorldSize, 1))),
		mfuText, 100*commSum/float64(n), last.SlowestRank, node, last.RanksReported, last.WorldSize)
}

// prepareClose closes the open steps and hands every row to the writers;
// the caller holds the lock and calls closeWriters after releasing it.
func (j *job) prepareClose(c *Collector) {
	j.closeAll(c)
	j.writeRows(c, time.Now(), true)
	j.flushRanks(c)
}

// warnRerun says, rate-limited, why records of closed steps arrive: most
// often a second run under the job id and attempt of an earlier one.
// They are counted (duplicate or late), never merged into the closed rows.
func (j *job) warnRerun(c *Collector, r *tps.StepRecord) {
	c.log.Warn("rerun", "records for steps this job and attempt closed already: a second run under the same job id? "+
		"tpsprof launch gives a new launch the next attempt; or use a new job id",
		"job", j.id, "attempt", r.Attempt, "step", r.Step, "rank", r.Rank)
}

// shortReason is the first clause of a reason, for one-line displays.
func shortReason(s string) string {
	if i := strings.IndexAny(s, ":;("); i > 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}
