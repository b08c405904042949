package tps

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Dist summarises a distribution of values.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

// NewDist summarises xs (which it reorders). Percentiles interpolate
// linearly between the closest ranks (the "type 7" rule of R and NumPy).
func NewDist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Dist{
		Mean: sum / float64(len(xs)),
		Min:  slices.Min(xs),
		Max:  slices.Max(xs),
		P50:  quantileOf(xs, 0.50),
		P90:  quantileOf(xs, 0.90),
		P95:  quantileOf(xs, 0.95),
		P99:  quantileOf(xs, 0.99),
	}
}

// Quantile returns the q-quantile of sorted values, interpolating linearly.
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if n == 1 {
		return sorted[0]
	}
	h := q * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// MedianMAD returns the median and the median absolute deviation of xs,
// without changing xs.
func MedianMAD(xs []float64) (median, mad float64) {
	if len(xs) == 0 {
		return math.NaN(), math.NaN()
	}
	s := slices.Clone(xs)
	median = quantileOf(s, 0.5)
	for i, x := range s {
		s[i] = math.Abs(x - median)
	}
	return median, quantileOf(s, 0.5)
}

// WindowOptions tune Summarize.
type WindowOptions struct {
	// Warmup, when ≥ 0, excludes exactly that many leading steps of each
	// attempt. When negative (AutoWarmup), the rule is: the first step of each
	// attempt, plus the leading steps after it that are slower than
	// median + max(3·MAD, 5% of the median) of the run's step times. (The
	// floor keeps a run of near-identical steps, whose MAD is about zero,
	// from calling every slightly slow early step warm-up.)
	Warmup int
	// Profiled are the (attempt, step) pairs some rank profiled (a trace
	// was taken: the profiler slows the step): they are left out of the
	// statistics, their tokens and time still in wall TPS.
	Profiled map[[2]int64]bool
	// Cut are the (attempt, step) pairs a save or an evaluation between
	// steps ran into (a rank still saving when the first started it, the
	// others waiting for it): left out of the statistics as profiled
	// steps are, the time the save's in the goodput.
	Cut map[[2]int64]bool
	// Warm, when set, is the warm-up: the (attempt, step) pairs to exclude
	// instead of applying the rule (a report of part of a run takes the
	// whole run's warm-up).
	Warm map[[2]int64]bool
	// Mask, when it has a value per step, is the warm-up mask itself, as
	// WarmupMask gave it for these steps (a caller that has it saves the
	// rule's median and MAD over every step time a second time).
	Mask []bool
	// Threshold, when above 0, is the automatic rule's step time (ns) as
	// WarmupThreshold gave it: WarmupMask applies it and Summarize's rule
	// names it, neither computing it again (a report of part of a run
	// names the whole run's).
	Threshold float64
}

// AutoWarmup selects the automatic warm-up rule.
const AutoWarmup = -1

