package kineto

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"runtime"
	"strconv"
	"testing"
)

// bigTrace is the real 2-rank NCCL trace of testdata with its events
// repeated n times (the same mix of kernels, launches and CPU operators).
func bigTrace(b *testing.B, n int) []byte {
	f, err := os.Open("testdata/hta_nccl_allreduce_2ranks.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		b.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		b.Fatal(err)
	}
	evs := bytes.TrimSpace(top["traceEvents"])
	body := evs[1 : len(evs)-1]
	var out bytes.Buffer
	out.WriteString(`{"distributedInfo":`)
	out.Write(top["distributedInfo"])
	out.WriteString(`,"traceEvents":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			out.WriteByte(',')
		}
		out.Write(body)
	}
	out.WriteString("]}")
	return out.Bytes()
}

// allocated is what fn allocates on the heap in all: an upper bound of
// what it can hold at once (the live heap's peak is below it).
func allocated(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// BenchmarkAnalyze: this package against a naive encoding/json decode of
// the same trace (every event into a map), same run; MB/s of uncompressed
// JSON and the bytes each allocates in all (a bound of what it holds).
//
//	go test -run '^$' -bench Analyze -benchtime 3x ./kineto
func BenchmarkAnalyze(b *testing.B) {
	for _, reps := range []int{4, 16} {
		data := bigTrace(b, reps)
		mb := float64(len(data)) / 1e6
		b.Run("kineto/"+strconv.Itoa(reps), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			var peak uint64
			for i := 0; i < b.N; i++ {
				peak = max(peak, allocated(func() {
					if _, err := Analyze(bytes.NewReader(data)); err != nil {
						b.Fatal(err)
					}
				}))
			}
			b.ReportMetric(mb, "trace_MB")
			b.ReportMetric(float64(peak)/1e6, "allocated_MB")
		})
		b.Run("naive-json/"+strconv.Itoa(reps), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			var peak uint64
			for i := 0; i < b.N; i++ {
				peak = max(peak, allocated(func() {
					var t struct {
						TraceEvents []map[string]any `json:"traceEvents"`
					}
					if err := json.NewDecoder(bytes.NewReader(data)).Decode(&t); err != nil {
						b.Fatal(err)
					}
				}))
			}
			b.ReportMetric(mb, "trace_MB")
			b.ReportMetric(float64(peak)/1e6, "allocated_MB")
		})
	}
}
