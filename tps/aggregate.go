package tps

import (
	"fmt"
	"math"
	"math/bits"
	"unsafe"
)

// ClusterStep is one optimizer step of the whole job, aggregated over ranks.
// Column meanings and units are documented in docs/parquet.md.
type ClusterStep struct {
	Job       string `json:"job" parquet:"job,dict"`
	Attempt   int64  `json:"attempt" parquet:"attempt"`
	Step      int64  `json:"step" parquet:"step"`
	WorldSize int64  `json:"world_size" parquet:"world_size"`

	RanksReported    int64 `json:"ranks_reported" parquet:"ranks_reported"`
	RanksMissing     int64 `json:"ranks_missing" parquet:"ranks_missing"`
	DuplicateRecords int64 `json:"duplicate_records" parquet:"duplicate_records"`
	Replicas         int64 `json:"replicas" parquet:"replicas"`
	ReplicasReported int64 `json:"replicas_reported" parquet:"replicas_reported"`
	// TokenMismatchReplicas counts replicas whose ranks reported different
	// token counts; their tokens are taken from the lowest rank that reported.
	TokenMismatchReplicas int64 `json:"token_mismatch_replicas" parquet:"token_mismatch_replicas"`

	Tokens int64   `json:"tokens" parquet:"tokens"`
	FLOPs  float64 `json:"flops" parquet:"flops"`
	// StepTimeNs is the step's period on the critical path (see
	// StepAccumulator.ResultIn); TPS, MFU and the fractions are over it.
	StepTimeNs int64 `json:"step_time_ns" parquet:"step_time_ns"`
	// RankTimeMaxNs is the slowest rank's own step duration.
	RankTimeMaxNs int64 `json:"rank_time_max_ns" parquet:"rank_time_max_ns"`
	// SlowestRank is the critical rank: the one with the most busy time
	// (compute plus data wait: duration less exposed communication,
	// pipeline wait and checkpoint). In a synchronous step every rank's
	// duration is about the same; the others wait for this one inside
	// their collectives (WaitFractionMean).
	SlowestRank int64 `json:"slowest_rank" parquet:"slowest_rank"`
	StartUnixNs int64 `json:"start_unix_ns" parquet:"start_unix_ns"`
	EndUnixNs   int64 `json:"end_unix_ns" parquet:"end_unix_ns"`

	TPS       float64 `json:"tps" parquet:"tps"`
	TPSPerGPU float64 `json:"tps_per_gpu" parquet:"tps_per_gpu"`
	MFU       float64 `json:"mfu" parquet:"mfu"`
	HFU       float64 `json:"hfu" parquet:"hfu"`
	// MFUUnknown says why MFU and HFU are not known for this step (they
	// are then 0): no model or GPU, a topology that does not match the
	// ranks, or inputs that would give a utilisation above 100%.
	MFUUnknown string `json:"mfu_unknown,omitempty" parquet:"mfu_unknown,optional"`

	// CommFractionMean is exposed transfer: the ranks' mean exposed
	// communication less WaitFractionMean, over the step time.
	CommFractionMean float64 `json:"comm_fraction_mean" parquet:"comm_fraction_mean"`
	// WaitFractionMean is the time ranks spent blocked in collectives
	// waiting for the critical rank (SlowestRank) to arrive, mean over
	// ranks, over the step time: the critical rank's busy time less the
	// ranks' mean busy time, at most their mean exposed communication
	// (docs/report.md). Imbalance, not the network.
	WaitFractionMean      float64 `json:"wait_fraction_mean" parquet:"wait_fraction_mean"`
	CommFractionMax       float64 `json:"comm_fraction_max" parquet:"comm_fraction_max"`
	CommOverlap           float64 `json:"comm_overlap" parquet:"comm_overlap"`
	BubbleFractionMean    float64 `json:"bubble_fraction_mean" parquet:"bubble_fraction_mean"`
	BubbleFractionMax     float64 `json:"bubble_fraction_max" parquet:"bubble_fraction_max"`
	DataStallFractionMean float64 `json:"data_stall_fraction_mean" parquet:"data_stall_fraction_mean"`
	DataStallFractionMax  float64 `json:"data_stall_fraction_max" parquet:"data_stall_fraction_max"`
	CkptFractionMean      float64 `json:"ckpt_fraction_mean" parquet:"ckpt_fraction_mean"`
	// The splits of a breakdown part (Measure.Split): each the mean
	// fraction of its measure, as the blocking parts' (bound to its
	// measure by Measure.Column).
	GCFractionMean   float64 `json:"gc_fraction_mean" parquet:"gc_fraction_mean"`
	HostFractionMean float64 `json:"host_fraction_mean" parquet:"host_fraction_mean"`
	ComputeNsMean    float64 `json:"compute_ns_mean" parquet:"compute_ns_mean"`

	LossMean     float64 `json:"loss_mean" parquet:"loss_mean"`
	SkippedRanks int64   `json:"skipped_ranks" parquet:"skipped_ranks"`

	// Joined from GPU samples of the job's nodes (0 when there are none).
	GPUsJoined        int64   `json:"gpus_joined" parquet:"gpus_joined"`
	EnergyJ           float64 `json:"energy_j" parquet:"energy_j"`
	TokensPerJoule    float64 `json:"tokens_per_joule" parquet:"tokens_per_joule"`
	PowerWMean        float64 `json:"power_w_mean" parquet:"power_w_mean"`
	SMClockMHzMean    float64 `json:"sm_clock_mhz_mean" parquet:"sm_clock_mhz_mean"`
	ClockEventReasons int64   `json:"clock_event_reasons" parquet:"clock_event_reasons"`

	// Bytes is the UTF-8 text behind Tokens (once per replica) when ranks
	// report it; BytesPerSecond compares across tokenizers.
	Bytes          int64   `json:"bytes" parquet:"bytes"`
	BytesPerSecond float64 `json:"bytes_per_second" parquet:"bytes_per_second"`
	// The generation phase (RL rollouts), when ranks report one: the
	// slowest rank's generation time, requests and tokens summed over
	// ranks, generated tokens per second of the slowest rank's
	// generation time (output: generated only; total: with the prompts),
	// the mean share of step time ranks spent generating, and MFU of the
	// training phase alone (the update's FLOPs over the step time less
	// the generation).
	GenNsMax        int64   `json:"gen_ns_max" parquet:"gen_ns_max"`
	GenRequests     int64   `json:"gen_requests" parquet:"gen_requests"`
	GenPromptTokens int64   `json:"gen_prompt_tokens" parquet:"gen_prompt_tokens"`
	GenOutputTokens int64   `json:"gen_output_tokens" parquet:"gen_output_tokens"`
	GenOutputTPS    float64 `json:"gen_output_tps" parquet:"gen_output_tps"`
	GenTotalTPS     float64 `json:"gen_total_tps" parquet:"gen_total_tps"`
	GenFractionMean float64 `json:"gen_fraction_mean" parquet:"gen_fraction_mean"`
	MFUTraining     float64 `json:"mfu_training" parquet:"mfu_training"`

	// ClockHeldOut says a rank's start lay more than twice the slowest
	// rank's duration before the step's end (its clock off): the step's
	// start was bounded instead (ResultIn). Not a column: the collector
	// counts and logs it.
	ClockHeldOut bool `json:"-" parquet:"-"`
}

