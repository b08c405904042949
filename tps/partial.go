package tps

import (
	"fmt"
	"slices"
)

// Partial is the aggregate of a disjoint subset of one step's ranks (a
// node's, typically), in the few numbers cluster aggregation needs: merging
// the partials of all ranks gives exactly the ClusterStep that aggregating
// their records would (see StepAccumulator.AddPartial). It is how
// aggregation scales past one collector (docs/scale.md).
type Partial struct {
	Job       string `json:"job"`
	Attempt   int64  `json:"attempt"`
	Step      int64  `json:"step"`
	WorldSize int64  `json:"world_size"`
	// Ranks are the distinct ranks included, sorted.
	Ranks    []int64       `json:"ranks"`
	Replicas []ReplicaPart `json:"replicas"`

	MaxDurationNs int64   `json:"max_duration_ns"`
	MaxComputeNs  int64   `json:"max_compute_ns"`
	SlowestRank   int64   `json:"slowest_rank"`
	MinStartNs    int64   `json:"min_start_unix_ns"`
	MaxEndNs      int64   `json:"max_end_unix_ns"`
	SumDuration   float64 `json:"sum_duration_ns"`
	SumCompute    float64 `json:"sum_compute_ns"`
	SumExposed    float64 `json:"sum_exposed_comm_ns"`
	MaxExposed    float64 `json:"max_exposed_comm_ns"`
	SumComm       float64 `json:"sum_comm_ns"`
	SumPP         float64 `json:"sum_pp_wait_ns"`
	MaxPP         float64 `json:"max_pp_wait_ns"`
	SumData       float64 `json:"sum_data_wait_ns"`
	MaxData       float64 `json:"max_data_wait_ns"`
	SumCkpt       float64 `json:"sum_ckpt_ns"`
	SumLoss       float64 `json:"sum_loss"`
	NLoss         int64   `json:"n_loss"`
	Skipped       int64   `json:"skipped"`
}

// ReplicaPart is what a partial knows of one data-parallel replica.
type ReplicaPart struct {
	Replica    int64   `json:"replica"`
	Tokens     int64   `json:"tokens"`
	FLOPs      float64 `json:"flops,omitempty"`
	LowestRank int64   `json:"lowest_rank"`
	Mismatch   bool    `json:"mismatch,omitempty"`
}

// NewPartial aggregates validated records of one step. A rank given twice
// counts once.
func NewPartial(records []StepRecord, topo Topology) (Partial, error) {
	if len(records) == 0 {
		return Partial{}, fmt.Errorf("%w: no records for a partial", ErrInvalidRecord)
	}
	r0 := &records[0]
	if topo == (Topology{}) {
		topo = DataParallel(int(r0.WorldSize))
	}
	p := Partial{Job: r0.Job, Attempt: r0.Attempt, Step: r0.Step, WorldSize: r0.WorldSize, SlowestRank: -1, MinStartNs: r0.StartUnixNs}
	seen := make(map[int64]bool, len(records))
	reps := map[int64]int{}
	for i := range records {
		r := &records[i]
		if r.Job != p.Job || r.Attempt != p.Attempt || r.Step != p.Step || r.WorldSize != p.WorldSize {
			return Partial{}, fmt.Errorf("%w: records of different steps in one partial", ErrInvalidRecord)
		}
		if seen[r.Rank] {
			continue
		}
		seen[r.Rank] = true
		p.Ranks = append(p.Ranks, r.Rank)
		rep := int64(topo.ReplicaOf(r))
		if k, ok := reps[rep]; ok {
			x := &p.Replicas[k]
			if x.Tokens != r.Tokens {
				x.Mismatch = true
			}
			if r.Rank < x.LowestRank {
				x.Tokens, x.LowestRank = r.Tokens, r.Rank
				if r.FLOPs > 0 {
					x.FLOPs = r.FLOPs
				}
			}
		} else {
			reps[rep] = len(p.Replicas)
			p.Replicas = append(p.Replicas, ReplicaPart{Replica: rep, Tokens: r.Tokens, FLOPs: r.FLOPs, LowestRank: r.Rank})
		}
		c := r.ComputeNs()
		p.MaxDurationNs = max(p.MaxDurationNs, r.DurationNs)
		if p.SlowestRank < 0 || c > p.MaxComputeNs || (c == p.MaxComputeNs && r.Rank < p.SlowestRank) {
			p.MaxComputeNs, p.SlowestRank = c, r.Rank
		}
		p.MinStartNs, p.MaxEndNs = min(p.MinStartNs, r.StartUnixNs), max(p.MaxEndNs, r.EndUnixNs)
		p.SumDuration += float64(r.DurationNs)
		p.SumCompute += float64(c)
		p.SumExposed += float64(r.ExposedCommNs)
		p.MaxExposed = max(p.MaxExposed, float64(r.ExposedCommNs))
		p.SumComm += float64(r.CommNs)
		p.SumPP += float64(r.PPWaitNs)
		p.MaxPP = max(p.MaxPP, float64(r.PPWaitNs))
		p.SumData += float64(r.DataWaitNs)
		p.MaxData = max(p.MaxData, float64(r.DataWaitNs))
		p.SumCkpt += float64(r.CkptNs)
		if r.Loss != nil {
			p.SumLoss += *r.Loss
			p.NLoss++
		}
		if r.Skipped {
			p.Skipped++
		}
	}
	slices.Sort(p.Ranks)
	return p, nil
}