// Summary is the steady-state view of a window of cluster steps.
type Summary struct {
	Steps           int `json:"steps"`
	WarmupSteps     int `json:"warmup_steps"`
	SteadySteps     int `json:"steady_steps"`
	IncompleteSteps int `json:"incomplete_steps"`
	// IncompleteLeftOut counts incomplete steps kept out of the steady
	// figures (all of them, unless no step of the run was complete; then
	// CompleteNote says so and the figures are those of the ranks that
	// reported).
	IncompleteLeftOut int `json:"incomplete_left_out"`
	// WarmupRule says which steps were excluded as warm-up and why.
	WarmupRule   string `json:"warmup_rule,omitempty"`
	CompleteNote string `json:"complete_note,omitempty"`
	Attempts     int    `json:"attempts"`
	WorldSize    int64  `json:"world_size"`

	StepTimeS Dist `json:"step_time_s"`
	// StepTimeRelSE is the relative standard error of the steady steps'
	// mean step time: the spread of the means of consecutive batches of
	// SEBatch steps (so that slow phases a few steps long count as the
	// noise they are) over their count's square root, over the mean; 0
	// with fewer than 3 batches. A run's own step-to-step noise, which a
	// comparison's verdict must exceed (report.Verdict).
	StepTimeRelSE float64 `json:"step_time_rel_se"`
	// TPS is the distribution of the steady steps' own rates (each step's
	// tokens over its step time): shown as quantiles only, never as the
	// run's throughput (a mean of rates weighs a fast step as much as a
	// slow one; AggregateTPS is the run's).
	TPS Dist `json:"tps"`
	// AggregateTPS is the headline: Σtokens / Σstep time over steady steps.
	AggregateTPS float64 `json:"aggregate_tps"`
	// TPSPerGPU is AggregateTPS divided by the world size.
	TPSPerGPU float64 `json:"tps_per_gpu"`
	// WallTPS is Σtokens / wall time from the first steady step's start to the
	// last one's end: it includes the gaps between steps (eval, checkpoint).
	WallTPS float64 `json:"wall_tps"`
	// TPSUnknown, when set, says why there is no throughput (no token was
	// counted): the throughput figures are then null in JSON and "n/a"
	// in every view.
	TPSUnknown string `json:"tps_unknown,omitempty"`
	// Breakdown is where the steady steps' time went, each part's time
	// over their step time (ShareSum): the parts add up to 1.
	Breakdown Shares `json:"breakdown"`
	// ProfiledLeftOut counts the steady steps left out of the statistics
	// because a rank profiled them (WindowOptions.Profiled).
	ProfiledLeftOut int `json:"profiled_left_out,omitempty"`
	// CutLeftOut counts the steady steps left out because a save or an
	// evaluation between steps ran into them (WindowOptions.Cut).
	CutLeftOut int `json:"cut_left_out,omitempty"`
	// WallFromUnixNs and WallToUnixNs are the span WallTPS divides by
	// (the report takes the time between launches and unmonitored gaps
	// out of it).
	WallFromUnixNs int64 `json:"-"`
	WallToUnixNs   int64 `json:"-"`

	Tokens int64 `json:"tokens"`
	// MFU and HFU are over the steady steps whose MFU is known (MFUSteps
	// of them), each step weighted by its step time (their FLOPs over
	// their time, as the throughput is tokens over time); nil, with
	// MFUUnknown saying why, when none is.
	MFU        *float64 `json:"mfu"`
	HFU        *float64 `json:"hfu"`
	MFUSteps   int      `json:"mfu_steps"`
	MFUUnknown string   `json:"mfu_unknown,omitempty"`

	CommFraction      float64 `json:"comm_fraction"`
	WaitFraction      float64 `json:"wait_fraction"` // waiting for slower peers (ClusterStep.WaitFractionMean)
	CommFractionMax   float64 `json:"comm_fraction_max"`
	BubbleFraction    float64 `json:"bubble_fraction"`
	DataStallFraction float64 `json:"data_stall_fraction"`
	CkptFraction      float64 `json:"ckpt_fraction"`
	TokenMismatch     int64   `json:"token_mismatch_replicas"`
}

// MaxAutoWarmupShare bounds the automatic warm-up rule: at most this share
// of an attempt's steps (and at most 3 in an attempt shorter than 30) are
// excluded as warm-up, so a run that is slow for long is reported slow,
// not cut down to its fast end.
const MaxAutoWarmupShare = 0.1

// WarmupThreshold is the automatic rule's step time: median + max(3 MAD,
// 5% of the median) over the run (+Inf for a fixed count); opt.Threshold
// when set.
func WarmupThreshold(steps []ClusterStep, opt WindowOptions) float64 {
	if opt.Threshold > 0 {
		return opt.Threshold
	}
	if opt.Warmup >= 0 || len(steps) == 0 {
		return math.Inf(1)
	}
	times := make([]int64, len(steps))
	for i := range steps {
		times[i] = steps[i].StepTimeNs
	}
	return WarmupThresholdOf(times, opt.Warmup)
}

// WarmupThresholdOf is WarmupThreshold over the steps' step times alone.
func WarmupThresholdOf(stepTimes []int64, warmup int) float64 {
	if warmup >= 0 || len(stepTimes) == 0 {
		return math.Inf(1)
	}
	times := make([]float64, len(stepTimes))
	for i, t := range stepTimes {
		times[i] = float64(t)
	}
	return warmupThreshold(MedianMAD(times))
}

// WarmupThresholdOfValues is WarmupThresholdOf of step times held in a
// Series (as float64 ns).
func WarmupThresholdOfValues(stepTimes Series, warmup int) (float64, error) {
	if warmup >= 0 || stepTimes.Len() == 0 {
		return math.Inf(1), nil
	}
	med, mad, err := stepTimes.MedianMAD()
	return warmupThreshold(med, mad), err
}

