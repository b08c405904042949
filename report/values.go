package report

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"

	"github.com/tpsprof/tpsprof/tps"
)

// valuesInMemory is how many values a values holds in memory by default
// (8 B each: 2 MiB; a report holds three). Past it, it writes them to an
// unlinked temporary file, and its quantiles come from passes over that
// file (radix selection): the same numbers in bounded memory, so that a
// report's memory does not grow with the run's steps (37 MB less at
// 1.56 M steps). The report's own: tps, which does no I/O, holds its
// series in memory (tps.Series).
const valuesInMemory = 1 << 18

// values is a sequence of float64, in memory up to its limit and in a
// temporary file past it; nothing is lost when the file cannot be written
// (a full disk): the values stay in memory. It is a tps.Series. The zero
// values is empty and ready, its limit valuesInMemory. Close removes the
// file.
type values struct {
	limit   int // values held in memory at most (0: valuesInMemory)
	mem     []float64
	n       int
	f       *os.File
	buf     []byte // values not yet written to f
	written int    // values written to f
	// err is why the values are in memory past the limit
	err error
}

// newValues is values that hold at most limit in memory (0:
// valuesInMemory).
func newValues(limit int) *values { return &values{limit: limit} }

func (v *values) inMemory() int { return cmp.Or(v.limit, valuesInMemory) }

const valuesBuf = 8192 // values written at once

// Len is how many values were appended.
func (v *values) Len() int { return v.n }

// Append adds x at the end.
func (v *values) Append(x float64) {
	v.n++
	if v.f == nil {
		v.mem = append(v.mem, x)
		if len(v.mem) > v.inMemory() && v.err == nil {
			v.spill()
		}
		return
	}
	v.buf = binary.LittleEndian.AppendUint64(v.buf, math.Float64bits(x))
	if len(v.buf) >= 8*valuesBuf {
		v.write()
	}
}

// spill moves the values held to a new temporary file; when it cannot,
// they stay.
func (v *values) spill() {
	f, err := os.CreateTemp("", "tpsprof-values-*")
	if err != nil {
		v.err = err
		return
	}
	os.Remove(f.Name()) // gone when closed, or when the process ends
	raw := make([]byte, 0, 8*valuesBuf)
	for at := 0; at < len(v.mem); at += valuesBuf {
		raw = raw[:0]
		for _, x := range v.mem[at:min(at+valuesBuf, len(v.mem))] {
			raw = binary.LittleEndian.AppendUint64(raw, math.Float64bits(x))
		}
		if _, err := f.WriteAt(raw, int64(at)*8); err != nil {
			f.Close()
			v.err = err
			return
		}
	}
	v.f, v.buf, v.written, v.mem = f, raw[:0], len(v.mem), nil
}

// write writes the buffered values to the file; when it cannot, the
// values come back to memory (read back, with the buffer's) and stay
// there.
func (v *values) write() bool {
	if len(v.buf) == 0 {
		return true
	}
	k, err := v.f.WriteAt(v.buf, int64(v.written)*8)
	if err == nil {
		v.written += len(v.buf) / 8
		v.buf = v.buf[:0]
		return true
	}
	v.written += k / 8
	var mem []float64
	rerr := v.each(func(b []float64) { mem = append(mem, b...) })
	v.f.Close()
	v.f = nil
	for b := v.buf[(k/8)*8:]; len(b) >= 8; b = b[8:] {
		mem = append(mem, math.Float64frombits(binary.LittleEndian.Uint64(b)))
	}
	v.mem = mem
	v.buf, v.written = nil, 0
	v.err = cmp.Or(rerr, fmt.Errorf("report: values kept in memory: %w", err))
	return false
}

// flush writes the buffered values to the file; when it cannot, the
// values are in memory after it.
func (v *values) flush() {
	if v.f != nil {
		v.write()
	}
}

// Each calls fn with the values in order, a block at a time (valid during
// the call).
func (v *values) Each(fn func([]float64)) error {
	v.flush()
	if v.f == nil {
		fn(v.mem)
		return nil
	}
	return v.each(fn)
}

// each reads the values written to the file.
func (v *values) each(fn func([]float64)) error {
	raw := make([]byte, 8*valuesBuf)
	xs := make([]float64, valuesBuf)
	for at := 0; at < v.written; {
		k := min(valuesBuf, v.written-at)
		if _, err := v.f.ReadAt(raw[:8*k], int64(at)*8); err != nil {
			return fmt.Errorf("report: reading values back: %w", err)
		}
		for i := range k {
			xs[i] = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:]))
		}
		fn(xs[:k])
		at += k
	}
	return nil
}

// Close removes the temporary file, if any.
func (v *values) Close() {
	if v.f != nil {
		v.f.Close()
		v.f = nil
	}
}

