package collector

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/wire"
)

type jsPub struct {
	t  *testing.T
	js nats.JetStreamContext
}

func (p jsPub) Publish(subj string, data []byte) {
	if _, err := p.js.Publish(subj, data); err != nil {
		p.t.Fatal(err)
	}
}

func (p jsPub) Flush() {}

// Durable split roles: an aggregator and two rank writers read the stream
// through their own consumers. The aggregator is replaced half way (its
// open steps' partials are redelivered to the next one); in the end every
// rank row is written once, every cluster row once and complete, and the
// stream is empty: everything was acknowledged after it reached Parquet.
func TestDurableSplitRoles(t *testing.T) {
	const ranks, steps = 256, 8
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	url := natsconn.Options{URL: srv.URL()}
	outAgg, outW := t.TempDir(), t.TempDir()
	newAgg := func() *Collector {
		a, err := New(Config{OutDir: outAgg, NATS: url, Role: "aggregator", Durable: true, Grace: time.Minute,
			Writer: trace.WriterOptions{PartAge: time.Hour}})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	agg := newAgg()
	var writers []*Collector
	for i := range 2 {
		w, err := New(Config{OutDir: outW, NATS: url, Role: "rank-writer", Durable: true,
			Writer: trace.WriterOptions{WriterID: fmt.Sprintf("w%d", i), PartAge: 200 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		writers = append(writers, w)
	}
	// An all-role durable collector cannot share the work-queue stream with them.
	if _, err := New(Config{OutDir: t.TempDir(), NATS: url, Durable: true}); err == nil || !strings.Contains(err.Error(), "work-queue stream") {
		t.Errorf("all-role consumer beside the roles: %v", err)
	}

	partials, _ := nodePartials(t, "dur", ranks, steps, tps.DataParallel(ranks))
	nc, _ := nats.Connect(srv.URL())
	defer nc.Close()
	// Published with stream acknowledgements, as durable agents do: Sync
	// covers what the stream holds.
	js, _ := nc.JetStream()
	pub := jsPub{t, js}
	t0 := time.Now().Add(-time.Hour - steps*time.Second).UnixNano()
	send := func(from, to int) {
		msgs, _ := batchesFrom("dur", ranks, from, to-from, t0, 64)
		for _, m := range msgs {
			pub.Publish(wire.StepsSubject("dur", "n"), m)
		}
		per := len(partials) / steps
		for _, m := range partials[from*per : to*per] {
			pub.Publish(wire.PartialSubject("dur", "n"), m)
		}
		pub.Flush()
	}
	// Half the steps, and half of the next step's partials: that step
	// stays open in the first aggregator.
	send(0, steps/2)
	per := len(partials) / steps
	for _, m := range partials[steps/2*per : steps/2*per+per/2] {
		pub.Publish(wire.PartialSubject("dur", "n"), m)
	}
	pub.Flush()
	if err := agg.Sync(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	first := agg.Stats()
	if err := agg.Close(); err != nil {
		t.Fatal(err)
	}
	if first.StepsClosed != steps/2 || first.OpenSteps != 1 {
		t.Fatalf("first aggregator: %d steps closed, %d open: %+v", first.StepsClosed, first.OpenSteps, first)
	}
	agg = newAgg() // the open step's partials come back to it
	send(steps/2+1, steps)
	for _, m := range partials[steps/2*per+per/2 : steps/2*per+per] {
		pub.Publish(wire.PartialSubject("dur", "n"), m)
	}
	msgs, _ := batchesFrom("dur", ranks, steps/2, 1, t0, 64)
	for _, m := range msgs {
		pub.Publish(wire.StepsSubject("dur", "n"), m)
	}
	pub.Flush()
	for _, c := range append(writers, agg) {
		if err := c.Sync(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	cluster, err := trace.ReadAll[tps.ClusterStep](filepath.Join(outAgg, "dur", trace.ClusterSteps))
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]int{}
	for _, c := range cluster {
		got[c.Step]++
		if !c.Complete() || c.Tokens != 8192*ranks {
			t.Errorf("step %d: %d of %d ranks, %d tokens", c.Step, c.RanksReported, ranks, c.Tokens)
		}
	}
	if len(cluster) != steps || len(got) != steps {
		t.Errorf("%d cluster rows for %d distinct steps, want %d", len(cluster), len(got), steps)
	}
	rows, _ := trace.ReadAll[tps.StepRecord](filepath.Join(outW, "dur", trace.RankSteps))
	seen := map[[2]int64]bool{}
	for _, r := range rows {
		seen[[2]int64{r.Step, r.Rank}] = true
	}
	if len(rows) != ranks*steps || len(seen) != ranks*steps {
		t.Errorf("%d rank rows, %d distinct, want %d", len(rows), len(seen), ranks*steps)
	}
	info, err := js.StreamInfo(StreamName)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("%d messages left in the stream: not everything was acknowledged", info.State.Msgs)
	}
}