// Complete reports whether every rank reported.
func (c *ClusterStep) Complete() bool { return c.RanksMissing == 0 }

// AccumulatorConfig describes the job a StepAccumulator aggregates for.
// FLOPs figures are optional; with them the step gets MFU and HFU.
type AccumulatorConfig struct {
	Topology Topology
	// FLOPsPerToken is the model FLOPs per token (mfu.Model.FLOPsPerToken);
	// used when ranks do not report flops themselves.
	FLOPsPerToken float64
	// HWFLOPsPerToken adds activation recompute (for HFU).
	HWFLOPsPerToken float64
	// PeakFLOPSPerGPU is the dense peak of one GPU at the training dtype.
	PeakFLOPSPerGPU float64
	// DenseFLOPsPerToken and AttnFLOPsPerSeqSq split FLOPsPerToken for
	// records that give their batch's Σ document length² (SeqSqSum):
	// those get tokens × dense + SeqSqSum × attention.
	DenseFLOPsPerToken float64
	AttnFLOPsPerSeqSq  float64
	// MFUUnknown, when set, is why MFU is not computed; every step
	// carries it.
	MFUUnknown string
}

// StepAccumulator aggregates the records of one (job, attempt, step) as they
// arrive, in memory proportional to the world size (a bit per rank, a token
// count per replica) rather than to the records. Not safe for concurrent use.
type StepAccumulator struct {
	cfg     AccumulatorConfig
	job     string
	attempt int64
	step    int64
	world   int64

	seen          []uint64
	replicaSeen   []uint64
	replicaTokens []int64
	replicaFLOPs  []float64
	replicaBytes  []int64 // nil until a replica reports bytes
	replicaSeqSq  []int64 // nil until a replica reports seq_sq_sum
	replicaRank   []int64 // lowest rank whose tokens were taken
	mismatched    []uint64
	// explicit marks replicas keyed by a record's own dp_rank (not
	// derived from its rank): Reconfigure keeps their index.
	explicit []uint64

	reported, dupes int64
	sums            stepSums

	// Each node's earliest start and latest end, on its own clock: the
	// collector estimates clock offsets between nodes from them and
	// removes them before any cross-node arithmetic (ResultIn).
	nodes   []NodeSpan
	nodeIdx map[string]int

	fromPartials bool // partials merged: replicas cannot be regrouped
}

