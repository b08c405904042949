package tps

import (
	"cmp"
	"slices"
)

// RankScore is one rank's straggler score: the fastest rank's median compute
// time over this rank's. 1 is as fast as the fastest; below
// StragglerThreshold flags a straggler.
type RankScore struct {
	Rank            int64   `json:"rank"`
	Node            string  `json:"node,omitempty"`
	MedianComputeNs float64 `json:"median_compute_ns"`
	Score           float64 `json:"score"`
	Straggler       bool    `json:"straggler"`
}

// StragglerThreshold is the score below which a rank is flagged.
const StragglerThreshold = 0.75

// StragglerScores scores ranks from their compute times (duration minus
// exposed communication, data wait and pipeline wait; see
// StepRecord.ComputeNs). The result is sorted slowest first. computeNs maps
// rank to its steps' compute times and is reordered in place.
func StragglerScores(computeNs map[int64][]float64, nodes map[int64]string) []RankScore {
	med := make(map[int64]float64, len(computeNs))
	for r, xs := range computeNs {
		if len(xs) == 0 {
			continue
		}
		slices.Sort(xs)
		med[r] = Quantile(xs, 0.5)
	}
	return ScoreMedians(med, nodes)
}

// ScoreMedians scores ranks from their median compute times (see
// StragglerScores), slowest first.
func ScoreMedians(medianComputeNs map[int64]float64, nodes map[int64]string) []RankScore {
	out := make([]RankScore, 0, len(medianComputeNs))
	best := 0.0
	for r, m := range medianComputeNs {
		if m <= 0 {
			continue
		}
		out = append(out, RankScore{Rank: r, Node: nodes[r], MedianComputeNs: m})
		if best == 0 || m < best {
			best = m
		}
	}
	for i := range out {
		out[i].Score = best / out[i].MedianComputeNs
		out[i].Straggler = out[i].Score < StragglerThreshold
	}
	slices.SortFunc(out, func(a, b RankScore) int {
		return cmp.Or(cmp.Compare(a.Score, b.Score), cmp.Compare(a.Rank, b.Rank))
	})
	return out
}

// NodeScore is the worst score of a node's ranks.
type NodeScore struct {
	Node      string  `json:"node"`
	Score     float64 `json:"score"`
	Ranks     int     `json:"ranks"`
	Straggler bool    `json:"straggler"`
}

// NodeScores folds rank scores by node, slowest first.
func NodeScores(ranks []RankScore) []NodeScore {
	idx := map[string]int{}
	var out []NodeScore
	for _, r := range ranks {
		if r.Node == "" {
			continue
		}
		i, ok := idx[r.Node]
		if !ok {
			i = len(out)
			idx[r.Node] = i
			out = append(out, NodeScore{Node: r.Node, Score: r.Score})
		}
		out[i].Ranks++
		out[i].Score = min(out[i].Score, r.Score)
	}
	for i := range out {
		out[i].Straggler = out[i].Score < StragglerThreshold
	}
	slices.SortFunc(out, func(a, b NodeScore) int { return cmp.Or(cmp.Compare(a.Score, b.Score), cmp.Compare(a.Node, b.Node)) })
	return out
}

// TheoreticalBubble is the pipeline bubble fraction of a 1F1B schedule with
// p stages and m micro-batches, (p−1)/(m+p−1); with v virtual stages per
// rank (interleaved) it is (p−1)/(v·m) as Narayanan et al. 2021 give it.
func TheoreticalBubble(p, m, v int) float64 {
	if p <= 1 || m <= 0 {
		return 0
	}
	if v > 1 {
		return float64(p-1) / float64(v*m)
	}
	return float64(p-1) / float64(m+p-1)
}
