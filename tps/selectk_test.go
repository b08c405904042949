package tps

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Quantiles by selection are those of the sorted values, exactly, for
// sizes around the sort cut-over, many repeats, sorted and reversed input,
// and the rank order statistics the summary reads.
func TestQuantileOfMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for trial := range 3000 {
		n := 1 + r.IntN(200)
		if trial%50 == 0 {
			n = 5000 + r.IntN(5000)
		}
		xs := make([]float64, n)
		for i := range xs {
			switch trial % 4 {
			case 0:
				xs[i] = r.Float64()
			case 1:
				xs[i] = float64(r.IntN(4)) // many repeats
			case 2:
				xs[i] = float64(i) // sorted
			case 3:
				xs[i] = float64(n - i) // reversed
			}
		}
		sorted := slices.Sorted(slices.Values(xs))
		for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.95, 0.99, 1} {
			work := slices.Clone(xs)
			if got, want := quantileOf(work, q), Quantile(sorted, q); got != want {
				t.Fatalf("trial %d, n %d, q %v: %v, want %v", trial, n, q, got, want)
			}
			if got := slices.Sorted(slices.Values(work)); !slices.Equal(got, sorted) {
				t.Fatalf("trial %d: quantileOf lost or changed values", trial)
			}
		}
		k := r.IntN(n)
		work := slices.Clone(xs)
		nthElement(work, k)
		if work[k] != sorted[k] || slices.Max(work[:k+1]) > work[k] || slices.Min(work[k:]) < work[k] {
			t.Fatalf("trial %d: nthElement(%d) = %v, want %v, partitioned", trial, k, work[k], sorted[k])
		}
	}
}

// BenchmarkNewDist: the summary of 156,250 varying step times by
// selection against a sort of them (what NewDist did).
//
//	go test -run '^$' -bench NewDist ./tps/
func BenchmarkNewDist(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	xs := make([]float64, 156_250)
	for i := range xs {
		xs[i] = 1 + r.Float64()*0.01
	}
	work := make([]float64, len(xs))
	b.Run("select", func(b *testing.B) {
		for b.Loop() {
			copy(work, xs)
			NewDist(work)
		}
	})
	b.Run("sort", func(b *testing.B) {
		for b.Loop() {
			copy(work, xs)
			slices.Sort(work)
			_ = Dist{P50: Quantile(work, 0.5), P90: Quantile(work, 0.9), P95: Quantile(work, 0.95), P99: Quantile(work, 0.99), Min: work[0], Max: work[len(work)-1]}
		}
	})
}