// NodeSpan is one node's part of a step, on that node's clock: the earliest
// start and the latest end of its ranks that reported.
type NodeSpan struct {
	Node       string `json:"node"`
	MinStartNs int64  `json:"min_start_unix_ns"`
	MaxEndNs   int64  `json:"max_end_unix_ns"`
	Ranks      int64  `json:"ranks"`
	LowestRank int64  `json:"lowest_rank"` // rank 0's node is the clocks' reference
}

// maxStepNodes bounds the node spans one step keeps; ranks of further
// nodes count under the last one (a job of more distinct node names than
// this is mislabelled, not large).
const maxStepNodes = 1 << 16

func (a *StepAccumulator) addNode(n NodeSpan) {
	// Records of a node arrive together: try the last node first.
	if k := len(a.nodes) - 1; k >= 0 && a.nodes[k].Node == n.Node {
		a.nodes[k].merge(n)
		return
	}
	i, ok := a.nodeIdx[n.Node]
	switch {
	case ok:
	case len(a.nodes) >= maxStepNodes:
		i = len(a.nodes) - 1
	default:
		if a.nodeIdx == nil {
			a.nodeIdx = map[string]int{}
		}
		a.nodeIdx[n.Node] = len(a.nodes)
		a.nodes = append(a.nodes, n)
		return
	}
	a.nodes[i].merge(n)
}

// merge widens the span by another part of the same node.
func (x *NodeSpan) merge(n NodeSpan) {
	x.MinStartNs, x.MaxEndNs = min(x.MinStartNs, n.MinStartNs), max(x.MaxEndNs, n.MaxEndNs)
	x.Ranks += n.Ranks
	x.LowestRank = min(x.LowestRank, n.LowestRank)
}

// NodeSpans are the step's nodes as reported so far (records without a
// node name count under ""), in the order first heard. The slice is the
// accumulator's own: read it, do not keep it.
func (a *StepAccumulator) NodeSpans() []NodeSpan { return a.nodes }

// stepSums are a step's figures over ranks that merge by sum, max and min:
// the same for one record, a node's partial, or the whole step. Of the
// measures, what each one's Over says is kept (indexed as Measures); the
// rest are figures no single measure gives.
type stepSums struct {
	Sum [len(measures)]float64 `json:"-"` // Σ over ranks (OverSum)
	Max [len(measures)]int64   `json:"-"` // largest (OverMax)
	Min [len(measures)]int64   `json:"-"` // smallest (OverMin)

	MaxComputeNs int64   `json:"max_compute_ns"` // the critical rank's busy time: its own time (StepRecord.OwnNs)
	SlowestRank  int64   `json:"slowest_rank"`   // -1: none yet
	SumCompute   float64 `json:"sum_compute_ns"` // Σ compute (StepRecord.ComputeNs)
	SumLoss      float64 `json:"sum_loss"`
	NLoss        int64   `json:"n_loss"`
	Skipped      int64   `json:"skipped"`
	GenRanks     int64   `json:"gen_ranks,omitempty"` // ranks that reported a generation phase
}

func newStepSums() stepSums {
	s := stepSums{SlowestRank: -1}
	for _, i := range keptMin {
		s.Min[i] = math.MaxInt64
	}
	return s
}

func (s *stepSums) addRecord(r *StepRecord) {
	for _, i := range keptSum {
		s.Sum[i] += float64(*measures[i].Of(r))
	}
	for _, i := range keptMax {
		s.Max[i] = max(s.Max[i], *measures[i].Of(r))
	}
	for _, i := range keptMin {
		s.Min[i] = min(s.Min[i], *measures[i].Of(r))
	}
	c := r.ComputeNs()
	s.critical(r.OwnNs(), r.Rank)
	s.SumCompute += float64(c)
	if r.Loss != nil {
		s.SumLoss += *r.Loss
		s.NLoss++
	}
	if r.Skipped {
		s.Skipped++
	}
	if r.GenNs > 0 || r.GenRequests > 0 {
		s.GenRanks++
	}
}

