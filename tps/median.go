package tps

import (
	"math"
	"math/bits"
	"slices"
)

// medianKeep is how many values a Median holds.
const medianKeep = 1024

// Median is a streaming median in bounded memory: exact for up to Keep
// values (1024 by default), then the median of a uniform reservoir sample
// of Keep, whose rank error is about ±0.5/√Keep at one standard deviation
// (±1.6% for 1024) whatever the order of the stream. Once full it draws
// how many values to pass over before the next one it keeps (Li's
// algorithm L), so that a value passed over costs a count and a
// comparison: the report adds each of 10 M rank rows to one, where a
// draw for every value (algorithm R) was a tenth of its rank pass. The
// sampling is deterministic, so a report over the same trace gives the
// same numbers.
type Median struct {
	// Keep bounds the values held (0: 1024). Set it before the first Add.
	Keep int
	vals []float64
	n    uint64
	rng  uint64
	// once full: the count at which the next value is kept, and algorithm
	// L's running W
	next uint64
	w    float64
}

// Add observes x.
func (m *Median) Add(x float64) {
	m.n++
	if m.next == 0 {
		keep := m.Keep
		if keep <= 0 {
			keep = medianKeep
		}
		m.vals = append(m.vals, x)
		if len(m.vals) == keep {
			m.w = math.Exp(math.Log(m.uniform()) / float64(keep))
			m.skip()
		}
		return
	}
	if m.n < m.next {
		return
	}
	m.vals[m.below(uint64(len(m.vals)))] = x
	m.w *= math.Exp(math.Log(m.uniform()) / float64(len(m.vals)))
	m.skip()
}

// skip draws the count of the next value kept.
func (m *Median) skip() {
	s := math.Floor(math.Log(m.uniform()) / math.Log1p(-m.w))
	if !(s >= 0) || s > 1<<62 { // (NaN, or past any stream)
		m.next = math.MaxUint64
		return
	}
	m.next = m.n + uint64(s) + 1
}

// next64 is a splitmix64 step: cheap, deterministic.
func (m *Median) next64() uint64 {
	m.rng += 0x9e3779b97f4a7c15
	z := m.rng
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// uniform is in (0, 1].
func (m *Median) uniform() float64 { return float64(m.next64()>>11+1) / (1 << 53) }

// below is uniform in [0, n), by multiplication (Lemire), not division.
func (m *Median) below(n uint64) uint64 {
	j, _ := bits.Mul64(m.next64(), n)
	return j
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