func warmupThreshold(med, mad float64) float64 { return med + max(3*mad, 0.05*med) }

// WarmupMask marks, for steps sorted by (attempt, step), which are warm-up.
func WarmupMask(steps []ClusterStep, opt WindowOptions) []bool {
	if len(opt.Mask) == len(steps) && len(steps) > 0 {
		return opt.Mask
	}
	if opt.Warm != nil {
		mask := make([]bool, len(steps))
		for i, c := range steps {
			mask[i] = opt.Warm[[2]int64{c.Attempt, c.Step}]
		}
		return mask
	}
	attempts, times := make([]int64, len(steps)), make([]int64, len(steps))
	for i := range steps {
		attempts[i], times[i] = steps[i].Attempt, steps[i].StepTimeNs
	}
	return WarmupMaskOf(attempts, times, opt.Warmup, opt.Threshold)
}

// WarmupMaskOf is WarmupMask over the steps' attempts and step times
// alone (sorted by attempt, then step), for a caller that holds no more of
// them: warmup is WindowOptions.Warmup. stepTimes may be nil for a fixed
// count (warmup >= 0). threshold is the rule's (WarmupThresholdOf), or 0
// to compute it from stepTimes.
func WarmupMaskOf(attempts, stepTimes []int64, warmup int, threshold float64) []bool {
	if warmup < 0 && threshold <= 0 {
		threshold = WarmupThresholdOf(stepTimes, warmup)
	}
	var timeAt func(int) int64
	if stepTimes != nil {
		timeAt = func(i int) int64 { return stepTimes[i] }
	}
	return WarmupMaskAt(len(attempts), func(i int) int64 { return attempts[i] }, timeAt, warmup, threshold)
}

// WarmupMaskAt is WarmupMaskOf over n steps whose attempt and step time
// the functions give (timeAt may be nil for a fixed count), for a caller
// that holds them in another form; threshold is the rule's
// (WarmupThresholdOf), required for the automatic rule.
func WarmupMaskAt(n int, attemptAt, timeAt func(i int) int64, warmup int, threshold float64) []bool {
	mask := make([]bool, n)
	rule := WarmupRule{Warmup: warmup, Threshold: threshold}
	for i := range n {
		if a := attemptAt(i); i == 0 || a != attemptAt(i-1) {
			k := 0
			for j := i; j < n && attemptAt(j) == a; j++ {
				k++
			}
			rule.Attempt(k)
		}
		var t int64
		if warmup < 0 {
			t = timeAt(i)
		}
		mask[i] = rule.Next(t)
	}
	return mask
}

// WarmupRule is the warm-up mask a step at a time, for a caller that
// streams the steps (sorted by attempt, then step): Attempt at each
// attempt's first step, then Next for each of its steps.
type WarmupRule struct {
	Warmup    int     // WindowOptions.Warmup
	Threshold float64 // the automatic rule's (WarmupThresholdOf)
	pos       int     // position within the current attempt
	in        bool    // still in its warm-up
	limit     int
}

// Attempt starts an attempt of n steps.
func (r *WarmupRule) Attempt(n int) {
	r.pos, r.in, r.limit = 0, true, WarmupLimit(n)
}

// Next says whether the attempt's next step, of step time stepTime
// (unused for a fixed count), is warm-up.
func (r *WarmupRule) Next(stepTime int64) bool {
	pos := r.pos
	r.pos++
	if r.Warmup >= 0 {
		return pos < r.Warmup
	}
	if r.in && (pos == 0 || (pos < r.limit && float64(stepTime) > r.Threshold)) {
		return true
	}
	r.in = false
	return false
}

// WarmupLimit is how many leading steps of an attempt of n steps the
// automatic rule may exclude.
func WarmupLimit(n int) int { return max(3, int(MaxAutoWarmupShare*float64(n))) }

// SortSteps orders cluster steps by attempt, then step (rows of one step
// keep their order).
func SortSteps(steps []ClusterStep) {
	sorted := true
	for i := 1; i < len(steps) && sorted; i++ {
		// (by index: the comparison below takes 416-byte rows by value,
		// and rows come sorted nearly always)
		a, b := &steps[i-1], &steps[i]
		sorted = a.Attempt < b.Attempt || a.Attempt == b.Attempt && a.Step <= b.Step
	}
	if sorted {
		return
	}
	slices.SortStableFunc(steps, func(a, b ClusterStep) int {
		return cmp.Or(cmp.Compare(a.Attempt, b.Attempt), cmp.Compare(a.Step, b.Step))
	})
}

