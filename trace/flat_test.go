package trace

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// The flat reader gives what parquet-go's rows give: 10,000 cluster rows
// with every int64 and float64 field random (NaN and infinities too), the
// optional mfu_unknown null in most rows and set in some, in row groups of
// 777 rows and two parts, read both ways and compared field by field. A
// type the flat reader cannot take (StepRecord: pointers, a bool) is read
// through rows; an old part lacking a column leaves the field zero.
func TestReadAllFlatMatchesRows(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.ClusterStep](root, "j", ClusterSteps, WriterOptions{WriterID: "f", RowsPerGroup: 777})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	rows := make([]tps.ClusterStep, 10_000)
	specials := []float64{0, -1.5, 1e300, 5e-324}
	for i := range rows {
		v := reflect.ValueOf(&rows[i]).Elem()
		for k := range v.NumField() {
			switch f := v.Field(k); f.Kind() {
			case reflect.Int64:
				f.SetInt(rng.Int64() - 1<<62)
			case reflect.Float64:
				f.SetFloat(rng.NormFloat64() * 1e6)
				if rng.IntN(10) == 0 {
					f.SetFloat(specials[rng.IntN(len(specials))])
				}
			}
		}
		rows[i].Job = "j"
		if i%7 == 0 {
			rows[i].MFUUnknown = "no model in the run metadata"
		}
		if err := w.Write(rows[i : i+1]); err != nil {
			t.Fatal(err)
		}
		if i == 4_999 {
			w.Rotate()
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "j", ClusterSteps)
	part, _ := PartFiles(dir)
	if pf, err := openNew(part[0], &readConfig{}); err != nil {
		t.Fatal(err)
	} else if _, ok := flatLayoutOf[tps.ClusterStep](pf.pf); !ok {
		t.Fatal("cluster rows not read flat")
	} else if _, ok := flatLayoutOf[tps.StepRecord](pf.pf); ok {
		t.Error("StepRecord (pointers, a bool) given a flat layout")
	}
	flat, err := ReadAll[tps.ClusterStep](dir)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := ReadAll[tps.ClusterStep](dir, func(c *readConfig) { c.rowsOnly = true })
	if err != nil {
		t.Fatal(err)
	}
	if len(flat) != len(rows) || len(slow) != len(rows) {
		t.Fatalf("flat %d rows, rows %d, written %d", len(flat), len(slow), len(rows))
	}
	for i := range rows {
		if !reflect.DeepEqual(flat[i], slow[i]) || !reflect.DeepEqual(flat[i], rows[i]) {
			t.Fatalf("row %d: flat %+v\nrows %+v\nwritten %+v", i, flat[i], slow[i], rows[i])
		}
	}
	// a part of an older schema: fewer columns
	type old struct {
		Job  string  `parquet:"job,dict"`
		Step int64   `parquet:"step"`
		TPS  float64 `parquet:"tps"`
	}
	ow, _ := NewPartWriter[old](root, "o", ClusterSteps, WriterOptions{WriterID: "o"})
	ow.Write([]old{{"o", 3, 2.5}, {"o", 4, 3.5}})
	ow.Close()
	got, err := ReadAll[tps.ClusterStep](filepath.Join(root, "o", ClusterSteps))
	if err != nil || len(got) != 2 || got[1].Step != 4 || got[1].TPS != 3.5 || got[1].Tokens != 0 || got[1].Job != "o" {
		t.Errorf("old part: %v %+v", err, got)
	}
}

// A Footers keeps at most FootersKept idle parts open: reading a table of
// 40 parts twice, from two goroutines at once, leaves FootersKept open, the second
// read of a kept part reads no footer again, and Close closes every file
// (the process's open descriptors are back where they were).
func TestFootersBounded(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.ClusterStep](root, "j", ClusterSteps, WriterOptions{WriterID: "f"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		w.Write([]tps.ClusterStep{{Job: "j", Step: int64(i)}})
		w.Rotate()
	}
	w.Close()
	dir := filepath.Join(root, "j", ClusterSteps)
	fds := func() int {
		es, _ := os.ReadDir("/proc/self/fd")
		return len(es)
	}
	before := fds()
	var fs Footers
	var m Meter
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2 {
				if rows, err := ReadAll[tps.ClusterStep](dir, Reuse(&fs), Metered(&m)); err != nil || len(rows) != 40 {
					t.Errorf("%v: %d rows", err, len(rows))
				}
			}
		}()
	}
	wg.Wait()
	fs.mu.Lock()
	kept := len(fs.parts)
	fs.mu.Unlock()
	if kept != FootersKept || fds()-before != FootersKept {
		t.Errorf("%d parts kept, %d descriptors more than before; want %d", kept, fds()-before, FootersKept)
	}
	// a kept part read again costs its data, not its footer
	files, _ := PartFiles(dir)
	fs.mu.Lock()
	var keptPath string
	for p := range fs.parts {
		keptPath = p
	}
	fs.mu.Unlock()
	var again, fresh Meter
	eachInFile(keptPath, make([]tps.ClusterStep, 8), func([]tps.ClusterStep) error { return nil }, readOptions([]ReadOption{Reuse(&fs), Metered(&again)}))
	eachInFile(keptPath, make([]tps.ClusterStep, 8), func([]tps.ClusterStep) error { return nil }, readOptions([]ReadOption{Metered(&fresh)}))
	if again.Bytes() >= fresh.Bytes() || len(files) != 40 {
		t.Errorf("a kept part read again took %d B, opened afresh %d", again.Bytes(), fresh.Bytes())
	}
	fs.Close()
	if n := fds(); n != before {
		t.Errorf("%d descriptors after Close, %d before", n, before)
	}
}