// critical takes rank as the critical (slowest) rank if its busy time
// (its own time: compute, data wait, host work) is the most so far, the lowest rank on ties, so
// the result does not depend on the order of merging.
func (s *stepSums) critical(busy, rank int64) {
	if rank >= 0 && (s.SlowestRank < 0 || busy > s.MaxComputeNs || (busy == s.MaxComputeNs && rank < s.SlowestRank)) {
		s.MaxComputeNs, s.SlowestRank = busy, rank
	}
}

// merge folds in the sums of other ranks.
func (s *stepSums) merge(o *stepSums) {
	for _, i := range keptSum {
		s.Sum[i] += o.Sum[i]
	}
	for _, i := range keptMax {
		s.Max[i] = max(s.Max[i], o.Max[i])
	}
	for _, i := range keptMin {
		s.Min[i] = min(s.Min[i], o.Min[i])
	}
	s.critical(o.MaxComputeNs, o.SlowestRank)
	s.SumCompute += o.SumCompute
	s.SumLoss += o.SumLoss
	s.NLoss += o.NLoss
	s.Skipped += o.Skipped
	s.GenRanks += o.GenRanks
}

// NewStepAccumulator starts the aggregation of one step. The topology must
// match world (see Topology.Validate).
func NewStepAccumulator(job string, attempt, step, world int64, cfg AccumulatorConfig) (*StepAccumulator, error) {
	if world <= 0 || world > MaxWorldSize {
		return nil, fmt.Errorf("%w: world_size %d out of range", ErrInvalidRecord, world)
	}
	if cfg.Topology == (Topology{}) {
		cfg.Topology = DataParallel(int(world))
	}
	if err := cfg.Topology.Validate(int(world)); err != nil {
		return nil, err
	}
	a := &StepAccumulator{}
	a.reset(job, attempt, step, world, cfg)
	return a, nil
}

func words(n int64) int { return int((n + 63) / 64) }

// StepAccumulatorBytes is what NewStepAccumulator allocates for a step of
// world ranks under topo (the zero Topology: pure data parallelism): a
// bit per rank, per data-parallel replica three bits and two int64s, and
// the accumulator itself (its sums: three values a measure).
// Collectors budget open steps with it: memory follows the declared world,
// not the ranks heard from.
func StepAccumulatorBytes(world int64, topo Topology) int64 {
	dp := world
	if topo != (Topology{}) {
		dp = int64(topo.normalized().DP)
	}
	return 8*int64(words(world)) + 24*int64(words(dp)) + 16*dp + int64(unsafe.Sizeof(StepAccumulator{}))
}

func (a *StepAccumulator) reset(job string, attempt, step, world int64, cfg AccumulatorConfig) {
	dp := int64(cfg.Topology.normalized().DP)
	*a = StepAccumulator{
		cfg: cfg, job: job, attempt: attempt, step: step, world: world,
		seen:          make([]uint64, words(world)),
		replicaSeen:   make([]uint64, words(dp)),
		mismatched:    make([]uint64, words(dp)),
		explicit:      make([]uint64, words(dp)),
		replicaTokens: make([]int64, dp),
		replicaRank:   make([]int64, dp),
		sums:          newStepSums(),
	}
}

// Key returns what the accumulator aggregates.
func (a *StepAccumulator) Key() (job string, attempt, step int64) { return a.job, a.attempt, a.step }

// Full reports whether every rank of the world has reported.
func (a *StepAccumulator) Full() bool { return a.reported == a.world }

// Add folds one validated record in. It returns false, and counts a
// duplicate, when the rank already reported this step: a duplicate never
// counts twice. A record of another step or job is an error.
func (a *StepAccumulator) Add(r *StepRecord) (bool, error) {
	if r.Job != a.job || r.Attempt != a.attempt || r.Step != a.step {
		return false, fmt.Errorf("%w: record of %s/%d/%d added to step %s/%d/%d", ErrInvalidRecord, r.Job, r.Attempt, r.Step, a.job, a.attempt, a.step)
	}
	if r.WorldSize != a.world {
		return false, fieldErr("world_size", r.WorldSize, ReasonInvalid, "the step has world_size %d", a.world)
	}
	if r.Rank < 0 || r.Rank >= a.world {
		return false, fieldErr("rank", r.Rank, ReasonOutOfRange, "must be in [0, %d)", a.world)
	}
	rep := int64(a.cfg.Topology.ReplicaOf(r))
	if rep < 0 || rep >= int64(len(a.replicaTokens)) {
		return false, fieldErr("dp_rank", rep, ReasonOutOfRange, "the job has %d data-parallel replicas", len(a.replicaTokens))
	}
	w, b := r.Rank/64, uint64(1)<<(r.Rank%64)
	if a.seen[w]&b != 0 {
		a.dupes++
		return false, nil
	}
	if r.DPRank != nil {
		a.explicit[rep/64] |= 1 << (rep % 64)
	}
	a.seen[w] |= b
	a.reported++
	a.mergeReplica(ReplicaPart{Replica: rep, Tokens: r.Tokens, FLOPs: r.FLOPs, LowestRank: r.Rank, Bytes: r.Bytes, SeqSqSum: r.SeqSqSum})
	a.sums.addRecord(r)
	a.addNode(NodeSpan{Node: r.Node, MinStartNs: r.StartUnixNs, MaxEndNs: r.EndUnixNs, Ranks: 1, LowestRank: r.Rank})
	return true, nil
}

