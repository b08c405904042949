package tps

import (
	"flag"
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
	for i := range Measures {
		m := &Measures[i]
		*m.Of(&r) = int64(i + 1)
	}
	if r.StartUnixNs != 1 || r.GenOutputTokens != int64(len(Measures)) || r.CkptNs == 0 || r.Bytes == 0 {
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
	for _, g := range []WireGroup{WireCore, WireTrace, WireSeqSq, WireBytes, WireGen} {
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
