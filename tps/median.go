package tps

import (
	"math/bits"
	"slices"
)

// medianKeep is how many values a Median holds.
const medianKeep = 1024

// Median is a streaming median in bounded memory: exact for up to Keep
// values (1024 by default), then the median of a uniform reservoir sample
// of Keep (Vitter's algorithm R), whose rank error is about ±0.5/√Keep at
// one standard deviation (±1.6% for 1024) whatever the order of the
// stream. The sampling is deterministic, so a report over the same trace
// gives the same numbers.
type Median struct {
	// Keep bounds the values held (0: 1024). Set it before the first Add.
	Keep int
	vals []float64
	n    uint64
	rng  uint64
}

// Add observes x.
func (m *Median) Add(x float64) {
	keep := m.Keep
	if keep <= 0 {
		keep = medianKeep
	}
	m.n++
	if len(m.vals) < keep {
		m.vals = append(m.vals, x)
		return
	}
	// splitmix64 step: cheap, deterministic
	m.rng += 0x9e3779b97f4a7c15
	z := m.rng
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	// a uniform index below n by multiplication (Lemire), not division
	if j, _ := bits.Mul64(z, m.n); j < uint64(keep) {
		m.vals[j] = x
	}
}

// Count is the number of observations.
func (m *Median) Count() int { return int(m.n) }

// Value is the median so far (0 with none).
func (m *Median) Value() float64 {
	if len(m.vals) == 0 {
		return 0
	}
	s := slices.Clone(m.vals)
	slices.Sort(s)
	return Quantile(s, 0.5)
}
