package tps

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// sameSketch compares two sketches, an empty list of bins as none.
func sameSketch(a, b Sketch) bool {
	if len(a.Bins) == 0 && len(b.Bins) == 0 {
		a.Bins, b.Bins = nil, nil
	}
	return reflect.DeepEqual(a, b)
}

// The fast decoder reads what json.Marshal writes for sketches as
// encoding/json does.
func TestDecodeSketchJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	var fast Sketch
	for trial := range 2000 {
		var s Sketch
		for range r.IntN(300) {
			s.Add(r.ExpFloat64() * []float64{1e-9, 1e-3, 1, 1e9}[trial%4])
		}
		if trial%7 == 0 {
			s.Add(0) // the zero count
		}
		b, err := json.Marshal(&s)
		if err != nil {
			t.Fatal(err)
		}
		if !decodeSketchJSON(b, &fast) {
			t.Fatalf("trial %d: fast path refused %s", trial, b)
		}
		var want Sketch
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if !sameSketch(fast, want) {
			t.Fatalf("trial %d: %+v, want %+v", trial, fast, want)
		}
	}
	// what it leaves to encoding/json
	for _, b := range []string{`{ "count":1}`, `{"COUNT":1}`, `{"count":+1}`, `{"count":1.5}`, `{"sum":inf}`, `{"sum":0x10}`, `{"count":01}`,
		`{"offset":4294967296}`, `{"count":1}x`, `{"bins":[1,]}`, `{"other":1}`, `{"sum":1e400}`, `{"count":1,}`} {
		if decodeSketchJSON([]byte(b), &fast) {
			t.Errorf("fast path took %s", b)
		}
	}
}

// Whatever the fast decoder takes, encoding/json takes too and reads the
// same.
func FuzzDecodeSketchJSON(f *testing.F) {
	s := Sketch{}
	for _, x := range []float64{0, 1e-3, 2, 2, 7e5} {
		s.Add(x)
	}
	b, _ := json.Marshal(&s)
	f.Add(b)
	f.Add([]byte(`{"count":0,"sum":0,"min":0,"max":0,"offset":0,"bins":null}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast Sketch
		fast.Bins = make([]int64, 0, 4)
		if !decodeSketchJSON(data, &fast) {
			return
		}
		var want Sketch
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("fast path took %q, which encoding/json refuses: %v", data, err)
		}
		if !sameSketch(fast, want) {
			t.Fatalf("%q: %+v, want %+v", data, fast, want)
		}
		_ = slices.Clone(fast.Bins)
	})
}

// BenchmarkSketchJSON: a rank window's sketch decoded by the fast path
// and by encoding/json.
//
//	go test -run '^$' -bench SketchJSON ./tps/
func BenchmarkSketchJSON(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	var s Sketch
	for range 100 {
		s.Add(1e9 * (1 + 0.01*r.Float64()))
	}
	data, _ := json.Marshal(&s)
	var out Sketch
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			decodeSketchJSON(data, &out)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			out = Sketch{Bins: out.Bins[:0]}
			json.Unmarshal(data, &out)
		}
	})
}
