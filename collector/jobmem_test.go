package collector

import (
	"fmt"
	"runtime"
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
	heap := func() float64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapInuse)
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
	// the least of a few readings: in the full suite, beside other
	// packages' tests, one reading read 260 KiB a job where a run of the
	// package reads 12-15 (a real cost stays in every reading)
	per := (heap() - before) / n
	for try := 0; try < 5 && per > 256<<10; try++ {
		time.Sleep(200 * time.Millisecond)
		per = min(per, (heap()-before)/n)
	}
	t.Logf("heap per one-record job: %.0f KiB (%d steps closed)", per/1024, c.Stats().StepsClosed)
	if per > 256<<10 {
		t.Errorf("a one-record job costs %.0f KiB, over 256 KiB", per/1024)
	}
	if charged := (c.mem.used.Load() - budget) / n; charged < jobBaseBytes {
		t.Errorf("the memory budget charges %d bytes a job, want at least %d", charged, jobBaseBytes)
	}
}
