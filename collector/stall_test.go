package collector

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// One job's writer hangs (a command that waits, as a write to a hung disk
// would): the collector's loop keeps closing the other job's steps as
// they expire, and the live summary answers, because nothing waits on a
// writer while holding a job's lock (the loop's sends used to block there
// once the hung writer's queue of 8 was full, and with it every job and
// /api/summary). Once the writer resumes, every row of the stalled job is
// written.
func TestStalledWriterLeavesOtherJobs(t *testing.T) {
	cfg := Config{OutDir: t.TempDir(), Grace: 200 * time.Millisecond}
	c, nc := startCollectorWith(t, cfg)
	publishSteps(t, nc, "stuck", 0, 2)
	publishSteps(t, nc, "free", 0, 2)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	stuck := c.jobs["stuck"]
	c.mu.Unlock()
	hold := make(chan struct{})
	stuck.out.cluster.push(writeCmd[tps.ClusterStep]{hold: hold})
	stuck.out.ranks.push(writeCmd[tps.StepRecord]{hold: hold})
	stuck.out.events.push(writeCmd[tps.Event]{hold: hold})
	stuck.out.gpus.push(writeCmd[tps.GPUSample]{hold: hold})

	// steps with a rank missing: the loop closes them once Grace passes
	partial := func(job string, from, to int64) {
		var recs []tps.StepRecord
		t0 := time.Now().Add(-time.Hour).UnixNano()
		for s := from; s < to; s++ {
			for r := int64(0); r < 3; r++ {
				recs = append(recs, tps.StepRecord{Job: job, Step: s, Rank: r, WorldSize: 4, Tokens: 1000,
					StartUnixNs: t0 + s*2e9, EndUnixNs: t0 + s*2e9 + 1e9, DurationNs: 1e9})
			}
		}
		nc.Publish(wire.StepsSubject(job, "n0"), wire.AppendSteps(nil, recs))
		nc.Flush()
	}
	// ticks of the loop go by: each wants to rotate the stalled job's parts
	partial("stuck", 2, 6)
	time.Sleep(3 * time.Second)
	partial("free", 2, 6)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := make(chan LiveSummary, 1)
		go func() { got <- c.Summary() }()
		var s LiveSummary
		select {
		case s = <-got:
		case <-time.After(5 * time.Second):
			close(hold)
			t.Fatal("the live summary does not answer while one job's writer hangs")
		}
		var free, stuckClosed int64 = -1, -1
		for _, j := range s.Jobs {
			switch j.Job {
			case "free":
				free = j.StepsClosed
			case "stuck":
				stuckClosed = j.StepsClosed
			}
		}
		if free == 6 {
			t.Logf("with the stalled job's writer hung: free closed %d steps, stuck %d", free, stuckClosed)
			break
		}
		if time.Now().After(deadline) {
			close(hold)
			t.Fatalf("the other job's expired steps were not closed while one job's writer hangs: %d of 6", free)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(hold)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, job := range []string{"stuck", "free"} {
		rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(cfg.OutDir, job, trace.RankSteps))
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 2*4+4*3 {
			t.Errorf("%s: %d rank rows, want 20", job, len(rows))
		}
	}
}
