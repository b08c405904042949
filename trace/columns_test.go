package trace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

// TestEachColumnsMatchesRows writes rank rows over several parts and row
// groups (and more distinct nodes than one page) and checks that the
// columnar read gives, row for row, what the row reader gives.
func TestEachColumnsMatchesRows(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "t", RowsPerGroup: 1000, RowsPerPart: 7000})
	if err != nil {
		t.Fatal(err)
	}
	var recs []tps.StepRecord
	for i := range 20_000 {
		recs = append(recs, tps.StepRecord{Job: "j", Attempt: int64(i / 15000), Step: int64(i / 100), Rank: int64(i % 100), WorldSize: 100,
			Node: fmt.Sprintf("node-%d", (i*7919)%3000), DurationNs: int64(i) * 1000, ExposedCommNs: -int64(i), Tokens: 1 << 40})
	}
	for i := 0; i < len(recs); i += 1500 {
		if err := w.Write(recs[i:min(i+1500, len(recs))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "j", RankSteps)
	want, err := ReadAll[tps.StepRecord](dir)
	if err != nil {
		t.Fatal(err)
	}
	if parts, _ := PartFiles(dir); len(parts) < 3 {
		t.Fatalf("%d parts: the test wants several", len(parts))
	}
	names := []string{"attempt", "step", "rank", "duration_ns", "exposed_comm_ns", "tokens"}
	k, groups := 0, 0
	err = EachColumns(dir, names, "node", func(c *Columns) error {
		groups++
		for i := range c.Rows {
			r := &want[k]
			got := [...]int64{c.Int64[0][i], c.Int64[1][i], c.Int64[2][i], c.Int64[3][i], c.Int64[4][i], c.Int64[5][i]}
			if got != [...]int64{r.Attempt, r.Step, r.Rank, r.DurationNs, r.ExposedCommNs, r.Tokens} || c.Strings[i] != r.Node {
				return fmt.Errorf("row %d: columns %v %q, row %+v", k, got, c.Strings[i], r)
			}
			k++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if k != len(recs) || groups < 20 {
		t.Errorf("%d rows in %d row groups, want %d rows in at least 20", k, groups, len(recs))
	}
	// A missing column, or one of another type, is an error naming it.
	for _, tc := range []struct {
		ints []string
		str  string
	}{{[]string{"nope"}, ""}, {[]string{"node"}, ""}, {nil, "step"}, {[]string{"loss"}, ""}} {
		err := EachColumns(dir, tc.ints, tc.str, func(*Columns) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "column") {
			t.Errorf("%v %q: %v", tc.ints, tc.str, err)
		}
	}
}

// Row groups of 4,096 rows and more decode their columns on two
// goroutines: the values are the rows' (run under -race).
func TestEachColumnsLargeGroups(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "t", RowsPerGroup: 8192})
	if err != nil {
		t.Fatal(err)
	}
	var recs []tps.StepRecord
	for i := range 20_000 {
		recs = append(recs, tps.StepRecord{Job: "j", Step: int64(i / 64), Rank: int64(i % 64), WorldSize: 64, Node: fmt.Sprintf("n%d", i%64/8),
			DurationNs: int64(i) * 7, ExposedCommNs: int64(i % 13), DataWaitNs: int64(i % 5), Tokens: int64(i)})
	}
	w.Write(recs)
	w.Close()
	names := []string{"step", "rank", "duration_ns", "exposed_comm_ns", "data_wait_ns", "tokens"}
	k := 0
	err = EachColumns(filepath.Join(root, "j", RankSteps), names, "node", func(c *Columns) error {
		for i := range c.Rows {
			r := &recs[k]
			got := [...]int64{c.Int64[0][i], c.Int64[1][i], c.Int64[2][i], c.Int64[3][i], c.Int64[4][i], c.Int64[5][i]}
			if got != [...]int64{r.Step, r.Rank, r.DurationNs, r.ExposedCommNs, r.DataWaitNs, r.Tokens} || c.Strings[i] != r.Node {
				return fmt.Errorf("row %d: %v %q, want %+v", k, got, c.Strings[i], r)
			}
			k++
		}
		return nil
	})
	if err != nil || k != len(recs) {
		t.Fatalf("%d rows of %d: %v", k, len(recs), err)
	}
}

// Decoding runs a row group ahead on a goroutine of its own: a reader that
// stops (fn's error) gets that error and the goroutine ends; unreadable
// parts (three, more than the two buffers the decoder takes turns with)
// are skipped and named while the good part is read whole; nothing is
// left running.
func TestEachColumnsStopsAndSkips(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "t", RowsPerGroup: 100})
	if err != nil {
		t.Fatal(err)
	}
	var recs []tps.StepRecord
	for i := range 2000 {
		recs = append(recs, tps.StepRecord{Job: "j", Step: int64(i), WorldSize: 1, DurationNs: 1})
	}
	w.Write(recs)
	w.Close()
	dir := filepath.Join(root, "j", RankSteps)
	base := runtime.NumGoroutine()
	stop := errors.New("enough")
	groups := 0
	_, err = EachColumnsIn(dir, []string{"step"}, "", nil, func(*Columns) error {
		if groups++; groups == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || groups != 3 {
		t.Errorf("stopped at group %d with %v", groups, err)
	}
	for i := range 3 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("part-zz-%d.parquet", i)), []byte("not parquet at all"), 0o644)
	}
	rows := 0
	_, err = EachColumnsIn(dir, []string{"step"}, "", nil, func(c *Columns) error { rows += c.Rows; return nil })
	var bad *UnreadableParts
	if !errors.As(err, &bad) || len(bad.Paths) != 3 || rows != 2000 {
		t.Errorf("%d rows read, err %v", rows, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > base {
		t.Errorf("%d goroutines left over the %d before", g-base, base)
	}
}

// Every codec writes parts that read back the same; an unknown one is
// refused before anything is written.
func TestCodecs(t *testing.T) {
	recs := []tps.StepRecord{{Job: "j", Step: 1, Rank: 0, WorldSize: 2, Node: "a", Tokens: 5}, {Job: "j", Step: 1, Rank: 1, WorldSize: 2, Node: "b", Tokens: 5}}
	for _, c := range Codecs() {
		root := t.TempDir()
		w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "t", Codec: c})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(recs); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		got, err := ReadAll[tps.StepRecord](filepath.Join(root, "j", RankSteps))
		if err != nil || len(got) != 2 || got[1].Node != "b" || got[1].Tokens != 5 {
			t.Errorf("%s: %v %+v", c, err, got)
		}
	}
	if _, err := NewPartWriter[tps.StepRecord](t.TempDir(), "j", RankSteps, WriterOptions{Codec: "lz9"}); err == nil || !strings.Contains(err.Error(), "zstd-fast") {
		t.Errorf("unknown codec: %v", err)
	}
}