// Summarize sorts steps (unless opt.Mask is given for them as they are)
// and computes the steady-state summary.
func Summarize(steps []ClusterStep, opt WindowOptions) Summary {
	if len(opt.Mask) != len(steps) || len(steps) == 0 {
		SortSteps(steps) // a given mask is of the steps in their order
	}
	mask := WarmupMask(steps, opt)
	if opt.Warmup < 0 && len(steps) > 0 {
		opt.Threshold = WarmupThreshold(steps, opt) // for the rule's words
	}
	anyComplete := false
	for i := range steps {
		if steps[i].Complete() && !mask[i] {
			anyComplete = true
			break
		}
	}
	sm := NewSummarizer(opt, anyComplete, len(steps))
	for i := range steps {
		sm.Add(&steps[i], mask[i])
	}
	s, _ := sm.Result() // nothing to read back
	return s
}

// Summarizer is Summarize fed steps one at a time, in (attempt, step)
// order, for a caller that does not hold them all: it keeps sums, the
// attempts seen, and the steady steps' step times and TPS (16 bytes a
// steady step, for exact quantiles, in its Series: a caller's own may
// keep them in files, so that its memory stays bounded).
type Summarizer struct {
	opt         WindowOptions
	anyComplete bool
	s           Summary
	times, tps  Series // of the steady steps
	mostRanks   int64
	attempts    map[int64]bool
	lastAttempt int64
	first, last int64

	sumMFU, sumHFU, sumMFUDur, wallTok float64
	shares                             ShareSum
	// the batch means of the steady step times (StepTimeRelSE)
	batch, batchSum, batchSq float64
	batchN, batches          int
}

// SEBatch is how many consecutive steady steps a batch mean of
// Summary.StepTimeRelSE holds.
const SEBatch = 8

// NewSummarizer starts a summary with the options Summarize takes
// (opt.Threshold the automatic rule's, for its words), whether any steady
// step of the run is complete (incomplete steps are then left out), and
// how many steps it will be fed (0 when not known: a capacity hint).
func NewSummarizer(opt WindowOptions, anyComplete bool, steps int) *Summarizer {
	// sized once, not grown
	return NewSummarizerOf(opt, anyComplete, NewMemSeries(steps), NewMemSeries(steps))
}

// NewSummarizerOf is NewSummarizer keeping the steady steps' times and
// rates in the series given (the Summarizer closes them).
func NewSummarizerOf(opt WindowOptions, anyComplete bool, times, rates Series) *Summarizer {
	return &Summarizer{opt: opt, anyComplete: anyComplete, attempts: map[int64]bool{}, first: math.MaxInt64, times: times, tps: rates}
}

// WorldSize is the largest world size of the steps added so far.
func (sm *Summarizer) WorldSize() int64 { return sm.s.WorldSize }

// Add takes the next step and whether it is warm-up.
func (sm *Summarizer) Add(c *ClusterStep, warm bool) {
	s := &sm.s
	s.Steps++
	sm.mostRanks = max(sm.mostRanks, c.RanksReported)
	if s.Steps == 1 || c.Attempt != sm.lastAttempt { // steps come in order: a map write an attempt
		sm.attempts[c.Attempt] = true
		sm.lastAttempt = c.Attempt
	}
	s.WorldSize = max(s.WorldSize, c.WorldSize)
	if !c.Complete() {
		s.IncompleteSteps++
	}
	if warm {
		s.WarmupSteps++
		return
	}
	if !c.Complete() && sm.anyComplete {
		s.IncompleteLeftOut++
		return
	}
	if c.StepTimeNs <= 0 {
		return
	}
	sm.first, sm.last = min(sm.first, c.StartUnixNs), max(sm.last, c.EndUnixNs)
	sm.wallTok += float64(c.Tokens)
	if sm.opt.Profiled[[2]int64{c.Attempt, c.Step}] {
		s.ProfiledLeftOut++
		return
	}
	if sm.opt.Cut[[2]int64{c.Attempt, c.Step}] {
		s.CutLeftOut++
		return
	}
	s.SteadySteps++
	sm.times.Append(float64(c.StepTimeNs) / 1e9)
	sm.batch += float64(c.StepTimeNs) / 1e9
	if sm.batchN++; sm.batchN == SEBatch {
		m := sm.batch / SEBatch
		sm.batchSum, sm.batchSq, sm.batches = sm.batchSum+m, sm.batchSq+m*m, sm.batches+1
		sm.batch, sm.batchN = 0, 0
	}
	sm.tps.Append(c.TPS)
	s.Tokens += c.Tokens
	why := c.MFUUnknown
	if why == "" {
		why = ImpossibleMFU(c.MFU, c.HFU) // rows written before the check
	}
	if why == "" && c.MFU > 0 {
		w := float64(c.StepTimeNs) / 1e9
		sm.sumMFU += c.MFU * w
		sm.sumHFU += c.HFU * w
		sm.sumMFUDur += w
		s.MFUSteps++
	} else if s.MFUUnknown == "" {
		s.MFUUnknown = cmp.Or(why, "no model or GPU in the run metadata")
	}
	sm.shares.Add(c)
	s.CommFractionMax = max(s.CommFractionMax, unitShare(min(c.CommFractionMax, 1)))
	s.TokenMismatch += c.TokenMismatchReplicas
}