// mergeReplica records what some ranks of a replica reported. Tokens that
// differ between ranks mark the replica as mismatched; the lowest rank's
// figures are kept, so the result does not depend on arrival order.
func (a *StepAccumulator) mergeReplica(x ReplicaPart) {
	w, b := x.Replica/64, uint64(1)<<(x.Replica%64)
	if x.Mismatch {
		a.mismatched[w] |= b
	}
	if a.replicaSeen[w]&b == 0 {
		a.replicaSeen[w] |= b
		a.replicaTokens[x.Replica], a.replicaRank[x.Replica] = x.Tokens, x.LowestRank
		if x.FLOPs > 0 {
			a.setFLOPs(x.Replica, x.FLOPs)
		}
		a.setLazy(&a.replicaBytes, x.Replica, x.Bytes)
		a.setLazy(&a.replicaSeqSq, x.Replica, x.SeqSqSum)
		return
	}
	if a.replicaTokens[x.Replica] != x.Tokens {
		a.mismatched[w] |= b
	}
	if x.LowestRank < a.replicaRank[x.Replica] {
		a.replicaTokens[x.Replica], a.replicaRank[x.Replica] = x.Tokens, x.LowestRank
		if x.FLOPs > 0 {
			a.setFLOPs(x.Replica, x.FLOPs)
		}
		a.setLazy(&a.replicaBytes, x.Replica, x.Bytes)
		a.setLazy(&a.replicaSeqSq, x.Replica, x.SeqSqSum)
	}
}

// Reconfigure applies a job configuration learnt after the step opened
// (run metadata that lost the race with the first records): the model and
// peak for MFU, and the topology. Opened without one (pure data
// parallelism: each rank its own replica), its replicas are regrouped
// under the new topology, tensor- and pipeline-parallel peers counted once,
// as if the records had arrived after the metadata. Replicas keyed by the
// records' own dp_rank keep it. It returns false, changing nothing, when
// the step's replicas cannot be regrouped: opened under another topology
// (its replicas are data-parallel coordinates, not ranks), or a topology
// that does not match the world size, or partials merged into it.
func (a *StepAccumulator) Reconfigure(cfg AccumulatorConfig) bool {
	if cfg.Topology == (Topology{}) {
		cfg.Topology = DataParallel(int(a.world))
	}
	if cfg.Topology.Validate(int(a.world)) != nil {
		return false
	}
	old := a.cfg.Topology.normalized()
	if cfg.Topology.normalized() == old {
		a.cfg = cfg
		return true
	}
	if old.DP != int(a.world) || a.fromPartials {
		return false
	}
	b := &StepAccumulator{}
	b.reset(a.job, a.attempt, a.step, a.world, cfg)
	b.seen, b.reported, b.dupes, b.sums, b.nodes, b.nodeIdx, b.fromPartials = a.seen, a.reported, a.dupes, a.sums, a.nodes, a.nodeIdx, a.fromPartials
	for i := range a.replicaTokens {
		w, bit := i/64, uint64(1)<<(i%64)
		if a.replicaSeen[w]&bit == 0 {
			continue
		}
		rep := int64(i)
		if a.explicit[w]&bit == 0 {
			rep = int64(cfg.Topology.Coords(i).DP) // i was the rank
		} else if rep >= int64(len(b.replicaTokens)) {
			return false
		}
		x := ReplicaPart{Replica: rep, Tokens: a.replicaTokens[i], LowestRank: a.replicaRank[i], Mismatch: a.mismatched[w]&bit != 0}
		if a.replicaFLOPs != nil {
			x.FLOPs = a.replicaFLOPs[i]
		}
		if a.replicaBytes != nil {
			x.Bytes = a.replicaBytes[i]
		}
		if a.replicaSeqSq != nil {
			x.SeqSqSum = a.replicaSeqSq[i]
		}
		b.mergeReplica(x)
		if a.explicit[w]&bit != 0 {
			b.explicit[rep/64] |= 1 << (rep % 64)
		}
	}
	*a = *b
	return true
}