// ErrPartialOverlap means a partial shares ranks with what the step already
// holds: its sums cannot be split, so it is not merged (and is counted).
var ErrPartialOverlap = fmt.Errorf("%w: partial overlaps ranks already reported", ErrInvalidRecord)

// AddPartial merges a partial of disjoint ranks. A partial whose ranks all
// reported already is a duplicate (false, nil); one that overlaps only in
// part is ErrPartialOverlap.
func (a *StepAccumulator) AddPartial(p *Partial) (bool, error) {
	if p.Job != a.job || p.Attempt != a.attempt || p.Step != a.step || p.WorldSize != a.world {
		return false, fmt.Errorf("%w: partial of %s/%d/%d added to step %s/%d/%d", ErrInvalidRecord, p.Job, p.Attempt, p.Step, a.job, a.attempt, a.step)
	}
	if len(p.Ranks) == 0 {
		return false, fmt.Errorf("%w: empty partial", ErrInvalidRecord)
	}
	already := 0
	for i, r := range p.Ranks {
		if r < 0 || r >= a.world || (i > 0 && r <= p.Ranks[i-1]) {
			return false, fieldErr("ranks", r, ReasonOutOfRange, "must be distinct, sorted and in [0, %d)", a.world)
		}
		if a.seen[r/64]&(1<<(r%64)) != 0 {
			already++
		}
	}
	switch {
	case already == len(p.Ranks):
		a.dupes += int64(len(p.Ranks))
		return false, nil
	case already > 0:
		return false, ErrPartialOverlap
	}
	for _, x := range p.Replicas {
		if x.Replica < 0 || x.Replica >= int64(len(a.replicaTokens)) {
			return false, fieldErr("replica", x.Replica, ReasonOutOfRange, "the job has %d data-parallel replicas", len(a.replicaTokens))
		}
	}
	for _, r := range p.Ranks {
		a.seen[r/64] |= 1 << (r % 64)
	}
	a.reported += int64(len(p.Ranks))
	for _, x := range p.Replicas {
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
			continue
		}
		if a.replicaTokens[x.Replica] != x.Tokens {
			a.mismatched[w] |= b
		}
		if x.LowestRank < a.replicaRank[x.Replica] {
			a.replicaTokens[x.Replica], a.replicaRank[x.Replica] = x.Tokens, x.LowestRank
			if x.FLOPs > 0 {
				a.setFLOPs(x.Replica, x.FLOPs)
			}
		}
	}
	a.maxDur = max(a.maxDur, p.MaxDurationNs)
	if a.slowest < 0 || p.MaxComputeNs > a.maxCompute || (p.MaxComputeNs == a.maxCompute && p.SlowestRank < a.slowest) {
		a.maxCompute, a.slowest = p.MaxComputeNs, p.SlowestRank
	}
	a.minStart, a.maxEnd = min(a.minStart, p.MinStartNs), max(a.maxEnd, p.MaxEndNs)
	a.sumDur += p.SumDuration
	a.sumCompute += p.SumCompute
	a.sumExposed += p.SumExposed
	a.maxExposed = max(a.maxExposed, p.MaxExposed)
	a.sumComm += p.SumComm
	a.sumPP += p.SumPP
	a.maxPP = max(a.maxPP, p.MaxPP)
	a.sumData += p.SumData
	a.maxData = max(a.maxData, p.MaxData)
	a.sumCkpt += p.SumCkpt
	a.sumLoss += p.SumLoss
	a.nLoss += p.NLoss
	a.skipped += p.Skipped
	return true, nil
}
