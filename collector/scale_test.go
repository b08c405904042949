package collector

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

// nodePartials splits each step's records into nodes of 8 ranks, as agents
// would, and encodes one partial message per node.
func nodePartials(t testing.TB, job string, ranks, steps int, topo tps.Topology) (partials, raw [][]byte) {
	msgs, _ := batches(job, ranks, steps)
	for _, m := range msgs {
		recs, err := wire.DecodeSteps(m, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(recs); i += 8 {
			p, err := tps.NewPartial(recs[i:min(i+8, len(recs))], topo)
			if err != nil {
				t.Fatal(err)
			}
			b := wire.EncodePartials([]tps.Partial{p})
			partials = append(partials, b)
		}
	}
	return partials, msgs
}

// Split roles: one aggregator merging node partials and two rank writers in
// a queue group. The cluster rows equal the aggregation of the rank rows
// both writers wrote, and every rank row is written exactly once.
func TestSplitRolesExact(t *testing.T) {
	const ranks, steps = 1024, 6
	topo := tps.Topology{DP: 32, TP: 8, PP: 4}
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	outAgg, outW := t.TempDir(), t.TempDir()
	meta := tps.RunMeta{Topology: topo}
	agg, err := New(Config{OutDir: outAgg, NATS: natsconn.Options{URL: srv.URL()}, Role: "aggregator", Meta: &meta, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var writers []*Collector
	for i := 0; i < 2; i++ {
		w, err := New(Config{OutDir: outW, NATS: natsconn.Options{URL: srv.URL()}, Role: "rank-writer", Writer: trace.WriterOptions{WriterID: fmt.Sprintf("w%d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		writers = append(writers, w)
	}
	partials, raw := nodePartials(t, "split", ranks, steps, topo)
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	// Batches of 64 records, as 8 nodes would send them: 96 messages, so
	// the queue group sharing them (checked below) is not left to a coin
	// toss over a handful.
	for _, m := range raw {
		recs, err := wire.DecodeSteps(m, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(recs); i += 64 {
			pub.Publish(wire.StepsSubject("split", "n"), wire.AppendSteps(nil, recs[i:min(i+64, len(recs))]))
		}
	}
	for _, m := range partials {
		pub.Publish(wire.PartialSubject("split", "n"), m)
	}
	pub.Flush()
	for _, c := range append(writers, agg) {
		if err := c.Sync(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if n := writers[0].Stats().Records + writers[1].Stats().Records; n != ranks*steps {
		t.Errorf("writers wrote %d records, want %d", n, ranks*steps)
	}
	if writers[0].Stats().Records == 0 || writers[1].Stats().Records == 0 {
		t.Errorf("the queue group did not share the work: %d and %d", writers[0].Stats().Records, writers[1].Stats().Records)
	}
	rows, _ := trace.ReadAll[tps.StepRecord](filepath.Join(outW, "split", trace.RankSteps))
	byStep := map[int64][]tps.StepRecord{}
	for _, r := range rows {
		byStep[r.Step] = append(byStep[r.Step], r)
	}
	cluster, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(outAgg, "split", trace.ClusterSteps))
	if len(cluster) != steps || len(rows) != ranks*steps {
		t.Fatalf("%d cluster rows, %d rank rows", len(cluster), len(rows))
	}
	for _, c := range cluster {
		want, err := tps.Aggregate(byStep[c.Step], tps.AccumulatorConfig{Topology: topo})
		if err != nil {
			t.Fatal(err)
		}
		if c.Tokens != want.Tokens || c.StepTimeNs != want.StepTimeNs || c.SlowestRank != want.SlowestRank ||
			c.RanksReported != ranks || c.CommFractionMean != want.CommFractionMean {
			t.Errorf("step %d: from partials %+v, from rank rows %+v", c.Step, c, want)
		}
	}
}

// BenchmarkAggregatorPartials: the aggregator role at 131,072 ranks, fed
// one partial message per node of 8 ranks and step, against raw NATS
// moving the same messages in the same run.
//
//	go test -run '^$' -bench AggregatorPartials -benchtime 1x ./collector/
func BenchmarkAggregatorPartials(b *testing.B) {
	const ranks, steps = 131072, 12
	topo := tps.DataParallel(ranks)
	partials, _ := nodePartials(b, "agg", ranks, steps, topo)
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	var bytes int64
	for _, m := range partials {
		bytes += int64(len(m))
	}
	raw := rawRate(b, srv.URL(), "bench.raw", partials, ranks*steps)
	agg, err := New(Config{OutDir: b.TempDir(), NATS: natsconn.Options{URL: srv.URL()}, Role: "aggregator", Grace: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	b.ResetTimer()
	t0 := time.Now()
	for _, m := range partials {
		pub.Publish(wire.PartialSubject("agg", "n"), m)
	}
	pub.Flush()
	if err := agg.Sync(5 * time.Minute); err != nil {
		b.Fatal(err)
	}
	el := time.Since(t0)
	b.StopTimer()
	st := agg.Stats()
	agg.Close()
	if st.Records != ranks*steps || st.StepsClosed != steps {
		b.Fatalf("aggregated %d ranks, %d steps", st.Records, st.StepsClosed)
	}
	b.ReportMetric(float64(ranks*steps)/el.Seconds(), "ranks/s")
	b.ReportMetric(float64(len(partials))/el.Seconds(), "partials/s")
	b.ReportMetric(float64(ranks*steps)/el.Seconds()/raw, "ratio")
	b.ReportMetric(float64(bytes)/float64(len(partials)), "bytes/partial")
}

// BenchmarkSplitRoles runs the scale-out design at 131,072 ranks in one
// process: agents' step batches go to two rank writers in a queue group,
// their node partials (one per 8 ranks and step) to an aggregator. It
// checks that every rank row is written once and every step closes
// complete with exact tokens, and reports ranks/s until all three are
// done, against one collector in the all role taking the same batches in
// the same run.
//
//	go test -run '^$' -bench SplitRoles -benchtime 1x ./collector/
func BenchmarkSplitRoles(b *testing.B) {
	const ranks, steps = 131072, 12
	topo := tps.DataParallel(ranks)
	partials, raw := nodePartials(b, "split", ranks, steps, topo)
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	url := natsconn.Options{URL: srv.URL()}

	// Baseline: one collector doing everything.
	one, err := New(Config{OutDir: b.TempDir(), NATS: url, Grace: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	oneMsgs, _ := batches("one", ranks, steps)
	t0 := time.Now()
	for _, m := range oneMsgs {
		pub.Publish(wire.StepsSubject("one", "n"), m)
	}
	pub.Flush()
	if err := one.Sync(5 * time.Minute); err != nil {
		b.Fatal(err)
	}
	single := float64(ranks*steps) / time.Since(t0).Seconds()
	if st := one.Stats(); st.Records != ranks*steps {
		b.Fatalf("single collector: %d records", st.Records)
	}
	one.Close()

	var closed []tps.ClusterStep
	var mu sync.Mutex
	agg, err := New(Config{OutDir: b.TempDir(), NATS: url, Role: "aggregator", Grace: time.Minute,
		OnStep: func(c tps.ClusterStep) { mu.Lock(); closed = append(closed, c); mu.Unlock() }})
	if err != nil {
		b.Fatal(err)
	}
	outW := b.TempDir()
	var writers []*Collector
	for i := range 2 {
		w, err := New(Config{OutDir: outW, NATS: url, Role: "rank-writer", Writer: trace.WriterOptions{WriterID: fmt.Sprintf("w%d", i)}})
		if err != nil {
			b.Fatal(err)
		}
		writers = append(writers, w)
	}
	b.ResetTimer()
	t1 := time.Now()
	per := len(partials) / steps
	for s := range steps { // as agents send them: a step's batches, then its partials
		for _, m := range raw[s*len(raw)/steps : (s+1)*len(raw)/steps] {
			pub.Publish(wire.StepsSubject("split", "n"), m)
		}
		for _, m := range partials[s*per : (s+1)*per] {
			pub.Publish(wire.PartialSubject("split", "n"), m)
		}
	}
	pub.Flush()
	for _, c := range append(writers, agg) {
		if err := c.Sync(5 * time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	el := time.Since(t1)
	b.StopTimer()
	for _, c := range append(writers, agg) {
		c.Close()
	}
	if n := writers[0].Stats().Records + writers[1].Stats().Records; n != ranks*steps {
		b.Fatalf("writers wrote %d records, want %d", n, ranks*steps)
	}
	rows := 0
	trace.Each(filepath.Join(outW, "split", trace.RankSteps), func(r []tps.StepRecord) error { rows += len(r); return nil })
	if rows != ranks*steps || len(closed) != steps {
		b.Fatalf("%d rank rows, %d cluster rows", rows, len(closed))
	}
	for _, c := range closed {
		if !c.Complete() || c.Tokens != 8192*ranks {
			b.Fatalf("step %d: %d ranks, %d tokens", c.Step, c.RanksReported, c.Tokens)
		}
	}
	rate := float64(ranks*steps) / el.Seconds()
	b.ReportMetric(rate, "ranks/s")
	b.ReportMetric(single, "single_collector_ranks/s")
	b.ReportMetric(rate/single, "ratio")
}

// Partitioned rank writers: each keeps the (job, node) share that hashes
// to it, so a node's batches, resent ones included, always reach the same
// writer, which writes every rank row exactly once.
func TestPartitionedRankWritersExact(t *testing.T) {
	const ranks, steps = 512, 4
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	out := t.TempDir()
	var writers []*Collector
	for i := range 2 {
		w, err := New(Config{OutDir: out, NATS: natsconn.Options{URL: srv.URL()}, Role: "rank-writer", Partition: i, Partitions: 2,
			Writer: trace.WriterOptions{WriterID: fmt.Sprintf("w%d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		writers = append(writers, w)
	}
	msgs, _ := batches("part", ranks, steps)
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	// As agents send them: one batch per node of 8 ranks and step, on the
	// node's subject; every fifth batch is sent twice (a resend).
	resent := 0
	for _, m := range msgs {
		recs, err := wire.DecodeSteps(m, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(recs); i += 8 {
			node := recs[i].Node
			b := wire.AppendSteps(nil, recs[i:i+8])
			pub.Publish(wire.StepsSubject("part", node), b)
			if (i/8)%5 == 0 {
				pub.Publish(wire.StepsSubject("part", node), b)
				resent += 8
			}
		}
	}
	pub.Flush()
	for _, w := range writers {
		if err := w.Sync(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	s0, s1 := writers[0].Stats(), writers[1].Stats()
	if s0.Records == 0 || s1.Records == 0 || s0.Records+s1.Records != ranks*steps {
		t.Errorf("records %d + %d, want %d, shared", s0.Records, s1.Records, ranks*steps)
	}
	if s0.Duplicates+s1.Duplicates != int64(resent) {
		t.Errorf("duplicates %d + %d, want %d", s0.Duplicates, s1.Duplicates, resent)
	}
	// Each writer saw every message and dropped the other's share unread.
	if s0.OtherPartition+s1.OtherPartition != int64(ranks*steps/8+resent/8) {
		t.Errorf("other partition %d + %d", s0.OtherPartition, s1.OtherPartition)
	}
	rows, err := trace.ReadAll[tps.StepRecord](filepath.Join(out, "part", trace.RankSteps))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]int64]bool{}
	for _, r := range rows {
		k := [2]int64{r.Step, r.Rank}
		if seen[k] {
			t.Fatalf("rank row %v written twice", k)
		}
		seen[k] = true
	}
	if len(seen) != ranks*steps {
		t.Errorf("%d rank rows, want %d", len(seen), ranks*steps)
	}
}

// Partitioned collectors in the all role split jobs: each job's steps,
// metadata and events land in exactly one of them, complete.
func TestPartitionedCollectorsSplitJobs(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	outs := []string{t.TempDir(), t.TempDir()}
	var cols []*Collector
	for i := range 2 {
		c, err := New(Config{OutDir: outs[i], NATS: natsconn.Options{URL: srv.URL()}, Partition: i, Partitions: 2, Grace: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		cols = append(cols, c)
	}
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	jobs := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, job := range jobs {
		publishSteps(t, pub, job, 0, 3)
	}
	for _, c := range cols {
		if err := c.Sync(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	owners := map[int]int{}
	for _, job := range jobs {
		n := 0
		for i, out := range outs {
			rows, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, job, trace.ClusterSteps))
			if len(rows) == 0 {
				continue
			}
			n++
			owners[i]++
			if len(rows) != 3 || !rows[0].Complete() || rows[0].Tokens != 4000 {
				t.Errorf("job %s in collector %d: %+v", job, i, rows)
			}
		}
		if n != 1 {
			t.Errorf("job %s written by %d collectors, want 1", job, n)
		}
	}
	if owners[0] == 0 || owners[1] == 0 {
		t.Errorf("jobs not shared: %v", owners)
	}
	for _, bad := range []Config{{Partition: 2, Partitions: 2}, {Partition: -1, Partitions: 2}, {Partition: 1}, {Partitions: 2, Durable: true}} {
		bad.OutDir, bad.NATS = t.TempDir(), natsconn.Options{URL: srv.URL()}
		if _, err := New(bad); err == nil || !strings.Contains(err.Error(), "partition") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

// BenchmarkRankWriters: two rank writers sharing node-sized batches (8
// records, each on its node's subject) through the queue group, against two
// partitioned writers that each receive every batch and keep their half,
// in the same run: the price of exact duplicate detection.
//
//	go test -run '^$' -bench RankWriters -benchtime 1x ./collector/
func BenchmarkRankWriters(b *testing.B) {
	const ranks, steps = 16384, 32
	t0 := time.Now().Add(-time.Hour - steps*time.Second).UnixNano()
	msgs, _ := batchesFrom("rw", ranks, 0, steps, t0, 8)
	subjects := make([]string, len(msgs))
	for i, m := range msgs {
		recs, err := wire.DecodeSteps(m, nil)
		if err != nil {
			b.Fatal(err)
		}
		subjects[i] = wire.StepsSubject("rw", recs[0].Node)
	}
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	pub, _ := nats.Connect(srv.URL())
	defer pub.Close()
	run := func(partitioned bool) float64 {
		var ws []*Collector
		for i := range 2 {
			cfg := Config{OutDir: b.TempDir(), NATS: natsconn.Options{URL: srv.URL()}, Role: "rank-writer"}
			if partitioned {
				cfg.Partition, cfg.Partitions = i, 2
			}
			w, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			ws = append(ws, w)
		}
		t := time.Now()
		for i, m := range msgs {
			pub.Publish(subjects[i], m)
		}
		pub.Flush()
		var n int64
		for _, w := range ws {
			if err := w.Sync(5 * time.Minute); err != nil {
				b.Fatal(err)
			}
			n += w.Stats().Records
		}
		el := time.Since(t)
		for _, w := range ws {
			w.Close()
		}
		if n != ranks*steps {
			b.Fatalf("partitioned=%v: %d records written, want %d", partitioned, n, ranks*steps)
		}
		return float64(n) / el.Seconds()
	}
	b.ResetTimer()
	queue := run(false)
	part := run(true)
	b.ReportMetric(queue, "queue_group_records/s")
	b.ReportMetric(part, "partitioned_records/s")
	b.ReportMetric(part/queue, "ratio")
}
