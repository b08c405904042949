package kineto

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"
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

// BenchmarkAnalyzeStream: traces in Kineto's layout (streamTrace, 400
// kernels a step) of 500 and 2,000 steps, read from a file: the live
// heap's peak (sampled every 2 ms) stays flat while the trace grows
// fourfold.
//
//	go test -run '^$' -bench AnalyzeStream -benchtime 3x ./kineto
func BenchmarkAnalyzeStream(b *testing.B) {
	for _, n := range []int{500, 2000} {
		path := filepath.Join(b.TempDir(), "trace.json")
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		cw := &countWriter{w: f}
		if err := streamTrace(cw, n, 400); err != nil {
			b.Fatal(err)
		}
		f.Close()
		b.Run("steps/"+strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(cw.n)
			var peak uint64
			for i := 0; i < b.N; i++ {
				runtime.GC()
				stop := make(chan struct{})
				done := make(chan uint64)
				go func() {
					s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
					var p uint64
					tick := time.NewTicker(2 * time.Millisecond)
					defer tick.Stop()
					for {
						metrics.Read(s)
						p = max(p, s[0].Value.Uint64())
						select {
						case <-stop:
							done <- p
							return
						case <-tick.C:
						}
					}
				}()
				f, err := os.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := analyze(f, Options{SpillDir: b.TempDir()}); err != nil {
					b.Fatal(err)
				}
				f.Close()
				close(stop)
				peak = max(peak, <-done)
			}
			b.ReportMetric(float64(cw.n)/1e6, "trace_MB")
			b.ReportMetric(float64(peak)/1e6, "peak_heap_MB")
		})
	}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