// setLazy sets a per-replica figure that few jobs report (bytes,
// seq_sq_sum): its slice is made when a replica first reports one.
func (a *StepAccumulator) setLazy(s *[]int64, rep, n int64) {
	if n <= 0 && *s == nil {
		return
	}
	if *s == nil {
		*s = make([]int64, len(a.replicaTokens))
	}
	(*s)[rep] = n
}

func (a *StepAccumulator) setFLOPs(rep int64, f float64) {
	if a.replicaFLOPs == nil {
		a.replicaFLOPs = make([]float64, len(a.replicaTokens))
	}
	a.replicaFLOPs[rep] = f
}

// StepContext is what the job knows beyond one step's records.
type StepContext struct {
	// ClockOffsetNs is a node's clock less the job's reference clock (nil,
	// or 0 for a node: none known). Starts and ends are brought onto the
	// reference clock before they are compared across nodes.
	ClockOffsetNs func(node string) int64
	// PrevEndUnixNs is where the attempt's previous step ended, on the
	// reference clock (0: unknown, as for an attempt's first step).
	PrevEndUnixNs int64
}

// Result is ResultIn with no context: clocks taken as they are, and the
// step time the slowest rank's own duration.
func (a *StepAccumulator) Result() ClusterStep { return a.ResultIn(StepContext{}) }

// ResultIn computes the cluster step from what has arrived so far; missing
// ranks are reported in RanksMissing. Start and end are the earliest start
// and the latest end over the ranks, each node's clock offset removed.
//
// Step time is the step's period on the critical path: from the later of
// the previous step's end and this step's first start, to this step's last
// end. Ranks start a step at different moments (each when it finished the
// last one), so the slowest rank's own duration (RankTimeMaxNs) overlaps
// the next step and overstates the period; consecutive step times add up
// to the wall time they cover. Without the previous step's end the step
// time is the slowest rank's duration.
func (a *StepAccumulator) ResultIn(ctx StepContext) ClusterStep {
	c := ClusterStep{
		Job: a.job, Attempt: a.attempt, Step: a.step, WorldSize: a.world,
		RanksReported: a.reported, RanksMissing: a.world - a.reported,
		DuplicateRecords: a.dupes, Replicas: int64(len(a.replicaTokens)),
		StepTimeNs: a.sums.Max[mDuration], RankTimeMaxNs: a.sums.Max[mDuration], SlowestRank: a.sums.SlowestRank, SkippedRanks: a.sums.Skipped,
	}
	if a.reported == 0 {
		return c
	}
	s := &a.sums
	a.period(&c, ctx)
	flops, known := a.replicas(&c)
	a.shares(&c)
	a.generation(&c)
	if s.NLoss > 0 {
		c.LossMean = s.SumLoss / float64(s.NLoss)
	}
	if known {
		c.FLOPs = flops
	}
	a.utilisation(&c)
	return c
}

// period sets the step's start, end and step time (ResultIn).
func (a *StepAccumulator) period(c *ClusterStep, ctx StepContext) {
	s := &a.sums
	c.StartUnixNs, c.EndUnixNs = s.Min[mStart], s.Max[mEnd]
	if ctx.ClockOffsetNs != nil && len(a.nodes) > 0 {
		c.StartUnixNs, c.EndUnixNs = math.MaxInt64, math.MinInt64
		for _, n := range a.nodes {
			off := ctx.ClockOffsetNs(n.Node)
			c.StartUnixNs, c.EndUnixNs = min(c.StartUnixNs, n.MinStartNs-off), max(c.EndUnixNs, n.MaxEndNs-off)
		}
	}
	// A synchronous step's ranks start within about a step of each other:
	// a start more than twice the slowest rank's duration, and more than
	// a minute, before the step's end is a clock that is off (a rank's
	// clock an hour back made the run an hour longer: wall TPS 88.7
	// tokens/s, goodput 0.1%). It is held out of the step's start (then
	// twice the slowest duration before its end), and said
	// (ClockHeldOut). Skews under a minute are the nodes' clock
	// offsets' to correct (ClockOffsetNs).
	if d := c.RankTimeMaxNs; d > 0 && c.StartUnixNs < c.EndUnixNs-max(2*d, MaxClockSlackNs) {
		c.StartUnixNs, c.ClockHeldOut = c.EndUnixNs-2*d, true // as early as a synchronous step's ranks start
	}
	if p := ctx.PrevEndUnixNs; p > 0 {
		if d := c.EndUnixNs - max(p, c.StartUnixNs); d > 0 && d <= MaxStepNs {
			c.StepTimeNs = d
		}
	}
}