// Result is the summary of the steps added (the quantiles reorder what
// the Summarizer holds, and it removes its files: call it once). Its error
// is one reading back the step times and TPS it wrote to files.
func (sm *Summarizer) Result() (Summary, error) {
	defer sm.times.Close()
	defer sm.tps.Close()
	s, opt := sm.s, sm.opt
	s.Attempts = len(sm.attempts)
	if opt.Warmup >= 0 {
		s.WarmupRule = fmt.Sprintf("the first %d steps of each attempt", opt.Warmup)
	} else if s.Steps > 0 {
		s.WarmupRule = fmt.Sprintf("the first step of each attempt and the leading steps slower than %.3g s (median + max(3 MAD, 5%%) of the run's step times), at most %.0f%% of an attempt's steps (3 in a short one)",
			opt.Threshold/1e9, 100*MaxAutoWarmupShare)
	}
	if !sm.anyComplete && s.SteadySteps > 0 {
		s.CompleteNote = fmt.Sprintf("no step had all %d ranks (at most %d reported): every figure counts only the ranks that reported", s.WorldSize, sm.mostRanks)
	}
	if s.SteadySteps == 0 {
		return s, nil
	}
	var err error
	if s.StepTimeS, err = sm.times.Dist(); err != nil {
		return s, err
	}
	if k := float64(sm.batches); k >= 3 {
		mean := sm.batchSum / k
		if v := (sm.batchSq - k*mean*mean) / (k - 1); v > 0 && mean > 0 {
			s.StepTimeRelSE = math.Sqrt(v/k) / mean
		}
	}
	if s.TPS, err = sm.tps.Dist(); err != nil {
		return s, err
	}
	if t, ok := sm.shares.TPS(); ok {
		s.AggregateTPS = t
		if s.WorldSize > 0 {
			s.TPSPerGPU = s.AggregateTPS / float64(s.WorldSize)
		}
	} else {
		s.TPSUnknown = NoTokens
	}
	if sm.last > sm.first {
		if s.TPSUnknown == "" {
			s.WallTPS = sm.wallTok / (float64(sm.last-sm.first) / 1e9)
		}
		s.WallFromUnixNs, s.WallToUnixNs = sm.first, sm.last
	}
	if s.MFUSteps > 0 && sm.sumMFUDur > 0 {
		m, h := sm.sumMFU/sm.sumMFUDur, sm.sumHFU/sm.sumMFUDur
		s.MFU, s.HFU = &m, &h
		if s.MFUSteps == s.SteadySteps {
			s.MFUUnknown = ""
		}
	} else if s.MFUUnknown == "" {
		s.MFUUnknown = "no model or GPU in the run metadata"
	}
	if s.TPSUnknown != "" && s.MFUSteps == 0 {
		// without tokens there are no FLOPs to count either
		s.MFUUnknown = s.TPSUnknown
	}
	b := sm.shares.Shares()
	s.Breakdown = b
	s.CommFraction, s.BubbleFraction, s.WaitFraction = b.ExposedComm, b.Bubble, b.WaitingForPeers
	s.DataStallFraction, s.CkptFraction = b.DataStall, b.Checkpoint
	return s, nil
}
