package tps

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
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
	// Nodes are the spans of the partial's nodes on their own clocks (an
	// agent's partial has one); empty from agents that predate them.
	Nodes []NodeSpan `json:"nodes,omitempty"`

	stepSums
}

// ReplicaPart is what a partial knows of one data-parallel replica.
type ReplicaPart struct {
	Replica    int64   `json:"replica"`
	Tokens     int64   `json:"tokens"`
	FLOPs      float64 `json:"flops,omitempty"`
	LowestRank int64   `json:"lowest_rank"`
	Mismatch   bool    `json:"mismatch,omitempty"`
	Bytes      int64   `json:"bytes,omitempty"` // text behind the tokens (the lowest rank's)
	// SeqSqSum is the lowest rank's Σ document length² (StepRecord), from
	// which the aggregator computes the replica's FLOPs with the job's
	// model (the agent that builds the partial does not know it).
	SeqSqSum int64 `json:"seq_sq_sum,omitempty"`
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
	p := Partial{Job: r0.Job, Attempt: r0.Attempt, Step: r0.Step, WorldSize: r0.WorldSize, stepSums: newStepSums()}
	seen := make(map[int64]bool, len(records))
	reps := map[int64]int{}
	nodes := map[string]int{}
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
				x.Tokens, x.LowestRank, x.Bytes, x.SeqSqSum = r.Tokens, r.Rank, r.Bytes, r.SeqSqSum
				if r.FLOPs > 0 {
					x.FLOPs = r.FLOPs
				}
			}
		} else {
			reps[rep] = len(p.Replicas)
			p.Replicas = append(p.Replicas, ReplicaPart{Replica: rep, Tokens: r.Tokens, FLOPs: r.FLOPs, LowestRank: r.Rank, Bytes: r.Bytes, SeqSqSum: r.SeqSqSum})
		}
		p.addRecord(r)
		span := NodeSpan{Node: r.Node, MinStartNs: r.StartUnixNs, MaxEndNs: r.EndUnixNs, Ranks: 1, LowestRank: r.Rank}
		if k, ok := nodes[r.Node]; ok {
			p.Nodes[k].merge(span)
		} else {
			nodes[r.Node] = len(p.Nodes)
			p.Nodes = append(p.Nodes, span)
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
	a.fromPartials = true
	for _, x := range p.Replicas {
		a.mergeReplica(x)
	}
	a.sums.merge(&p.stepSums)
	if len(p.Nodes) == 0 {
		a.addNode(NodeSpan{MinStartNs: p.Min[mStart], MaxEndNs: p.Max[mEnd], Ranks: int64(len(p.Ranks)), LowestRank: p.Ranks[0]})
	}
	for _, n := range p.Nodes {
		if len(n.Node) > MaxStringLen {
			n.Node = n.Node[:MaxStringLen]
		}
		a.addNode(n)
	}
	return true, nil
}

// jsonPartial is Partial without its JSON methods.
type jsonPartial Partial

// sumKeys are the JSON keys of the measures a step keeps over ranks:
// sum_<name>, max_<name> and min_<name>, as agents that sent partials as
// JSON named them (wire.DecodePartials still takes that form).
func sumKeys(s *stepSums, each func(key string, sum *float64, ext *int64)) {
	for _, i := range keptSum {
		each("sum_"+measures[i].Name, &s.Sum[i], nil)
	}
	for _, i := range keptMax {
		each("max_"+measures[i].Name, nil, &s.Max[i])
	}
	for _, i := range keptMin {
		each("min_"+measures[i].Name, nil, &s.Min[i])
	}
}

// MarshalJSON writes the partial with its sums as flat keys (sumKeys).
func (p Partial) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(jsonPartial(p))
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	sumKeys(&p.stepSums, func(key string, sum *float64, ext *int64) {
		if sum != nil {
			m[key] = json.RawMessage(strconv.FormatFloat(*sum, 'g', -1, 64))
		} else {
			m[key] = json.RawMessage(strconv.FormatInt(*ext, 10))
		}
	})
	return json.Marshal(m)
}

// UnmarshalJSON reads what MarshalJSON writes, and the JSON of agents
// that wrote maxima as floats. A missing minimum means no rank.
func (p *Partial) UnmarshalJSON(data []byte) error {
	var x jsonPartial
	if err := json.Unmarshal(data, &x); err != nil {
		return err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*p = Partial(x)
	var bad error
	sumKeys(&p.stepSums, func(key string, sum *float64, ext *int64) {
		raw, ok := m[key]
		switch {
		case !ok && sum == nil && key[:4] == "min_":
			*ext = math.MaxInt64
		case !ok:
		case sum != nil:
			if err := json.Unmarshal(raw, sum); err != nil && bad == nil {
				bad = fmt.Errorf("%s: %w", key, err)
			}
		default:
			if v, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
				*ext = v
			} else if f, err := strconv.ParseFloat(string(raw), 64); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<62 {
				*ext = int64(f)
			} else if bad == nil {
				bad = fmt.Errorf("%s: not a whole number: %s", key, raw)
			}
		}
	})
	return bad
}
