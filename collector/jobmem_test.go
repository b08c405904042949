package collector

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// A job that sent one record costs the collector at most 256 KiB of heap
// (its tables' Parquet writers, ~1.2 MiB each, are made once a part has
// rows enough or rotates; they cost ~3 MiB a job before), and the memory
// budget charges it.
func TestOneRecordJobMemory(t *testing.T) {
	c, nc := startCollectorWith(t, Config{OutDir: t.TempDir(), Grace: time.Minute})
	// the live heap the last collection marked: HeapInuse also counted
	// what the server's and the collector's goroutines allocated since
	// (16 to 283 KiB a job, as it fell)
	heap := func() float64 {
		runtime.GC()
		runtime.GC()
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return float64(s[0].Value.Uint64())
	}
	before := heap()
	budget := c.mem.used.Load()
	const n = 200
	t0 := time.Now().Add(-time.Hour).UnixNano()
	for i := 0; i < n; i++ {
		job := fmt.Sprintf("one%d", i)
		rec := tps.StepRecord{Job: job, Step: 0, Rank: 0, WorldSize: 1, Tokens: 10, StartUnixNs: t0, EndUnixNs: t0 + 1e9, DurationNs: 1e9}
		nc.Publish(wire.StepsSubject(job, "n0"), wire.AppendSteps(nil, []tps.StepRecord{rec}))
	}
	nc.Flush()
	if err := c.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); c.Stats().StepsClosed < n && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	per := (heap() - before) / n
	t.Logf("heap per one-record job: %.0f KiB (%d steps closed)", per/1024, c.Stats().StepsClosed)
	if per > 256<<10 {
		t.Errorf("a one-record job costs %.0f KiB, over 256 KiB", per/1024)
	}
	if charged := (c.mem.used.Load() - budget) / n; charged < jobBaseBytes {
		t.Errorf("the memory budget charges %d bytes a job, want at least %d", charged, jobBaseBytes)
	}
}
