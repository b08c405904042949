package tps

import (
	"flag"
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/intake.md's measures table from Measures")

// Every int64 of StepRecord past its identity is in Measures, bound to its
// field (JSON and Parquet names checked at init); docs/intake.md's
// measures table is the one MeasuresMarkdown writes (-update-docs rewrites
// it; rank_steps' columns are its keys, docs/parquet.md); the step batch
// layout of docs/wire.md lists each wire group's measures in Measures'
// order.
func TestMeasuresDocumented(t *testing.T) {
	if err := bindMeasures(); err != nil {
		t.Fatal(err)
	}
	var r StepRecord
	for i := range measures {
		m := &measures[i]
		*m.Of(&r) = int64(i + 1)
	}
	if r.StartUnixNs != 1 || r.CaptureCommCPUNs != int64(len(measures)) || r.HostNs != int64(len(measures)-2) || r.GCNs != int64(len(measures)-3) || r.CkptNs == 0 || r.Bytes == 0 {
		t.Fatalf("measures bound to the wrong fields: %+v", r)
	}

	const begin, end = "<!-- measures:", "<!-- /measures -->"
	doc, err := os.ReadFile("../docs/intake.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(doc)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatal("docs/intake.md has no measures block")
	}
	i += strings.Index(s[i:], "\n") + 1
	if want := MeasuresMarkdown(); s[i:j] != want {
		if *updateDocs {
			if err := os.WriteFile("../docs/intake.md", []byte(s[:i]+want+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			t.Errorf("docs/intake.md's measures table is not Measures' (go test ./tps -run TestMeasuresDocumented -update-docs):\n%s", want)
		}
	}

	wire, err := os.ReadFile("../docs/wire.md")
	if err != nil {
		t.Fatal(err)
	}
	layout := string(wire)
	if k := strings.Index(layout, "## Step batch"); k >= 0 {
		layout = layout[k:]
	}
	if k := strings.Index(layout, "```\n"); k >= 0 {
		layout = layout[k+4:]
		layout = layout[:max(strings.Index(layout, "```"), 0)]
	}
	words := strings.Fields(regexp.MustCompile(`[\[\]()×:]|varint`).ReplaceAllString(layout, " "))
	pos := map[string]int{}
	for k, w := range words {
		if _, ok := pos[w]; !ok {
			pos[w] = k
		}
	}
	for _, g := range []WireGroup{WireCore, WireTrace, WireSeqSq, WireBytes, WireGen, WireCost, WireMem} {
		last := -1
		for _, m := range MeasuresIn(g) {
			p, ok := pos[m.Name]
			if !ok || p <= last {
				t.Errorf("docs/wire.md: %s missing or out of Measures' order", m.Name)
			}
			last = p
		}
	}
	if !strings.Contains(layout, "varint × "+strconv.Itoa(len(MeasuresIn(WireCore)))+":") {
		t.Errorf("docs/wire.md does not say varint × %d for the core measures", len(MeasuresIn(WireCore)))
	}
}

// SketchInto decoding into a reused sketch gives what a fresh decode
// gives: a window whose JSON leaves out zero (omitempty) after one that
// had some, with fewer bins.
func TestSketchIntoReused(t *testing.T) {
	var a, b RankWindow
	for i, v := range []int64{0, 0, 5, 900, 1e6} {
		a.Add(&StepRecord{Step: int64(i), DurationNs: v})
	}
	for i, v := range []int64{800, 810} {
		b.Add(&StepRecord{Step: int64(i), DurationNs: v})
	}
	a.Seal()
	b.Seal()
	var scratch Sketch
	for _, w := range []*RankWindow{&a, &b} {
		ok, err := w.SketchInto(&scratch)
		fresh, ferr := w.Sketch()
		if !ok || err != nil || ferr != nil || !reflect.DeepEqual(scratch, *fresh) {
			t.Errorf("reused %+v, fresh %+v (%v %v)", scratch, fresh, err, ferr)
		}
	}
	if scratch.Zero != 0 || scratch.Count != 2 {
		t.Errorf("the second sketch kept the first's figures: %+v", scratch)
	}
}

// docs/intake.md's "cluster row" column is what the accumulator does:
// moving a measure on every rank of a step moves every cluster_steps column
// its Combine names in backticks (through the sums its Over keeps, or per replica), and
// a measure the cluster row does not combine ("rank rows") moves none.
// The same holds through node partials (the sums they carry are the
// table's).
func TestMeasuresCombineAsDocumented(t *testing.T) {
	ct := reflect.TypeFor[ClusterStep]()
	cols := map[string]int{}
	for i := range ct.NumField() {
		name, _, _ := strings.Cut(ct.Field(i).Tag.Get("parquet"), ",")
		cols[name] = i
	}
	const t0 = int64(1_760_000_000_000_000_000)
	base := func() []StepRecord {
		var recs []StepRecord
		for r := range int64(2) {
			loss := 2.0
			recs = append(recs, StepRecord{Job: "j", Step: 5, Rank: r, WorldSize: 2, Node: "n",
				StartUnixNs: t0 + r*1e6, EndUnixNs: t0 + 1e9 - r*1e6, DurationNs: 1e9 - 2*r*1e6,
				Tokens: 1000, PaddedTokens: 1100, Samples: 4, SeqSqSum: 200_000, Bytes: 4000,
				DataWaitNs: 1e7 + r*1e6, FwdNs: 2e8, BwdNs: 4e8, OptimNs: 5e7, CommNs: 3e8 + r*1e7,
				ExposedCommNs: 1e8 + r*1e7, PPWaitNs: 2e7 + r*1e6, CkptNs: 1e6 + r*1e5,
				TraceComputeNs: 6e8, TraceCommNs: 3e8, TraceExposedCommNs: 1e8,
				GenNs: 3e8 + r*1e7, GenRequests: 4, GenPromptTokens: 256, GenOutputTokens: 1024 + r, Loss: &loss})
		}
		return recs
	}
	cfg := AccumulatorConfig{FLOPsPerToken: 6e9, DenseFLOPsPerToken: 5e9, AttnFLOPsPerSeqSq: 5e3, PeakFLOPSPerGPU: 1e15}
	ctx := StepContext{PrevEndUnixNs: t0 - 1e7}
	result := func(recs []StepRecord, partials bool) ClusterStep {
		a, err := NewStepAccumulator("j", 0, 5, 2, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range recs {
			if partials {
				p, err := NewPartial(recs[i:i+1], Topology{})
				if err == nil {
					_, err = a.AddPartial(&p)
				}
				if err != nil {
					t.Fatal(err)
				}
			} else if _, err := a.Add(&recs[i]); err != nil {
				t.Fatal(err)
			}
		}
		return a.ResultIn(ctx)
	}
	word := regexp.MustCompile("`([a-z][a-z0-9_]*)`")
	for _, partials := range []bool{false, true} {
		c0 := result(base(), partials)
		if c0.MFU <= 0 || c0.GenOutputTPS <= 0 || c0.BytesPerSecond <= 0 || c0.RanksMissing != 0 {
			t.Fatalf("the base step lacks figures: %+v", c0)
		}
		for i := range measures {
			m := &measures[i]
			recs := base()
			// move it on every rank: up, or down for a minimum
			delta := int64(1e6)
			if m.Over&OverMin != 0 {
				delta = -delta
			}
			for k := range recs {
				*m.Of(&recs[k]) += delta
			}
			c1 := result(recs, partials)
			moved := map[string]bool{}
			a, b := reflect.ValueOf(c0), reflect.ValueOf(c1)
			for name, f := range cols {
				if !reflect.DeepEqual(a.Field(f).Interface(), b.Field(f).Interface()) {
					moved[name] = true
				}
			}
			var named []string
			for _, w := range word.FindAllStringSubmatch(m.Combine, -1) {
				if _, ok := cols[w[1]]; !ok {
					t.Errorf("%s: its Combine names `%s`, not a cluster_steps column", m.Name, w[1])
				}
				named = append(named, w[1])
			}
			rankRows := strings.HasPrefix(m.Combine, "rank rows")
			switch {
			case rankRows && (m.Over != 0 || len(moved) > 0):
				t.Errorf("partials %v: %s is documented as rank rows only, but it is kept (%v) or moves %v", partials, m.Name, m.Over, moved)
			case !rankRows && len(named) == 0:
				t.Errorf("%s: its Combine names no cluster_steps column: %q", m.Name, m.Combine)
			}
			for _, n := range named {
				if !moved[n] {
					t.Errorf("partials %v: %s moved by %d on every rank, but %s (named in its Combine) did not move (moved: %v)", partials, m.Name, delta, n, moved)
				}
			}
		}
	}
}

// A packed batch's FLOPs come from its Σ document length² even when the
// model arrived after the records (late run metadata: Reconfigure).
func TestSeqSqFLOPsWithLateModel(t *testing.T) {
	a, err := NewStepAccumulator("j", 0, 1, 1, AccumulatorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r := StepRecord{Job: "j", Step: 1, WorldSize: 1, StartUnixNs: 2e18, EndUnixNs: 2e18 + 1e9, DurationNs: 1e9, Tokens: 4096, SeqSqSum: 4 * 1024 * 1024}
	if _, err := a.Add(&r); err != nil {
		t.Fatal(err)
	}
	cfg := AccumulatorConfig{FLOPsPerToken: 1e9, DenseFLOPsPerToken: 8e8, AttnFLOPsPerSeqSq: 100, PeakFLOPSPerGPU: 1e15}
	if !a.Reconfigure(cfg) {
		t.Fatal("reconfigure refused")
	}
	// 4096 × 8e8 + 4·1024² × 100 (not 4096 × 1e9)
	if got, want := a.Result().FLOPs, 4096*8e8+4*1024*1024*100.0; got != want {
		t.Errorf("FLOPs %g, want %g", got, want)
	}
}

// The Python package's measures (keys, bounds, splits) are this table's:
// python/tpsprof/_measures.py is MeasuresPython's text.
func TestMeasuresPython(t *testing.T) {
	const path = "../python/tpsprof/_measures.py"
	got, err := os.ReadFile(path)
	want := MeasuresPython()
	if err == nil && string(got) == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s is not tps.Measures' (go test ./tps -run TestMeasuresPython -update-docs): %v", path, err)
}

// The cluster row's shares and the waiting for the critical rank add up
// every blocking measure's sum over ranks: each must be kept summed.
func TestBlockingMeasuresSummed(t *testing.T) {
	for _, m := range Measures() {
		if m.Kind == KindBlocking && m.Over&OverSum == 0 {
			t.Errorf("%s is blocking but not kept summed over ranks (Over: OverSum)", m.Name)
		}
		if m.Own && (m.Kind != KindBlocking || !m.Windowed) {
			t.Errorf("%s is a rank's own time but not a blocking measure kept in rank_windows", m.Name)
		}
	}
}

// A rank's own time holds its host work before the forward (host_ns, a
// Measure.Own): the rank whose thread builds its batch slowest is the
// critical one the others wait for, and the waiting is measured against
// it (before host_ns was own time, two ranks of equal compute tied and
// the one that waited was taken for the critical rank).
func TestHostWorkIsOwnTime(t *testing.T) {
	const ms = int64(1e6)
	recs := []StepRecord{
		{Job: "j", Step: 1, Rank: 0, WorldSize: 2, StartUnixNs: 1e9, EndUnixNs: 1e9 + 100*ms, DurationNs: 100 * ms, Tokens: 10, ExposedCommNs: 60 * ms},
		{Job: "j", Step: 1, Rank: 1, WorldSize: 2, StartUnixNs: 1e9, EndUnixNs: 1e9 + 100*ms, DurationNs: 100 * ms, Tokens: 10, ExposedCommNs: 30 * ms, HostNs: 30 * ms},
	}
	if own := recs[1].OwnNs(); own != 70*ms {
		t.Errorf("rank 1's own time %d ms, want compute 40 + host 30", own/ms)
	}
	c, err := Aggregate(recs, AccumulatorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	// own 40 and 70 ms: rank 1 critical, the mean rank waits 70 − 55 = 15 ms
	if c.SlowestRank != 1 || math.Abs(c.WaitFractionMean-0.15) > 1e-9 || math.Abs(c.HostFractionMean-0.15) > 1e-9 {
		t.Errorf("critical rank %d, waiting %.3f, host %.3f of the step: want rank 1, 0.150, 0.150", c.SlowestRank, c.WaitFractionMean, c.HostFractionMean)
	}
	if sh := c.Shares(); math.Abs(sh.Sum()-1) > 1e-9 || math.Abs(sh.Other-0.15) > 1e-9 || math.Abs(sh.Splits["host_ns"]-0.15) > 1e-9 {
		t.Errorf("shares %+v: want host/other 0.15 (its split host work 0.15), adding up to 1", sh)
	}
}