// replicas sums the replicas' tokens, bytes and FLOPs (known: every
// replica's FLOPs are).
func (a *StepAccumulator) replicas(c *ClusterStep) (flops float64, known bool) {
	// FLOPs: a replica's own figure (reported, or from its Σ document
	// length²), else its tokens × the model's FLOPs per token; a replica
	// with neither leaves the step's FLOPs unknown (0).
	known = true
	for i := range a.replicaTokens {
		if a.replicaSeen[i/64]&(1<<(i%64)) == 0 {
			continue
		}
		c.ReplicasReported++
		c.Tokens += a.replicaTokens[i]
		if a.replicaBytes != nil {
			c.Bytes += a.replicaBytes[i]
		}
		switch {
		case a.replicaFLOPs != nil && a.replicaFLOPs[i] > 0:
			flops += a.replicaFLOPs[i]
		case a.replicaSeqSq != nil && a.replicaSeqSq[i] > 0 && a.cfg.AttnFLOPsPerSeqSq > 0:
			flops += float64(a.replicaTokens[i])*a.cfg.DenseFLOPsPerToken + float64(a.replicaSeqSq[i])*a.cfg.AttnFLOPsPerSeqSq
		case a.cfg.FLOPsPerToken > 0:
			flops += float64(a.replicaTokens[i]) * a.cfg.FLOPsPerToken
		default:
			known = false
		}
	}
	for _, w := range a.mismatched {
		c.TokenMismatchReplicas += int64(bits.OnesCount64(w))
	}
	return flops, known
}

// shares sets the step's TPS and the shares of its time: waiting,
// communication, bubble, data and checkpoints.
func (a *StepAccumulator) shares(c *ClusterStep) {
	s := &a.sums
	n := float64(a.reported)
	D := float64(c.StepTimeNs)
	if D > 0 {
		sec := D / 1e9
		c.TPS = float64(c.Tokens) / sec
		c.TPSPerGPU = c.TPS / float64(a.world)
		// Waiting for the critical rank: a rank that was busy less than
		// it blocks in its collectives until it arrives. Mean over ranks
		// (sums merge; per-rank minima would not), at most the mean
		// exposed communication: what is left of that is transfer.
		exposed := s.Sum[mExposed] / n
		own, parts := s.SumCompute, s.SumCompute // Σ own time (Measure.Own), Σ every part
		for i := range measures {
			if m := &measures[i]; m.Kind == KindBlocking {
				// (every blocking measure is kept summed: TestBlockingMeasuresSummed)
				parts += s.Sum[i]
				if m.Own {
					own += s.Sum[i]
				}
			}
		}
		wait := min(max(float64(s.MaxComputeNs)-own/n, 0), exposed)
		// The shares are over the step's period, or over what the ranks'
		// parts add up to where that is longer: a rank's own step can
		// begin before the previous step ended on the critical path (its
		// start taken on the host while the device still ran the last
		// step), so its parts cover more than the period, and over the
		// period alone they would add up past 100%. The largest shares
		// are over the slowest rank's own duration where that is longer.
		mean := max(D, parts/n)
		most := max(D, float64(s.Max[mDuration]))
		c.WaitFractionMean = wait / mean
		c.CommFractionMean = (exposed - wait) / mean
		c.CommFractionMax = float64(s.Max[mExposed]) / most
		c.BubbleFractionMean = s.Sum[mPP] / n / mean
		c.BubbleFractionMax = float64(s.Max[mPP]) / most
		c.DataStallFractionMean = s.Sum[mData] / n / mean
		c.DataStallFractionMax = float64(s.Max[mData]) / most
		c.CkptFractionMean = s.Sum[mCkpt] / n / mean
		for _, i := range splitMeasures {
			*measures[i].columnOf(c) = s.Sum[i] / n / mean
		}
	}
	if s.Sum[mComm] > 0 {
		c.CommOverlap = 1 - s.Sum[mExposed]/s.Sum[mComm]
	}
	c.ComputeNsMean = s.SumCompute / n
	if D > 0 && c.Bytes > 0 {
		c.BytesPerSecond = float64(c.Bytes) / (D / 1e9)
	}
}