// PartRanges says, from the footers, the attempts and steps each part
// holds (three writers' parts: steps 0-99, 100-199 of attempt 0 and 0-49
// of attempt 1); Parts reads only the parts named, with or without
// Within; a meter shows the others were not opened.
func TestPartRangesAndParts(t *testing.T) {
	root := t.TempDir()
	write := func(id string, attempt, from, to int64) {
		w, err := NewPartWriter[tps.ClusterStep](root, "j", ClusterSteps, WriterOptions{WriterID: id, RowsPerGroup: 30})
		if err != nil {
			t.Fatal(err)
		}
		for s := from; s <= to; s++ {
			w.Write([]tps.ClusterStep{{Job: "j", Attempt: attempt, Step: s, WorldSize: 1}})
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write("a", 0, 0, 99)
	write("b", 0, 100, 199)
	write("c", 1, 0, 49)
	dir := filepath.Join(root, "j", ClusterSteps)
	prs := PartRanges(dir, []string{"attempt", "step"})
	if len(prs) != 3 {
		t.Fatalf("%d parts, want 3", len(prs))
	}
	byRange := map[[4]int64]string{}
	for _, p := range prs {
		if !p.Known {
			t.Errorf("%s: statistics unknown", p.Path)
		}
		byRange[[4]int64{p.Min[0], p.Max[0], p.Min[1], p.Max[1]}] = p.Path
	}
	for _, w := range [][4]int64{{0, 0, 0, 99}, {0, 0, 100, 199}, {1, 1, 0, 49}} {
		if byRange[w] == "" {
			t.Fatalf("no part holds attempts %d-%d, steps %d-%d: %+v", w[0], w[1], w[2], w[3], prs)
		}
	}
	b := byRange[[4]int64{0, 0, 100, 199}]
	var all, one Meter
	if rows, err := ReadAll[tps.ClusterStep](dir, Metered(&all)); err != nil || len(rows) != 250 {
		t.Fatalf("all parts: %d rows, %v", len(rows), err)
	}
	rows, err := ReadAll[tps.ClusterStep](dir, Metered(&one), Parts(b), Within(Range{Column: "step", Min: 150, Max: 159}))
	if err != nil || len(rows) != 30 || rows[0].Step != 130 {
		t.Fatalf("part b, steps 150-159: %d rows from %+v, %v; want the row group of steps 130-159", len(rows), rows[:min(len(rows), 1)], err)
	}
	if one.Bytes() >= all.Bytes()/2 {
		t.Errorf("one part's row group read %d bytes of %d for all", one.Bytes(), all.Bytes())
	}
	if n := RowCount(dir, Parts(b)); n != 100 {
		t.Errorf("RowCount of part b: %d, want 100", n)
	}
}

// EachColumnsStrs reads nested int64 columns by their dotted path and
// several string columns (a dictionary one, node, and a plain byte array
// one, the sketches), row for row as the row reader gives them, also with
// the sketches read Volatile (into a reused buffer).
func TestEachColumnsStrsMatchesRows(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.RankWindow](root, "j", RankWindows, WriterOptions{WriterID: "w", RowsPerGroup: 50})
	if err != nil {
		t.Fatal(err)
	}
	for s := range int64(400) {
		var rows []tps.RankWindow
		for r := range int64(3) {
			var rw tps.RankWindow
			rw.Add(&tps.StepRecord{Job: "j", Step: s, Rank: r, WorldSize: 3, Node: fmt.Sprintf("n%d", r%2), DurationNs: 1e9 + s*1000 + r, FwdNs: 3e8 + s, DataWaitNs: r * 10})
			rw.Seal()
			rows = append(rows, rw)
		}
		if err := w.Write(rows); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "j", RankWindows)
	want, err := ReadAll[tps.RankWindow](dir)
	if err != nil || len(want) != 1200 {
		t.Fatalf("rows: %d, %v", len(want), err)
	}
	for _, opts := range [][]ReadOption{nil, {Volatile("compute_sketch")}} {
		k := 0
		_, err = EachColumnsStrs(dir, []string{"rank", "first_step", "compute_ns.sum", "fwd_ns.sum", "data_wait_ns.max"}, []string{"node", "compute_sketch"}, nil, func(c *Columns) error {
			for i := range c.Rows {
				w := &want[k]
				got := [5]int64{c.Int64[0][i], c.Int64[1][i], c.Int64[2][i], c.Int64[3][i], c.Int64[4][i]}
				if got != [5]int64{w.Rank, w.FirstStep, w.Compute.Sum, w.Fwd.Sum, w.DataWait.Max} || c.Str[0][i] != w.Node || c.Str[1][i] != string(w.ComputeSketch) || c.Strings[i] != w.Node {
					return fmt.Errorf("row %d: %v %q %q; want %+v", k, got, c.Str[0][i], c.Str[1][i], w)
				}
				k++
			}
			return nil
		}, opts...)
		if err != nil || k != len(want) {
			t.Fatalf("%d rows of %d (%d options): %v", k, len(want), len(opts), err)
		}
	}
	if len(want[0].ComputeSketch) == 0 || want[0].Compute.Sum == 0 {
		t.Fatalf("fixture: no sketch or compute: %+v", want[0])
	}
}

// A row group whose column holds one value (its statistics' min = max) is
// filled from the footer instead of decoded: the values are the rows'
// across groups whose constant changes, stays, grows with the group, or
// gives way to varied values and back (the slices are reused group to
// group), under -race's two decoding goroutines too.
func TestEachColumnsConstantChunks(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "t", RowsPerGroup: 5000})
	if err != nil {
		t.Fatal(err)
	}
	var recs []tps.StepRecord
	for g, ckpt := range []int64{0, 0, 7, 7, -1, 0, 9, 9} { // -1: varied
		for i := range 5000 {
			r := tps.StepRecord{Job: "j", Step: int64(g*5000 + i), Rank: 0, WorldSize: 1, Node: "n", DurationNs: 1e9, CkptNs: ckpt, Tokens: int64(g)}
			if ckpt < 0 {
				r.CkptNs = int64(i % 3)
			}
			recs = append(recs, r)
		}
	}
	for g := 0; g < len(recs); g += 5000 {
		w.Write(recs[g : g+5000])
	}
	w.Close()
	k := 0
	err = EachColumns(filepath.Join(root, "j", RankSteps), []string{"step", "ckpt_ns", "tokens", "?no_such"}, "", func(c *Columns) error {
		// Constant names the group's constant columns and their value
		r0 := &recs[k]
		if v, ok := c.Constant(1); ok != (r0.CkptNs >= 0 && k/5000 != 4) || (ok && v != r0.CkptNs) {
			return fmt.Errorf("group %d: ckpt_ns constant %v (%d)", k/5000, ok, v)
		}
		if v, ok := c.Constant(3); !ok || v != 0 {
			return fmt.Errorf("group %d: a missing column is not constant 0 (%v, %d)", k/5000, ok, v)
		}
		if _, ok := c.Constant(0); ok {
			return fmt.Errorf("group %d: step, which varies, said constant", k/5000)
		}
		for i := range c.Rows {
			r := &recs[k]
			if got := [...]int64{c.Int64[0][i], c.Int64[1][i], c.Int64[2][i], c.Int64[3][i]}; got != [...]int64{r.Step, r.CkptNs, r.Tokens, 0} {
				return fmt.Errorf("row %d: %v, want step %d ckpt %d tokens %d", k, got, r.Step, r.CkptNs, r.Tokens)
			}
			k++
		}
		return nil
	})
	if err != nil || k != len(recs) {
		t.Fatalf("%d rows of %d: %v", k, len(recs), err)
	}
}

// A column named twice in one pass is one column, read once.
func TestColsNameOnce(t *testing.T) {
	var cs Cols
	a, b, c := cs.Col("data_wait_ns"), cs.Col("?host_ns"), cs.Col("data_wait_ns")
	if a != c || a == b || len(cs.Names()) != 2 {
		t.Errorf("handles %d %d %d, names %v: want the first and third one handle, two names", a, b, c, cs.Names())
	}
}
