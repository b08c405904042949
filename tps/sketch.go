package tps

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Sketch summarises positive durations (seconds: time to first token,
// inter-token latency) so that sketches of ranks and steps merge exactly
// and any quantile of the merged data is known within SketchAlpha relative
// error. It is the DDSketch construction (Masson, Rim and Lee, VLDB 2019):
// a value x falls in bucket i = ⌈log_γ x⌉, γ = (1+α)/(1−α); merging adds
// bucket counts; the quantile's bucket is found by rank and answered with
// 2γ^i/(γ+1), within α of every value of that bucket. Rank-exact: the
// merged sketch of several ranks is the sketch of their values together.
type Sketch struct {
	Count int64   `json:"count"`
	Sum   float64 `json:"sum"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	// Zero counts values below SketchMinValue (1 ns), kept apart.
	Zero int64 `json:"zero,omitempty"`
	// Bins are the counts of buckets Offset, Offset+1, ...
	Offset int32   `json:"offset"`
	Bins   []int64 `json:"bins"`
}

const (
	// SketchAlpha is the relative accuracy of a Sketch's quantiles.
	SketchAlpha = 0.01
	// SketchMinValue is the smallest value kept in a bucket (1 ns).
	SketchMinValue = 1e-9
	// SketchMaxBins bounds a sketch: past it the lowest buckets fold
	// into one (accuracy is kept for the upper quantiles that matter).
	SketchMaxBins = 2048
)

var (
	sketchGamma    = (1 + SketchAlpha) / (1 - SketchAlpha)
	sketchLogGamma = math.Log(sketchGamma)
)

func sketchIndex(x float64) int32 { return int32(math.Ceil(math.Log(x) / sketchLogGamma)) }

// sketchValue answers for bucket i: within SketchAlpha of every value in it.
func sketchValue(i int32) float64 { return 2 * math.Exp(float64(i)*sketchLogGamma) / (sketchGamma + 1) }

// Add adds one value (negative and NaN values are ignored).
func (s *Sketch) Add(x float64) {
	if !(x >= 0) || math.IsInf(x, 0) {
		return
	}
	if s.Count == 0 || x < s.Min {
		s.Min = x
	}
	if s.Count == 0 || x > s.Max {
		s.Max = x
	}
	s.Count++
	s.Sum += x
	if x < SketchMinValue {
		s.Zero++
		return
	}
	s.addBin(sketchIndex(x), 1)
}

func (s *Sketch) addBin(i int32, n int64) {
	if len(s.Bins) == 0 {
		s.Offset, s.Bins = i, []int64{n}
		return
	}
	// The span the buckets would cover, in int64: two sketches whose
	// offsets lie far apart (a hostile rank_windows row: -2^31 and
	// 2^31-1) overflowed int32 into a negative length, or asked for 16 GB,
	// before the fold below bounded them.
	lo, hi := int64(s.Offset), int64(s.Offset)+int64(len(s.Bins))-1
	if top := max(hi, int64(i)); top-min(lo, int64(i))+1 > SketchMaxBins {
		s.refold(top, int64(i), n)
		return
	}
	switch {
	case i < s.Offset:
		grow := int(s.Offset - i)
		s.Bins = append(make([]int64, grow, grow+len(s.Bins)), s.Bins...)
		s.Offset = i
	case int(i-s.Offset) >= len(s.Bins):
		s.Bins = append(s.Bins, make([]int64, int(i-s.Offset)-len(s.Bins)+1)...)
	}
	s.Bins[i-s.Offset] += n
	if len(s.Bins) > SketchMaxBins { // fold the lowest buckets into one
		k := len(s.Bins) - SketchMaxBins
		var folded int64
		for _, c := range s.Bins[:k+1] {
			folded += c
		}
		s.Bins = s.Bins[k:]
		s.Bins[0] = folded
		s.Offset += int32(k)
	}
}

// refold keeps the SketchMaxBins buckets up to top, each bucket below
// them folded into the lowest kept one (as addBin's fold does), and adds
// n to bucket i: it allocates SketchMaxBins buckets at most, however far
// apart i and the sketch's buckets are.
func (s *Sketch) refold(top, i int64, n int64) {
	keep := top - SketchMaxBins + 1
	bins := make([]int64, SketchMaxBins)
	for k, c := range s.Bins {
		bins[max(int64(s.Offset)+int64(k), keep)-keep] += c
	}
	bins[max(i, keep)-keep] += n
	s.Bins, s.Offset = bins, int32(keep)
	for len(s.Bins) > 1 && s.Bins[len(s.Bins)-1] == 0 { // top is a bucket's, kept or added
		s.Bins = s.Bins[:len(s.Bins)-1]
	}
}

// Merge adds another sketch's values.
func (s *Sketch) Merge(o *Sketch) {
	if o == nil || o.Count == 0 {
		return
	}
	if s.Count == 0 || o.Min < s.Min {
		s.Min = o.Min
	}
	if s.Count == 0 || o.Max > s.Max {
		s.Max = o.Max
	}
	s.Count += o.Count
	s.Sum += o.Sum
	s.Zero += o.Zero
	for k, c := range o.Bins {
		if c > 0 {
			s.addBin(o.Offset+int32(k), c)
		}
	}
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of the values added: within
// SketchAlpha of the value of rank ⌊q·(Count−1)⌋ in sorted order. NaN when
// the sketch is empty.
func (s *Sketch) Quantile(q float64) float64 {
	if s.Count == 0 || math.IsNaN(q) {
		return math.NaN()
	}
	q = min(max(q, 0), 1)
	rank := int64(q * float64(s.Count-1))
	if rank < s.Zero {
		return s.Min
	}
	seen := s.Zero
	for k, c := range s.Bins {
		seen += c
		if seen > rank {
			return min(max(sketchValue(s.Offset+int32(k)), s.Min), s.Max)
		}
	}
	return s.Max
}

// Mean is the exact mean of the values added (NaN when empty).
func (s *Sketch) Mean() float64 {
	if s.Count == 0 {
		return math.NaN()
	}
	return s.Sum / float64(s.Count)
}

// Check reports a sketch that cannot come from Add: counts that do not
// add up, negative or non-finite figures, too many bins.
func (s *Sketch) Check() error {
	var n int64
	for _, c := range s.Bins {
		if c < 0 {
			return errors.New("negative bin count")
		}
		n += c
	}
	switch {
	case len(s.Bins) > SketchMaxBins:
		return fmt.Errorf("%d bins (limit %d)", len(s.Bins), SketchMaxBins)
	case s.Count < 0 || s.Zero < 0 || n+s.Zero != s.Count:
		return fmt.Errorf("count %d is not the bins' %d plus zero %d", s.Count, n, s.Zero)
	case math.IsNaN(s.Sum) || math.IsInf(s.Sum, 0) || s.Sum < 0 || s.Min < 0 || s.Max < s.Min && s.Count > 0:
		return errors.New("sum, min or max out of range")
	}
	return nil
}

// MaxRolloutDetail bounds a rollout event's detail (two sketches of a
// few hundred buckets each take 2-4 KB).
const MaxRolloutDetail = 32 << 10

// EventRollout carries a rank's generation latencies for one step: the
// event's Detail is a RolloutDetail in JSON.
const EventRollout = "rollout"

// RolloutDetail is the Detail of a rollout event: per-request time to
// first token and inter-token latencies, in seconds, as sketches.
type RolloutDetail struct {
	TTFT Sketch `json:"ttft"`
	ITL  Sketch `json:"itl"`
}

// ParseRollout decodes and checks a rollout event's detail.
func ParseRollout(detail string) (RolloutDetail, error) {
	var d RolloutDetail
	if err := json.Unmarshal([]byte(detail), &d); err != nil {
		return d, fmt.Errorf("%w: rollout detail: %v", ErrInvalidRecord, err)
	}
	for name, s := range map[string]*Sketch{"ttft": &d.TTFT, "itl": &d.ITL} {
		if err := s.Check(); err != nil {
			return d, fmt.Errorf("%w: rollout %s sketch: %v", ErrInvalidRecord, name, err)
		}
	}
	return d, nil
}
