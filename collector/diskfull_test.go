package collector

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// smallDisk mounts a tmpfs of size bytes for the test (it needs root).
func smallDisk(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a size-limited tmpfs (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes a file until the disk is full; removing it frees the disk.
func fill(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return f.Name()
		}
	}
}

// A durable collector whose output disk fills for a while loses nothing
// and writes nothing twice: the parts it could not finalise leave their
// messages in the stream, the job restarts (as a collector restart would,
// for it alone), the stream redelivers them and they are written once the
// disk has room. Before, the running collector took the redelivered
// records for duplicates or late ones and acknowledged them: 61 of 200
// cluster rows were lost and 168 rank rows written twice.
func TestDurableDiskFullLosesNothing(t *testing.T) {
	out := smallDisk(t, 4<<20)
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	defer func(d time.Duration) { redeliverAfter = d }(redeliverAfter)
	redeliverAfter = 3 * time.Second
	c, err := New(Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Durable: true, Grace: time.Minute,
		Writer: trace.WriterOptions{PartAge: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	const world = 4
	t0 := time.Now().Add(-time.Hour).UnixNano()
	publish := func(from, to int) {
		for s := from; s < to; s++ {
			for r := range world {
				rec := tps.StepRecord{Job: "full", Step: int64(s), Rank: int64(r), WorldSize: world, Tokens: 100,
					StartUnixNs: t0 + int64(s)*1e9, EndUnixNs: t0 + int64(s)*1e9 + 5e8, DurationNs: 5e8}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := js.Publish(ctx, wire.StepsSubject("full", fmt.Sprint("n", r)), wire.AppendSteps(nil, []tps.StepRecord{rec}))
				cancel()
				if err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	publish(0, 50)
	if err := c.Sync(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a checkpoint or two with room
	filler := fill(t, out)
	publish(50, 120)
	deadline := time.Now().Add(30 * time.Second)
	for c.Stats().JobResets == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no failed checkpoint with the disk full: %+v", c.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A second reset while the first one's messages are still on their way
	// back (handed back after 3 s): more steps fail to be written, then the
	// disk has room and 74 later steps close before those messages return.
	// The fresh job must still aggregate them (the redo set carries over),
	// not take them for steps closed long ago (seen in CI: 45 rows lost).
	publish(120, 126)
	for c.Stats().JobResets < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second reset with the disk still full: %+v", c.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	os.Remove(filler)
	publish(126, 200)
	// Everything lands once the redelivered messages are written again.
	read := func() (map[int64]int, map[[2]int64]int, []tps.ClusterStep) {
		cl, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "full", trace.ClusterSteps))
		rk, _ := trace.ReadAll[tps.StepRecord](filepath.Join(out, "full", trace.RankSteps))
		steps, ranks := map[int64]int{}, map[[2]int64]int{}
		for _, r := range cl {
			steps[r.Step]++
		}
		for _, r := range rk {
			ranks[[2]int64{r.Step, r.Rank}]++
		}
		return steps, ranks, cl
	}
	deadline = time.Now().Add(60 * time.Second)
	for {
		steps, ranks, _ := read()
		if len(steps) == 200 && len(ranks) == 200*world {
			break
		}
		if time.Now().After(deadline) {
			var missing []int64
			for s := int64(0); s < 200; s++ {
				for r := int64(0); r < world; r++ {
					if ranks[[2]int64{s, r}] == 0 && len(missing) < 40 {
						missing = append(missing, s*10+r)
					}
				}
			}
			_, rerr := trace.ReadAll[tps.StepRecord](filepath.Join(out, "full", trace.RankSteps))
			files, _ := trace.PartFiles(filepath.Join(out, "full", trace.RankSteps))
			for _, f := range files {
				rows, err := trace.ReadFile[tps.StepRecord](f)
				lo, hi := int64(-1), int64(-1)
				for i, r := range rows {
					if i == 0 || r.Step < lo {
						lo = r.Step
					}
					hi = max(hi, r.Step)
				}
				fi, _ := os.Stat(f)
				t.Logf("part %s: %d rows, steps %d-%d, err %v, mod %v", filepath.Base(f), len(rows), lo, hi, err, fi.ModTime().Format("15:04:05.000"))
			}
			t.Logf("read error: %v", rerr)
			t.Fatalf("after the disk had room again: %d of 200 steps, %d of %d rank rows (missing step*10+rank: %v); stats %+v", len(steps), len(ranks), 200*world, missing, c.Stats())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := c.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	steps, ranks, cl := read()
	for s, n := range steps {
		if n != 1 {
			t.Errorf("step %d: %d cluster rows", s, n)
		}
	}
	for k, n := range ranks {
		if n != 1 {
			t.Errorf("step %d rank %d: %d rank rows", k[0], k[1], n)
		}
	}
	for _, r := range cl {
		if r.RanksReported != world {
			t.Errorf("step %d: %d of %d ranks", r.Step, r.RanksReported, world)
		}
	}
	// Each record was published once and each step closed once as far
	// as the counters say: what the resets handed back is counted apart
	// (the counters read 1104 records and 276 steps closed for 800 and
	// 200 before).
	if st := c.Stats(); st.WriteErrors == 0 || st.Records != 200*world || st.StepsClosed != 200 || st.Redelivered == 0 || st.Reclosed == 0 {
		t.Errorf("write errors %d, records %d (want %d), steps closed %d (want 200), redelivered %d, reclosed %d: %+v",
			st.WriteErrors, st.Records, 200*world, st.StepsClosed, st.Redelivered, st.Reclosed, st)
	}
}

// In core mode a full disk loses the rows of the parts it could not
// write, and every one of them is counted: rows on disk plus rows_lost
// is every row (rank and cluster). Before, rows_lost stayed 0 while 704
// rank and 85 cluster rows were lost.
func TestCoreDiskFullCountsRowsLost(t *testing.T) {
	out := smallDisk(t, 2<<20)
	c, nc := startCollectorWith(t, Config{OutDir: out, Grace: time.Minute, Writer: trace.WriterOptions{PartAge: 100 * time.Millisecond}})
	publishSteps(t, nc, "core", 0, 20)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	filler := fill(t, out)
	publishSteps(t, nc, "core", 20, 60)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // rotations fail
	os.Remove(filler)
	publishSteps(t, nc, "core", 60, 80)
	if err := c.Sync(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	rk, _ := trace.ReadAll[tps.StepRecord](filepath.Join(out, "core", trace.RankSteps))
	cl, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "core", trace.ClusterSteps))
	st := c.Stats()
	if st.RowsLost == 0 || int64(len(rk)+len(cl))+st.RowsLost != 80*4+80 {
		t.Errorf("%d rank + %d cluster rows on disk, %d counted lost; want %d in all (stats %+v)", len(rk), len(cl), st.RowsLost, 80*4+80, st)
	}
}
