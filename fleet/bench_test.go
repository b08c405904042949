package fleet

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// BenchmarkNodePass is a node pass over an output folder of many small
// finished jobs (2 ranks, 10 steps; TPSPROF_FLEET_JOBS of them, 200 by
// default): the first pass computes and keeps every job's node rows; a
// pass of a process started on the folder reads them kept; the pass after
// it (a collector's next --nodes-every interval) finds them remembered.
// It reports each pass's time and peak heap.
func BenchmarkNodePass(b *testing.B) {
	jobs := 200
	if v, err := strconv.Atoi(os.Getenv("TPSPROF_FLEET_JOBS")); err == nil && v > 0 {
		jobs = v
	}
	out := b.TempDir()
	for j := range jobs {
		if _, err := tracetest.Write(out, fmt.Sprintf("job-%05d", j), tracetest.Run{World: 2, Steps: 10}); err != nil {
			b.Fatal(err)
		}
	}
	pass := func() (time.Duration, uint64, *Scan) {
		runtime.GC()
		var peak atomic.Uint64
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // samples the heap while the pass runs
			defer close(done)
			var m runtime.MemStats
			for {
				runtime.ReadMemStats(&m)
				if m.HeapAlloc > peak.Load() {
					peak.Store(m.HeapAlloc)
				}
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		t0 := time.Now()
		s, err := ScanDir(out, true)
		d := time.Since(t0)
		close(stop)
		<-done
		if err != nil || s.Jobs != jobs {
			b.Fatalf("%d of %d jobs: %v", s.Jobs, jobs, err)
		}
		return d, peak.Load(), s
	}
	b.ResetTimer()
	for range b.N {
		first, firstPeak, s := pass()
		if s.Computed != jobs {
			b.Fatalf("first pass computed %d of %d", s.Computed, jobs)
		}
		keptCache.Forget() // as a process started on the folder
		again, againPeak, s := pass()
		if s.Computed != 0 {
			b.Fatalf("a pass after it computed %d", s.Computed)
		}
		next, nextPeak, _ := pass() // the collector's next interval
		b.ReportMetric(first.Seconds(), "first_pass_s")
		b.ReportMetric(again.Seconds(), "kept_pass_s")
		b.ReportMetric(next.Seconds(), "next_pass_s")
		b.ReportMetric(float64(firstPeak)/(1<<20), "first_peak_MiB")
		b.ReportMetric(float64(againPeak)/(1<<20), "kept_peak_MiB")
		b.ReportMetric(float64(nextPeak)/(1<<20), "next_peak_MiB")
		os.RemoveAll(out + "/" + Table)
	}
}

// BenchmarkJobNodesLong is JobNodes on one long job (2 ranks on 2 hosts,
// TPSPROF_FLEET_STEPS steps, 200,000 by default): its time and peak heap,
// which grow with the steps (a step's top two hosts are held: 40 bytes).
func BenchmarkJobNodesLong(b *testing.B) {
	steps := 200_000
	if v, err := strconv.Atoi(os.Getenv("TPSPROF_FLEET_STEPS")); err == nil && v > 0 {
		steps = v
	}
	out := b.TempDir()
	w, err := trace.NewPartWriter[tps.StepRecord](out, "long", trace.RankSteps, trace.WriterOptions{WriterID: "b"})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]tps.StepRecord, 0, 8192)
	for s := range steps {
		at := tracetest.T0 + int64(s)*1e9
		buf = append(buf,
			tps.StepRecord{Job: "long", Step: int64(s), Rank: 0, WorldSize: 2, Node: "a", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 8e8 + int64(s%7)*1e6},
			tps.StepRecord{Job: "long", Step: int64(s), Rank: 1, WorldSize: 2, Node: "b", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 9e8})
		if len(buf) == cap(buf) {
			if err := w.Write(buf); err != nil {
				b.Fatal(err)
			}
			buf = buf[:0]
		}
	}
	if err := w.Write(buf); err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		var peak atomic.Uint64
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			var m runtime.MemStats
			for {
				runtime.ReadMemStats(&m)
				peak.Store(max(peak.Load(), m.HeapAlloc))
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		t0 := time.Now()
		rows, err := JobNodes(out+"/long", "long")
		d := time.Since(t0)
		close(stop)
		<-done
		if err != nil || len(rows) != 2 || rows[0].Steps != int64(steps-WarmSteps) {
			b.Fatalf("%+v, %v", rows, err)
		}
		b.ReportMetric(d.Seconds(), "pass_s")
		b.ReportMetric(float64(peak.Load())/(1<<20), "peak_MiB")
	}
}
