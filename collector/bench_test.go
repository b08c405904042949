package collector

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// batches encodes steps × ranks records as agents send them, grouped into
// batches of at most 1024 records of one step.
func batches(job string, ranks, steps int) (msgs [][]byte, lastOfStep []int) {
	t0 := time.Now().Add(-time.Hour - time.Duration(steps)*time.Second).UnixNano()
	return batchesFrom(job, ranks, 0, steps, t0, 1024)
}

// batchesFrom encodes steps [from, from+steps), step s starting at t0 + s
// seconds, in batches of at most per records.
func batchesFrom(job string, ranks, from, steps int, t0 int64, per int) (msgs [][]byte, lastOfStep []int) {
	nodes := make([]string, (ranks+7)/8)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%d", i)
	}
	recs := make([]tps.StepRecord, 0, 1024)
	for s := from; s < from+steps; s++ {
		for r := 0; r < ranks; r++ {
			recs = append(recs, tps.StepRecord{Job: job, Step: int64(s), Rank: int64(r), WorldSize: int64(ranks), Node: nodes[r/8],
				StartUnixNs: t0 + int64(s)*1e9, EndUnixNs: t0 + int64(s)*1e9 + 9e8, DurationNs: 9e8 - int64(r%5)*1e6,
				Tokens: 8192, ExposedCommNs: 1e8, CommNs: 3e8, PPWaitNs: 5e7})
			if len(recs) == per || r == ranks-1 {
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
//
// TPSPROF_BENCH_CODEC=zstd-fast (or snappy, none) picks the Parquet codec.
func BenchmarkCollectorEndToEnd(b *testing.B) {
	codec := os.Getenv("TPSPROF_BENCH_CODEC")
	// About 2 M records per size, so each measurement lasts about a second.
	// The last two cases send node-sized batches (8 records: one agent per
	// node of 8 GPUs, flushing every step) instead of 1,024-record ones.
	for _, tc := range []struct{ ranks, steps, per int }{{64, 32000, 1024}, {1024, 2000, 1024}, {16384, 128, 1024}, {131072, 16, 1024},
		{16384, 64, 8}, {131072, 8, 8}} {
		name := fmt.Sprintf("ranks=%d", tc.ranks)
		if tc.per != 1024 {
			name += fmt.Sprintf("/batch=%d", tc.per)
		}
		b.Run(name, func(b *testing.B) {
			t0 := time.Now().Add(-time.Hour - time.Duration(tc.steps)*time.Second).UnixNano()
			msgs, lastOfStep := batchesFrom("bench", tc.ranks, 0, tc.steps, t0, tc.per)
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
				Writer: trace.WriterOptions{Codec: codec},
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

// BenchmarkCollectorMemory feeds 16,384 ranks step after step (10,000
// steps, 164 M records, by default; TPSPROF_MEM_STEPS changes it) and
// samples the live heap every 25 steps: it stays flat because open steps
// are bounded and closed ones are written out. Finished parts are removed
// as the run goes, so the disk holds only the open ones.
//
//	go test -run '^$' -bench CollectorMemory -benchtime 1x -timeout 1h ./collector/
func BenchmarkCollectorMemory(b *testing.B) {
	const ranks, chunk = 16384, 25
	steps := 10000
	if v, err := strconv.Atoi(os.Getenv("TPSPROF_MEM_STEPS")); err == nil && v >= 2*chunk {
		steps = v
	}
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	out := b.TempDir()
	col, err := New(Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer col.Close()
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	t0 := time.Now().Add(-time.Hour - time.Duration(steps)*time.Second).UnixNano()
	var heaps []float64
	start := time.Now()
	for from := 0; from+chunk <= steps; from += chunk {
		msgs, _ := batchesFrom("mem", ranks, from, chunk, t0, 1024)
		for _, m := range msgs {
			pub.Publish(wire.StepsSubject("mem", "n"), m)
		}
		pub.Flush()
		if err := col.Sync(5 * time.Minute); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heaps = append(heaps, float64(ms.HeapInuse)/(1<<20))
		// Finished parts are not the collector's memory; drop them.
		parts, _ := filepath.Glob(filepath.Join(out, "mem", trace.RankSteps, "part-*.parquet"))
		for _, p := range parts {
			os.Remove(p)
		}
		if len(heaps)%40 == 0 {
			b.Logf("%d steps, %.0f s: live heap %.0f MiB", from+chunk, time.Since(start).Seconds(), heaps[len(heaps)-1])
		}
	}
	if st := col.Stats(); st.Records != int64(ranks*len(heaps)*chunk) || st.StepsClosed < int64(len(heaps)*chunk-1) {
		b.Fatalf("accepted %d records, closed %d steps", st.Records, st.StepsClosed)
	}
	// No trend: the mean live heap of the last tenth of the run against
	// the first (a leak in run length would make it grow).
	tenth := max(len(heaps)/10, 1)
	mean := func(h []float64) float64 {
		s := 0.0
		for _, v := range h {
			s += v
		}
		return s / float64(len(h))
	}
	b.ReportMetric(float64(len(heaps)*chunk), "steps")
	b.ReportMetric(mean(heaps[:tenth]), "heap_MiB_first_tenth")
	b.ReportMetric(mean(heaps[len(heaps)-tenth:]), "heap_MiB_last_tenth")
	b.ReportMetric(mean(heaps[len(heaps)-tenth:])/mean(heaps[:tenth]), "last/first")
	b.ReportMetric(slices.Min(heaps), "min_heap_MiB")
	b.ReportMetric(slices.Max(heaps), "max_heap_MiB")
}

// BenchmarkCloseLatency paces steps as a training job produces them (every
// rank's record of a step at once, then a pause) and measures the time from
// the publication of a step's last batch to its cluster row: the
// collector's own latency, without the queueing of a saturating burst.
//
//	go test -run '^$' -bench CloseLatency -benchtime 1x ./collector/
func BenchmarkCloseLatency(b *testing.B) {
	for _, tc := range []struct {
		ranks, steps int
		every        time.Duration
	}{{1024, 200, 50 * time.Millisecond}, {16384, 40, 250 * time.Millisecond}, {131072, 20, 500 * time.Millisecond}} {
		b.Run(fmt.Sprintf("ranks=%d", tc.ranks), func(b *testing.B) {
			msgs, lastOfStep := batches("lat", tc.ranks, tc.steps)
			srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Shutdown()
			pub, _ := nats.Connect(srv.URL())
			defer pub.Close()
			closed := make(chan time.Time, tc.steps)
			col, err := New(Config{OutDir: b.TempDir(), NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Minute,
				OnStep: func(tps.ClusterStep) { closed <- time.Now() }})
			if err != nil {
				b.Fatal(err)
			}
			defer col.Close()
			var lat []float64
			first := 0
			tick := time.NewTicker(tc.every)
			defer tick.Stop()
			for s := range tc.steps {
				<-tick.C
				for _, m := range msgs[first : lastOfStep[s]+1] {
					pub.Publish(wire.StepsSubject("lat", "n"), m)
				}
				sent := time.Now() // the last record handed to NATS
				pub.Flush()
				first = lastOfStep[s] + 1
				select {
				case at := <-closed:
					lat = append(lat, at.Sub(sent).Seconds()*1e3)
				case <-time.After(time.Minute):
					b.Fatalf("step %d did not close", s)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(tps.Quantile(lat, 0.5), "p50_ms")
			b.ReportMetric(tps.Quantile(lat, 0.99), "p99_ms")
			b.ReportMetric(tc.every.Seconds()*1e3, "step_every_ms")
		})
	}
}

// fullGPUSample is a sample with every field an H100 reports.
func fullGPUSample(node string, idx int, at int64) tps.GPUSample {
	f := func(v float64) *float64 { return &v }
	i := func(v int64) *int64 { return &v }
	return tps.GPUSample{Node: node, Index: int32(idx), UUID: fmt.Sprintf("GPU-%s-%d-0000-0000-000000000000", node, idx), Name: "NVIDIA H100 80GB HBM3",
		UnixNs: at, GPUUtilPct: f(97), MemUtilPct: f(41), MemUsedBytes: i(71 << 30), MemTotalBytes: i(80 << 30), PowerW: f(612.5),
		PowerLimitW: f(700), EnergyMJ: i(at / 1e6 * 600), SMClockMHz: i(1980), SMClockMaxMHz: i(1980), MemClockMHz: i(2619),
		MemClockMaxMHz: i(2619), TempC: i(63), ClockEventReason: i(0), PCIeTxBps: i(1 << 28), PCIeRxBps: i(1 << 28),
		NVLinkTxBytes: i(at / 1e3), NVLinkRxBytes: i(at / 1e3), ECCCorrected: i(0), ECCUncorrected: i(0), RemappedCorr: i(0),
		RemappedUncorr: i(0), XIDEvents: i(0), GPMSMUtilPct: f(88), GPMTensorPct: f(61), GPMDRAMBWPct: f(35)}
}

// BenchmarkCollectorGPU: GPU telemetry as agents send it (one message per
// node of 8 GPUs and sampling tick, every field present) for 16,384 GPUs,
// binary as agents send it and JSON as earlier agents did, each against
// raw NATS moving the same messages in the same run. At one sample per GPU
// per second, samples/s is the number of GPUs one collector can take
// telemetry from.
//
//	go test -run '^$' -bench CollectorGPU -benchtime 1x ./collector/
func BenchmarkCollectorGPU(b *testing.B) {
	const nodes, ticks = 2048, 20
	t0 := time.Now().Add(-time.Hour).UnixNano()
	for _, enc := range []string{"binary", "json"} {
		b.Run(enc, func(b *testing.B) {
			var msgs [][]byte
			var subjects []string
			for k := range ticks {
				for n := range nodes {
					node := fmt.Sprintf("node-%d", n)
					s := make([]tps.GPUSample, 8)
					for g := range s {
						s[g] = fullGPUSample(node, g, t0+int64(k)*1e9)
					}
					m := wire.EncodeGPUSamples(s)
					if enc == "json" {
						m, _ = json.Marshal(s)
					}
					msgs = append(msgs, m)
					subjects = append(subjects, wire.GPUSubject("gpu", node))
				}
			}
			total := int64(nodes * 8 * ticks)
			var bytes int64
			for _, m := range msgs {
				bytes += int64(len(m))
			}
			srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Shutdown()
			raw := rawRate(b, srv.URL(), "bench.raw", msgs, total)
			col, err := New(Config{OutDir: b.TempDir(), NATS: natsconn.Options{URL: srv.URL()}})
			if err != nil {
				b.Fatal(err)
			}
			defer col.Close()
			pub, _ := nats.Connect(srv.URL())
			defer pub.Close()
			b.ResetTimer()
			t := time.Now()
			for i, m := range msgs {
				pub.Publish(subjects[i], m)
			}
			pub.Flush()
			if err := col.Sync(5 * time.Minute); err != nil {
				b.Fatal(err)
			}
			el := time.Since(t)
			b.StopTimer()
			if st := col.Stats(); len(st.Rejected) != 0 {
				b.Fatalf("rejected %v", st.Rejected)
			}
			rate := float64(total) / el.Seconds()
			b.ReportMetric(rate, "samples/s")
			b.ReportMetric(raw, "raw_samples/s")
			b.ReportMetric(rate/raw, "ratio")
			b.ReportMetric(float64(bytes)/float64(total), "bytes/sample")
		})
	}
}
