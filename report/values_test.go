package report

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// Values past their limit are in a file, and their Dist and MedianMAD
// (radix selection over the file) are NewDist's and MedianMAD's over the
// same values held, bit for bit: ties, negatives, infinities, zeros, a
// single value, sizes around the file's write block, values of one
// exponent (the selection's first pass puts them all in one bucket).
func TestValuesSpilledMatchHeld(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := map[string][]float64{
		"one":  {3.5},
		"two":  {2, 1},
		"ties": slices.Repeat([]float64{1, 2, 2, 3}, 300),
		"one exponent": func() []float64 {
			xs := make([]float64, 5000)
			for i := range xs {
				xs[i] = 1 + rng.Float64()*1e-9 // step times of 1 s and some ns
			}
			return xs
		}(),
		"mixed": func() []float64 {
			xs := make([]float64, valuesBuf*2+17)
			for i := range xs {
				xs[i] = rng.NormFloat64() * 1e6
			}
			xs[5], xs[99], xs[1000], xs[3000] = math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1)
			return xs
		}(),
		"integers": func() []float64 {
			xs := make([]float64, 30001)
			for i := range xs {
				xs[i] = float64(rng.IntN(50)) * 1e8 // ns
			}
			return xs
		}(),
	}
	for name, xs := range cases {
		v := values{limit: 100}
		for _, x := range xs {
			v.Append(x)
		}
		if len(xs) > v.limit && v.f == nil {
			t.Fatalf("%s: %d values, none in a file", name, len(xs))
		}
		got, err := v.Dist()
		if err != nil {
			t.Fatal(err)
		}
		med, mad, err := v.MedianMAD()
		if err != nil {
			t.Fatal(err)
		}
		v.Close()
		wmed, wmad := tps.MedianMAD(xs)
		want := tps.NewDist(slices.Clone(xs))
		if fmt.Sprint(got) != fmt.Sprint(want) || med != wmed || mad != wmad {
			t.Errorf("%s: spilled %+v, median %v, MAD %v; held %+v, %v, %v", name, got, med, mad, want, wmed, wmad)
		}
	}
}

// A file that cannot be written (a full disk) loses nothing: the values
// written and those buffered come back to memory and stay there.
func TestValuesWriteFailureKeepsValues(t *testing.T) {
	v := values{limit: 10}
	var xs []float64
	for i := range valuesBuf + 500 {
		x := float64(i%97) + 0.25
		xs = append(xs, x)
		v.Append(x)
		if i == 50 {
			// the same file, opened to read only: writes fail
			ro, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", v.f.Fd()))
			if err != nil {
				t.Skipf("no /proc: %v", err)
			}
			v.f.Close()
			v.f = ro
		}
	}
	if v.f != nil || v.err == nil || v.Len() != len(xs) {
		t.Fatalf("after a failed write: file %v, err %v, %d values", v.f, v.err, v.Len())
	}
	var back []float64
	if err := v.Each(func(b []float64) { back = append(back, b...) }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, xs) {
		t.Fatalf("%d values back of %d, or in another order", len(back), len(xs))
	}
	got, _ := v.Dist()
	if want := tps.NewDist(slices.Clone(xs)); got != want {
		t.Fatalf("Dist %+v, want %+v", got, want)
	}
}

// BenchmarkValuesDist: the quantiles of 1.56 M step times (a 100 M-row
// run's, 64 ranks) from a file by radix selection, against NewDist over
// them held (the baseline).
//
//	go test -run '^$' -bench ValuesDist ./report/
func BenchmarkValuesDist(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	xs := make([]float64, 1_562_500)
	for i := range xs {
		xs[i] = 1 + rng.NormFloat64()*0.01
	}
	var v values
	for _, x := range xs {
		v.Append(x)
	}
	defer v.Close()
	if v.f == nil {
		b.Fatal("not in a file")
	}
	b.Run("held", func(b *testing.B) {
		for b.Loop() {
			tps.NewDist(slices.Clone(xs))
		}
	})
	b.Run("file", func(b *testing.B) {
		for b.Loop() {
			if _, err := v.Dist(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