// generation sets the step's generation phase (RL rollouts).
func (a *StepAccumulator) generation(c *ClusterStep) {
	s := &a.sums
	n := float64(a.reported)
	D := float64(c.StepTimeNs)
	if s.GenRanks > 0 && D > 0 {
		c.GenNsMax = s.Max[mGen]
		c.GenRequests, c.GenPromptTokens, c.GenOutputTokens = int64(s.Sum[mGenReqs]), int64(s.Sum[mGenPrompt]), int64(s.Sum[mGenOutput])
		c.GenFractionMean = s.Sum[mGen] / n / D
		if c.GenNsMax > 0 {
			sec := float64(c.GenNsMax) / 1e9
			c.GenOutputTPS = float64(c.GenOutputTokens) / sec
			c.GenTotalTPS = float64(c.GenOutputTokens+c.GenPromptTokens) / sec
		}
	}
}

// utilisation sets MFU and HFU, or why they are unknown.
func (a *StepAccumulator) utilisation(c *ClusterStep) {
	D := float64(c.StepTimeNs)
	c.MFUUnknown = a.cfg.MFUUnknown
	if c.MFUUnknown == "" && a.reported < a.world {
		// The missing ranks' work is not known: MFU over the whole job's
		// GPUs would mix a guess into a measured figure.
		c.MFUUnknown = fmt.Sprintf("incomplete step: %d of %d ranks reported", a.reported, a.world)
	}
	if peak := a.cfg.PeakFLOPSPerGPU; peak > 0 && D > 0 && c.MFUUnknown == "" {
		denom := D / 1e9 * float64(a.world) * peak
		c.MFU = c.FLOPs / denom
		if a.cfg.HWFLOPsPerToken > 0 && a.cfg.FLOPsPerToken > 0 {
			c.HFU = c.MFU * a.cfg.HWFLOPsPerToken / a.cfg.FLOPsPerToken
		} else {
			c.HFU = c.MFU
		}
		if why := ImpossibleMFU(c.MFU, c.HFU); why != "" {
			c.MFU, c.HFU, c.MFUUnknown = 0, 0, why
		} else if c.GenNsMax > 0 && c.GenNsMax < c.StepTimeNs {
			// The update's FLOPs over the time left once the slowest
			// rank's generation is taken out (the generation's own FLOPs
			// are not counted: MFU of the training phase only).
			c.MFUTraining = c.MFU * D / (D - float64(c.GenNsMax))
			if ImpossibleMFU(c.MFUTraining, c.MFUTraining) != "" {
				c.MFUTraining = 0
			}
		}
	} else if c.MFUUnknown == "" && c.FLOPs > 0 {
		c.MFUUnknown = "no GPU peak known for this job"
	}
}

// MaxClockSlackNs is how far before a step's end (beyond twice its slowest
// rank's duration) a rank's start may lie before its clock is held out.
const MaxClockSlackNs = int64(60e9)

// ImpossibleMFU says why a utilisation cannot be right ("" when it can):
// above 100%, negative, or not a number.
func ImpossibleMFU(mfu, hfu float64) string {
	switch {
	case math.IsNaN(mfu) || math.IsNaN(hfu) || math.IsInf(mfu, 0) || math.IsInf(hfu, 0) || mfu < 0 || hfu < 0:
		return "MFU is not a number: the step's time or FLOPs are broken"
	case mfu > 1 || hfu > 1:
		return fmt.Sprintf("MFU would be %.0f%% (HFU %.0f%%), above 100%%: tokens counted per rank instead of once per data-parallel replica (give the topology: --dp/--tp/--pp), a model larger than the one trained, or the wrong GPU or dtype peak", 100*mfu, 100*hfu)
	}
	return ""
}

// Aggregate computes one cluster step from the records of one step, applying
// the once-per-replica token rule. All records must share job, attempt, step
// and world size; duplicates are counted, not summed.
func Aggregate(records []StepRecord, cfg AccumulatorConfig) (ClusterStep, error) {
	if len(records) == 0 {
		return ClusterStep{}, fmt.Errorf("%w: no records to aggregate", ErrInvalidRecord)
	}
	r0 := &records[0]
	a, err := NewStepAccumulator(r0.Job, r0.Attempt, r0.Step, r0.WorldSize, cfg)
	if err != nil {
		return ClusterStep{}, err
	}
	for i := range records {
		if _, err := a.Add(&records[i]); err != nil {
			return ClusterStep{}, err
		}
	}
	return a.Result(), nil
}

// SeenBits returns a copy of the bitset of ranks that reported (bit r%64 of
// word r/64), for recognising late duplicates after the step is closed.
func (a *StepAccumulator) SeenBits() []uint64 { return append([]uint64(nil), a.seen...) }