// Dist is tps.NewDist of the values (it may reorder those in memory).
func (v *values) Dist() (tps.Dist, error) {
	v.flush()
	if v.f == nil {
		return tps.NewDist(v.mem), nil
	}
	var sum float64
	lo, hi := math.Inf(1), math.Inf(-1)
	nan := false
	if err := v.each(func(xs []float64) {
		for _, x := range xs {
			sum += x
			lo, hi = min(lo, x), max(hi, x)
			nan = nan || x != x
		}
	}); err != nil {
		return tps.Dist{}, err
	}
	qs := []float64{0.50, 0.90, 0.95, 0.99}
	got, err := quantilesOf(v.each, v.n, qs)
	if err != nil {
		return tps.Dist{}, err
	}
	if nan {
		lo, hi = math.NaN(), math.NaN()
	}
	return tps.Dist{Mean: sum / float64(v.n), Min: lo, Max: hi, P50: got[0], P90: got[1], P95: got[2], P99: got[3]}, nil
}

// MedianMAD is tps.MedianMAD of the values.
func (v *values) MedianMAD() (median, mad float64, err error) {
	if v.n == 0 {
		return math.NaN(), math.NaN(), nil
	}
	v.flush()
	if v.f == nil {
		median, mad = tps.MedianMAD(v.mem)
		return median, mad, nil
	}
	m, err := quantilesOf(v.each, v.n, []float64{0.5})
	if err != nil {
		return 0, 0, err
	}
	median = m[0]
	dev := make([]float64, valuesBuf)
	d, err := quantilesOf(func(fn func([]float64)) error {
		return v.each(func(xs []float64) {
			for i, x := range xs {
				dev[i] = math.Abs(x - median)
			}
			fn(dev[:len(xs)])
		})
	}, v.n, []float64{0.5})
	if err != nil {
		return 0, 0, err
	}
	return median, d[0], nil
}

// quantilesOf is quantileOf at each q of the n values each gives, found
// by radix selection of the order statistics they need.
func quantilesOf(each func(func([]float64)) error, n int, qs []float64) ([]float64, error) {
	var ranks []int
	for _, q := range qs {
		h := q * float64(n-1)
		lo := int(math.Floor(h))
		ranks = append(ranks, min(lo, n-1), min(lo+1, n-1))
	}
	stats, err := orderStats(each, ranks)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(qs))
	for i, q := range qs {
		h := q * float64(n-1)
		lo := int(math.Floor(h))
		a, b := stats[2*i], stats[2*i+1]
		switch {
		case lo >= n-1:
			out[i] = stats[2*i] // the largest
		case h == float64(lo):
			out[i] = a
		default:
			out[i] = a + (h-float64(lo))*(b-a)
		}
	}
	return out, nil
}

// orderKey orders float64 as slices.Sort does: NaN first, then -Inf to
// +Inf.
func orderKey(x float64) uint64 {
	if x != x {
		return 0
	}
	b := math.Float64bits(x)
	if b>>63 == 1 {
		return ^b
	}
	return b | 1<<63
}

func fromOrderKey(k uint64) float64 {
	switch {
	case k == 0:
		return math.NaN()
	case k>>63 == 1:
		return math.Float64frombits(k &^ (1 << 63))
	}
	return math.Float64frombits(^k)
}

var errTooMany = errors.New("report: more than 2³² values")

// orderStats are the values at ranks (0-based, of the values sorted) of
// the values each gives: four passes, each fixing 16 more bits of every
// rank's value's order key by counting, over the values that share the
// bits already fixed.
func orderStats(each func(func([]float64)) error, ranks []int) ([]float64, error) {
	type target struct {
		prefix uint64 // the key's bits fixed so far
		rank   int    // its rank among the values that share them
		hist   int    // its histogram this pass
	}
	ts := make([]target, len(ranks))
	for i, r := range ranks {
		ts[i].rank = r
	}
	for pass := range 4 {
		shift := uint(48 - 16*pass) // the bits this pass fixes: [shift, shift+16)
		// one histogram per distinct prefix
		var prefixes []uint64
		for i := range ts {
			k := -1
			for j, p := range prefixes {
				if p == ts[i].prefix {
					k = j
				}
			}
			if k < 0 {
				k = len(prefixes)
				prefixes = append(prefixes, ts[i].prefix)
			}
			ts[i].hist = k
		}
		hists := make([][1 << 16]uint32, len(prefixes))
		var count int
		err := each(func(xs []float64) {
			count += len(xs)
			for _, x := range xs {
				k := orderKey(x)
				top := k >> (shift + 16) // pass 0: 0 for every value (a shift by 64)
				d := (k >> shift) & 0xffff
				for j, p := range prefixes {
					if top == p {
						hists[j][d]++
					}
				}
			}
		})
		if err != nil {
			return nil, err
		}
		if count >= 1<<32 {
			return nil, errTooMany
		}
		for i := range ts {
			t := &ts[i]
			h := &hists[t.hist]
			d := 0
			for ; d < 1<<16; d++ {
				if t.rank < int(h[d]) {
					break
				}
				t.rank -= int(h[d])
			}
			if d == 1<<16 {
				return nil, fmt.Errorf("report: rank %d past the %d values read", ranks[i], count)
			}
			t.prefix = t.prefix<<16 | uint64(d)
		}
	}
	out := make([]float64, len(ts))
	for i, t := range ts {
		out[i] = fromOrderKey(t.prefix)
	}
	return out, nil
}
