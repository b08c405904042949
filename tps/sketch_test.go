package tps

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"sort"
	"testing"
)

// exactQuantile is the value of rank ⌊q·(n−1)⌋, the rank Sketch.Quantile
// answers for.
func exactQuantile(sorted []float64, q float64) float64 {
	return sorted[int(q*float64(len(sorted)-1))]
}

// Known answers: two ranks, 1..100 ms and 101..200 ms. Merged, the median
// is the 100th value (100 ms), p95 the 190th (190 ms), p99 the 198th
// (198 ms); each sketch answer lies within 1% of it.
func TestSketchKnownAnswerMerge(t *testing.T) {
	var a, b Sketch
	for i := 1; i <= 100; i++ {
		a.Add(float64(i) / 1000)
		b.Add(float64(100+i) / 1000)
	}
	a.Merge(&b)
	for _, c := range []struct{ q, want float64 }{{0.5, 0.100}, {0.95, 0.190}, {0.99, 0.198}, {0, 0.001}, {1, 0.200}} {
		got := a.Quantile(c.q)
		if math.Abs(got-c.want) > SketchAlpha*c.want {
			t.Errorf("p%g = %.5f, want %.3f within 1%%", 100*c.q, got, c.want)
		}
	}
	if a.Count != 200 || math.Abs(a.Mean()-0.1005) > 1e-12 || a.Min != 0.001 || a.Max != 0.2 {
		t.Errorf("count %d mean %v min %v max %v", a.Count, a.Mean(), a.Min, a.Max)
	}
}

// Merging ranks' sketches is exact: the same sketch as one of all their
// values, whatever the order; every quantile within 1% of the exact one
// (lognormal latencies over 64 ranks, like TTFT across a rollout fleet).
func TestSketchMergeIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var all Sketch
	var values []float64
	ranks := make([]Sketch, 64)
	for r := range ranks {
		for range 500 {
			v := math.Exp(rng.NormFloat64()*0.8 - 2.5) // median ~82 ms
			if r == 7 {
				v *= 4 // one slow rank
			}
			ranks[r].Add(v)
			all.Add(v)
			values = append(values, v)
		}
	}
	var merged Sketch
	for _, i := range rng.Perm(len(ranks)) {
		merged.Merge(&ranks[i])
	}
	if !reflect.DeepEqual(merged.Bins, all.Bins) || merged.Offset != all.Offset || merged.Count != all.Count {
		t.Fatal("merged sketch differs from the sketch of all values")
	}
	sort.Float64s(values)
	for _, q := range []float64{0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999} {
		got, want := merged.Quantile(q), exactQuantile(values, q)
		if math.Abs(got-want) > SketchAlpha*want {
			t.Errorf("p%g: %.6f, exact %.6f (%.2f%% off)", 100*q, got, want, 100*math.Abs(got-want)/want)
		}
	}
	// It survives JSON (the rollout event's detail) and checks.
	b, _ := json.Marshal(RolloutDetail{TTFT: merged, ITL: merged})
	d, err := ParseRollout(string(b))
	if err != nil || !reflect.DeepEqual(d.TTFT, merged) {
		t.Fatalf("round trip: %v", err)
	}
	if len(b) > MaxRolloutDetail {
		t.Errorf("two sketches of 32,000 values take %d bytes (limit %d)", len(b), MaxRolloutDetail)
	}
	bad := merged
	bad.Count++
	if err := bad.Check(); err == nil {
		t.Error("a sketch whose count does not add up passed")
	}
}

// Hostile offsets (a rank_windows row is anyone's file): sketches whose
// buckets lie 2^32 apart merge in bounded memory, without the int32
// overflow that made a negative length (makeslice panic) or the 16 GB
// that a far offset asked for, the count kept and the high buckets exact.
func TestSketchFarOffsetsMerge(t *testing.T) {
	for _, c := range []struct{ a, b int32 }{{math.MinInt32, math.MaxInt32 - 3}, {math.MaxInt32 - 3, math.MinInt32}, {0, 1 << 30}, {-5000, 5000}} {
		a := Sketch{Count: 4, Sum: 4, Min: 1, Max: 1, Offset: c.a, Bins: []int64{1, 0, 3}}
		b := Sketch{Count: 2, Sum: 2, Min: 1, Max: 1, Offset: c.b, Bins: []int64{2}}
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		a.Merge(&b)
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		if err := a.Check(); err != nil || a.Count != 6 || len(a.Bins) > SketchMaxBins {
			t.Errorf("offsets %d and %d: %v, count %d, %d bins", c.a, c.b, err, a.Count, len(a.Bins))
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
			t.Errorf("offsets %d and %d: %d bytes allocated", c.a, c.b, grew)
		}
		hi := max(int64(c.a)+2, int64(c.b))
		if got := int64(a.Offset) + int64(len(a.Bins)) - 1; got != hi {
			t.Errorf("offsets %d and %d: top bucket %d, want %d", c.a, c.b, got, hi)
		}
	}
}
