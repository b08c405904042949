package tps

import (
	"math"
	"math/bits"
	"slices"
)

// nthElement reorders xs so that xs[k] is the value a sort would put
// there, with no larger value before it and no smaller one after it
// (quickselect, O(n) on average, where a sort is O(n log n): the run's step
// times and TPS were sorted six times a report, a quarter of a 156,250-step
// report's own work when steps vary). After too many rounds (an adversarial
// order) it sorts what is left. xs must hold no NaN.
func nthElement(xs []float64, k int) {
	lo, hi := 0, len(xs)-1
	budget := 2*bits.Len(uint(len(xs))) + 8
	for hi > lo {
		if budget--; budget < 0 || hi-lo < 16 {
			slices.Sort(xs[lo : hi+1])
			return
		}
		// median of three as the pivot
		mid := lo + (hi-lo)/2
		a, b, c := xs[lo], xs[mid], xs[hi]
		p := max(min(a, b), min(max(a, b), c))
		i, j := lo, hi
		for i <= j {
			for xs[i] < p {
				i++
			}
			for xs[j] > p {
				j--
			}
			if i <= j {
				xs[i], xs[j] = xs[j], xs[i]
				i++
				j--
			}
		}
		// [lo, j] ≤ p ≤ [i, hi]; between them, values equal to p
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return
		}
	}
}

// quantileOf is Quantile of xs as if sorted (the same value), reordering
// xs instead of sorting it (xs holding a NaN is sorted).
func quantileOf(xs []float64, q float64) float64 {
	n := len(xs)
	if n == 0 {
		return math.NaN()
	}
	if hasNaN(xs) {
		slices.Sort(xs)
		return Quantile(xs, q)
	}
	h := q * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return slices.Max(xs)
	}
	nthElement(xs, lo)
	if h == float64(lo) {
		return xs[lo]
	}
	return xs[lo] + (h-float64(lo))*(slices.Min(xs[lo+1:])-xs[lo])
}

func hasNaN(xs []float64) bool {
	for _, x := range xs {
		if x != x {
			return true
		}
	}
	return false
}
