package report

import (
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// BenchmarkReportLongRun writes a long run (64 ranks × 156,250 steps, 10 M
// rank rows; TPSPROF_LONG_STEPS changes the steps: 1,562,500 is 100 M;
// TPSPROF_LONG_WORLD the ranks; TPSPROF_LONG_PLOTS=1 reports the whole run
// with what its plots draw, as tpsprof report does by default;
// TPSPROF_LONG_GPU=1 adds every GPU's readings every 2 s, which the energy
// join reads) as
// the collector would (tracetest's jittered rows, rank_windows too;
// cluster_steps in row groups of 4,096 rows, where a collector's parts,
// rotated every minute, hold a minute of steps each), then reports it
// whole and its last 1% (--last), each once a loop. It fails when the last
// 1% reads more than 2% of the tables' bytes, footers included (at 64 ranks
// or more). Reports
// seconds, peak heap (the live heap sampled every 50 ms over the
// generation's collected garbage) and the share of bytes read of each.
// TPSPROF_PEAK_PROFILE=file writes the heap profile at the whole run's
// peak there, and at the last 1%'s to file.last (add -memprofilerate 4096
// for finer ones).
//
//	TPSPROF_LONG_STEPS=1562500 go test -run '^$' -bench LongRun -benchtime 1x -timeout 30m ./report/
func BenchmarkReportLongRun(b *testing.B) {
	steps := 156_250
	if v, err := strconv.Atoi(os.Getenv("TPSPROF_LONG_STEPS")); err == nil && v >= 1000 {
		steps = v
	}
	world := 64
	if v, err := strconv.Atoi(os.Getenv("TPSPROF_LONG_WORLD")); err == nil && v > 0 && v <= 1<<16 {
		world = v
	}
	plots := os.Getenv("TPSPROF_LONG_PLOTS") == "1" // the whole run with what its plots draw
	run := tracetest.Run{World: world, Steps: steps, Jitter: true, Windows: true, ClusterRowsPerGroup: 4096, ClusterRowsPerPart: 16384,
		// the writer's default row group of 64 Ki rows, or 1,024 steps when
		// fewer ranks (a row group of a longer time than a collector's
		// parts hold), 16 a part: a part's footer grows with its row groups
		RankRowsPerGroup: min(int64(world)*1024, 1<<16), RankRowsPerPart: 16 * min(int64(world)*1024, 1<<16)}
	if os.Getenv("TPSPROF_LONG_GPU") == "1" {
		run.Watts, run.GPUEvery = 400, 2 // the energy join, from a reading every 2 s
	}
	dir, err := tracetest.Write(b.TempDir(), "long", run)
	if err != nil {
		b.Fatal(err)
	}
	var whole, last time.Duration
	var wholePeak, lastPeak uint64
	var wholeShare, lastShare float64
	var src string
	for b.Loop() {
		var rep *Report
		t := time.Now()
		peakProfile = os.Getenv("TPSPROF_PEAK_PROFILE") // the whole run's
		peak := heapPeak(func() {
			if plots {
				rep, _, err = AnalyzeWithPlots(dir, Options{Warmup: tps.AutoWarmup})
			} else {
				rep, err = Analyze(dir, Options{Warmup: tps.AutoWarmup})
			}
		})
		whole += time.Since(t)
		peakProfile = ""
		if err != nil {
			b.Fatal(err)
		}
		wholePeak = max(wholePeak, peak)
		wholeShare = float64(rep.BytesRead) / float64(rep.BytesInTables)
		src = rep.TablesRead[len(rep.TablesRead)-1]
		rep = nil // not live while the next is measured
		t = time.Now()
		if f := os.Getenv("TPSPROF_PEAK_PROFILE"); f != "" {
			peakProfile = f + ".last"
		}
		peak = heapPeak(func() { rep, err = Analyze(dir, Options{Warmup: tps.AutoWarmup, Select: Selection{Last: steps / 100}}) })
		last += time.Since(t)
		peakProfile = ""
		if err != nil {
			b.Fatal(err)
		}
		lastPeak = max(lastPeak, peak)
		lastShare = float64(rep.BytesRead) / float64(rep.BytesInTables)
		// (at fewer ranks the cluster rows, whose every part's footer the
		// selection's first pass reads, are a larger share of the bytes)
		if rep.Summary.Steps != steps/100 || (lastShare > 0.02 && world >= 64) {
			b.Fatalf("--last %d: %d steps, read %d B of %d (%.2f%%): want at most 2%%", steps/100, rep.Summary.Steps, rep.BytesRead, rep.BytesInTables, 100*lastShare)
		}
	}
	n := float64(b.N)
	b.Logf("%d rank rows; the whole run's per-rank figures from %s", world*steps, src)
	b.ReportMetric(whole.Seconds()/n, "whole_s")
	b.ReportMetric(float64(wholePeak)/(1<<20), "whole_peak_MiB")
	b.ReportMetric(100*wholeShare, "whole_read_%")
	b.ReportMetric(last.Seconds()/n, "last1pct_s")
	b.ReportMetric(float64(lastPeak)/(1<<20), "last1pct_peak_MiB")
	b.ReportMetric(100*lastShare, "last1pct_read_%")
}

// peakProfile, when set, is where heapPeak writes the heap profile (as of
// the last collection) at each new peak.
var peakProfile string

// heapPeak runs fn and returns the live heap's peak while it ran, sampled
// every 50 ms, after a collection.
func heapPeak(fn func()) uint64 {
	runtime.GC()
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > peak.Load() {
				peak.Store(ms.HeapInuse)
				if peakProfile != "" {
					if w, err := os.Create(peakProfile); err == nil {
						pprof.Lookup("heap").WriteTo(w, 0)
						w.Close()
					}
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	fn()
	close(stop)
	<-done
	return peak.Load()
}

// BenchmarkReportStreamedVsHeld reports a run of 200,000 steps (2 ranks)
// whose cluster rows are in parts of 600 rows, as a collector rotating
// its parts every minute writes them (334 parts), twice a loop: the rows
// held whole (the baseline) and streamed in chunks (as Analyze does past
// 64 Ki steps). Reports both and their ratio.
//
//	go test -run '^$' -bench StreamedVsHeld -benchtime 3x ./report/
func BenchmarkReportStreamedVsHeld(b *testing.B) {
	dir, err := tracetest.Write(b.TempDir(), "parts", tracetest.Run{World: 2, Steps: 200_000, Jitter: true, ClusterRowsPerPart: 600})
	if err != nil {
		b.Fatal(err)
	}
	var held, streamed time.Duration
	for b.Loop() {
		old := clusterChunk
		clusterChunk = 1 << 30
		t := time.Now()
		_, err := Analyze(dir, Options{Warmup: tps.AutoWarmup})
		held += time.Since(t)
		clusterChunk = old
		if err != nil {
			b.Fatal(err)
		}
		t = time.Now()
		if _, err := Analyze(dir, Options{Warmup: tps.AutoWarmup}); err != nil {
			b.Fatal(err)
		}
		streamed += time.Since(t)
	}
	b.ReportMetric(held.Seconds()/float64(b.N), "held_s")
	b.ReportMetric(streamed.Seconds()/float64(b.N), "streamed_s")
	b.ReportMetric(float64(streamed)/float64(held), "ratio")
}