// populate leaves a slice's contents as they were, whatever its size and
// alignment.
func TestPopulateKeepsContents(t *testing.T) {
	for _, n := range []int{0, 1, 1000, 1 << 19, 1<<20 + 3} {
		s := make([]int64, n)
		for i := range s {
			s[i] = int64(i) * 7
		}
		populate(s)
		populate(s[min(n, 1):]) // unaligned
		for i := range s {
			if s[i] != int64(i)*7 {
				t.Fatalf("n %d: s[%d] = %d after populate", n, i, s[i])
			}
		}
	}
}

// Each decodes GPU samples flat (int32, optional *int64 and *float64
// columns) to what parquet-go's rows give: 5,000 samples, every optional
// field null in about a third of the rows and random (infinities too)
// elsewhere, in row groups of 333 rows and two parts, by Each whole and
// by Each within a time range, against the rows and what was written.
func TestEachFlatMatchesRows(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.GPUSample](root, "j", GPUSamples, WriterOptions{WriterID: "f", RowsPerGroup: 333})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	rows := make([]tps.GPUSample, 5_000)
	for i := range rows {
		r := &rows[i]
		r.Job, r.Node, r.UUID, r.Index, r.UnixNs = "j", "node-"+string(rune('a'+i%5)), "GPU-"+string(rune('0'+i%8)), int32(rng.Int64N(1<<31)-1<<30), int64(i)*1e9
		v := reflect.ValueOf(r).Elem()
		for k := range v.NumField() {
			f := v.Field(k)
			if f.Kind() != reflect.Pointer || rng.IntN(3) == 0 {
				continue
			}
			p := reflect.New(f.Type().Elem())
			switch p.Elem().Kind() {
			case reflect.Int64:
				p.Elem().SetInt(rng.Int64() - 1<<62)
			case reflect.Float64:
				x := rng.NormFloat64() * 1e3
				if rng.IntN(20) == 0 {
					x = math.Inf(1 - 2*rng.IntN(2))
				}
				p.Elem().SetFloat(x)
			}
			f.Set(p)
		}
		if err := w.Write(rows[i : i+1]); err != nil {
			t.Fatal(err)
		}
		if i == 2_499 {
			w.Rotate()
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "j", GPUSamples)
	part, _ := PartFiles(dir)
	if pf, err := openNew(part[0], &readConfig{}); err != nil {
		t.Fatal(err)
	} else if _, ok := flatLayoutOf[tps.GPUSample](pf.pf); !ok {
		t.Fatal("GPU samples not read flat")
	}
	read := func(opts ...ReadOption) []tps.GPUSample {
		var out []tps.GPUSample
		if err := Each(dir, func(rs []tps.GPUSample) error {
			for _, r := range rs {
				out = append(out, r) // the pointers are the rows': they outlive the call
			}
			return nil
		}, opts...); err != nil {
			t.Fatal(err)
		}
		return out
	}
	flat, slow := read(), read(func(c *readConfig) { c.rowsOnly = true })
	if len(flat) != len(rows) || len(slow) != len(rows) {
		t.Fatalf("flat %d rows, rows %d, written %d", len(flat), len(slow), len(rows))
	}
	for i := range rows {
		if !reflect.DeepEqual(flat[i], slow[i]) || !reflect.DeepEqual(flat[i], rows[i]) {
			t.Fatalf("row %d: flat %+v\nrows %+v\nwritten %+v", i, flat[i], slow[i], rows[i])
		}
	}
	// within a time range: the row groups that hold it, whole
	in := read(Within(Range{Column: "unix_ns", Min: 1000e9, Max: 1999e9}))
	if len(in) < 1000 || len(in) > 1000+2*333 {
		t.Fatalf("%d rows within 1,000 s of samples, want its row groups'", len(in))
	}
	for _, r := range in {
		if i := int(r.UnixNs / 1e9); !reflect.DeepEqual(r, rows[i]) {
			t.Fatalf("row %d within the range: %+v, written %+v", i, r, rows[i])
		}
	}
}
