package collector

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/internal/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// batches encodes steps × ranks records as agents send them: per node of 8
// ranks... grouped into batches of at most 1024 records of one step.
func batches(job string, ranks, steps int) (msgs [][]byte, lastOfStep []int) {
	t0 := time.Now().Add(-time.Hour - time.Duration(steps)*time.Second).UnixNano()
	recs := make([]tps.StepRecord, 0, 1024)
	for s := 0; s < steps; s++ {
		for r := 0; r < ranks; r++ {
			recs = append(recs, tps.StepRecord{Job: job, Step: int64(s), Rank: int64(r), WorldSize: int64(ranks), Node: fmt.Sprintf("node-%d", r/8),
				StartUnixNs: t0 + int64(s)*1e9, EndUnixNs: t0 + int64(s)*1e9 + 9e8, DurationNs: 9e8 - int64(r%5)*1e6,
				Tokens: 8192, ExposedCommNs: 1e8, CommNs: 3e8, PPWaitNs: 5e7})
			if len(recs) == 1024 || r == ranks-1 {
				msgs = append(msgs, wire.AppendSteps(nil, recs))
				recs = recs[:0]
			}
		}
		lastOfStep = append(lastOfStep, len(msgs)-1)
	}
	return msgs, lastOfStep
}

// rawRate publishes msgs on subject to a subscriber that only counts them
// and returns the records per second moved (records in total).
func rawRate(b *testing.B, url, subject string, msgs [][]byte, records int64) float64 {
	pub, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	sub, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Close()
	var got atomic.Int64
	done := make(chan struct{})
	sub.Subscribe(subject, func(m *nats.Msg) {
		if got.Add(1) == int64(len(msgs)) {
			close(done)
		}
	})
	sub.Flush()
	t0 := time.Now()
	for _, m := range msgs {
		pub.Publish(subject, m)
	}
	<-done
	return float64(records) / time.Since(t0).Seconds()
}

// BenchmarkCollectorEndToEnd publishes agent-style step batches to the
// collector (NATS → decode → aggregation → Parquet) and, in the same run,
// the same bytes to a raw NATS subscriber that only counts them, once
// before and once after the collector (the mean is the baseline: the
// machine's speed drifts). It reports records/s of both and their ratio,
// a second baseline of raw NATS carrying one message per record (the same
// record bytes, unbatched: what a collector without batching could at most
// do), and the latency from the publication of a step's last batch to its
// cluster row under this saturating burst.
//
//	go test -run '^$' -bench CollectorEndToEnd -benchtime 1x ./collector/
func BenchmarkCollectorEndToEnd(b *testing.B) {
	// About 2 M records per size, so each measurement lasts about a second.
	for _, tc := range []struct{ ranks, steps int }{{64, 32000}, {1024, 2000}, {16384, 128}, {131072, 16}} {
		b.Run(fmt.Sprintf("ranks=%d", tc.ranks), func(b *testing.B) {
			msgs, lastOfStep := batches("bench", tc.ranks, tc.steps)
			total := int64(tc.ranks * tc.steps)
			var bytes int64
			for _, m := range msgs {
				bytes += int64(len(m))
			}
			srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Shutdown()
			pub, _ := nats.Connect(srv.URL())
			defer pub.Close()

			// Raw baseline, unbatched: the records of the first steps as
			// one message each, at the same bytes per record.
			perRecord := make([][]byte, 0, 200_000)
			for _, m := range msgs {
				if len(perRecord) >= 200_000 {
					break
				}
				recs, err := wire.DecodeSteps(m, nil)
				if err != nil {
					b.Fatal(err)
				}
				for i := range recs {
					perRecord = append(perRecord, wire.AppendSteps(nil, recs[i:i+1]))
				}
			}
			unbatched := rawRate(b, srv.URL(), "bench.raw1", perRecord, int64(len(perRecord)))
			raw1 := rawRate(b, srv.URL(), "bench.raw", msgs, total)

			// The collector.
			var mu sync.Mutex
			closedAt := map[int64]time.Time{}
			col, err := New(Config{OutDir: b.TempDir(), NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Minute,
				OnStep: func(c tps.ClusterStep) { mu.Lock(); closedAt[c.Step] = time.Now(); mu.Unlock() }})
			if err != nil {
				b.Fatal(err)
			}
			sentAt := make([]time.Time, tc.steps)
			b.ResetTimer()
			t1 := time.Now()
			s := 0
			for i, m := range msgs {
				pub.Publish(wire.StepsSubject("bench", "n"), m)
				if i == lastOfStep[s] {
					sentAt[s] = time.Now()
					s++
				}
			}
			pub.Flush()
			if err := col.Sync(5 * time.Minute); err != nil {
				b.Fatal(err)
			}
			elapsed := time.Since(t1)
			b.StopTimer()
			if st := col.Stats(); st.Records != total {
				b.Fatalf("collector accepted %d of %d", st.Records, total)
			}
			col.Close()
			raw2 := rawRate(b, srv.URL(), "bench.raw", msgs, total)
			raw := (raw1 + raw2) / 2
			var lat []float64
			for st, at := range sentAt {
				if c, ok := closedAt[int64(st)]; ok {
					lat = append(lat, c.Sub(at).Seconds()*1e3)
				}
			}
			slices.Sort(lat)
			rate := float64(total) / elapsed.Seconds()
			b.ReportMetric(rate, "records/s")
			b.ReportMetric(raw, "raw_records/s")
			b.ReportMetric(rate/raw, "ratio")
			b.ReportMetric(unbatched, "raw_unbatched_msgs/s")
			b.ReportMetric(rate/unbatched, "ratio_unbatched")
			b.ReportMetric(float64(bytes)/float64(total), "bytes/record")
			b.ReportMetric(tps.Quantile(lat, 0.5), "p50_close_ms")
			b.ReportMetric(tps.Quantile(lat, 0.99), "p99_close_ms")
		})
	}
}

// BenchmarkCollectorMemory feeds 16,384 ranks step after step and samples
// the live heap: it stays flat because open steps are bounded and closed
// ones are written out.
//
//	go test -run '^$' -bench CollectorMemory -benchtime 1x ./collector/
func BenchmarkCollectorMemory(b *testing.B) {
	const ranks, steps = 16384, 300
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	col, err := New(Config{OutDir: b.TempDir(), NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer col.Close()
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	var heaps []float64
	for chunk := 0; chunk < steps/25; chunk++ {
		msgs, _ := batches("mem", ranks, 25)
		// shift the chunk's steps
		for i := range msgs {
			recs, _ := wire.DecodeSteps(msgs[i], nil)
			for k := range recs {
				recs[k].Step += int64(chunk * 25)
			}
			msgs[i] = wire.AppendSteps(msgs[i][:0], recs)
		}
		for _, m := range msgs {
			pub.Publish(wire.StepsSubject("mem", "n"), m)
		}
		pub.Flush()
		col.Sync(5 * time.Minute)
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heaps = append(heaps, float64(ms.HeapInuse)/(1<<20))
	}
	b.ReportMetric(heaps[1], "heap_MiB_after_50_steps")
	b.ReportMetric(heaps[len(heaps)-1], "heap_MiB_after_300_steps")
	b.ReportMetric(slices.Max(heaps[1:])/slices.Min(heaps[1:]), "max/min_heap")
	b.Logf("heap MiB every 25 steps: %.0f", heaps)
}
