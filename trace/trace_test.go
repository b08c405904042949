package trace

import (
	"errors"
	"github.com/parquet-go/parquet-go"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

func rows(n int) []tps.StepRecord {
	out := make([]tps.StepRecord, n)
	for i := range out {
		dp := int32(i % 7)
		out[i] = tps.StepRecord{Job: "j", Step: int64(i / 64), Rank: int64(i % 64), WorldSize: 64, DPRank: &dp,
			Node: "node-" + string(rune('a'+i%8)), StartUnixNs: 1_760_000_000_000_000_000 + int64(i), EndUnixNs: 1_760_000_000_100_000_000 + int64(i),
			DurationNs: 1e8, Tokens: int64(1000 + i)}
		if i%3 == 0 {
			l := float64(i) / 10
			out[i].Loss = &l
		}
	}
	return out
}

func TestRoundTripWithRotation(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{RowsPerGroup: 1000, RowsPerPart: 3000,
		WriterID: "test", Metadata: func() map[string]string { return map[string]string{MetaRun: `{"job":"j"}`} }})
	if err != nil {
		t.Fatal(err)
	}
	in := rows(10000)
	for i := 0; i < len(in); i += 512 {
		if err := w.Write(in[i:min(i+512, len(in))]); err != nil {
			t.Fatal(err)
		}
	}
	// Before Close, the last part is still hidden.
	files, _ := PartFiles(w.Dir())
	if len(files) != 3 {
		t.Errorf("got %d complete parts before close, want 3", len(files))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ = PartFiles(w.Dir())
	if len(files) != 4 || w.Rows() != 10000 {
		t.Fatalf("got %d parts, %d rows; want 4 and 10000", len(files), w.Rows())
	}
	out, err := ReadAll[tps.StepRecord](w.Dir())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		for i := range in {
			if !reflect.DeepEqual(in[i], out[i]) {
				t.Fatalf("row %d: got %+v, want %+v", i, out[i], in[i])
			}
		}
		t.Fatalf("got %d rows, want %d", len(out), len(in))
	}
	md, err := FileMetadata(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if md[MetaSchemaVersion] != SchemaVersion || md[MetaJob] != "j" || md[MetaTable] != RankSteps || md[MetaRun] != `{"job":"j"}` {
		t.Errorf("metadata: %v", md)
	}
	entries, _ := os.ReadDir(w.Dir())
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// A writer that dies mid-part (kill -9) leaves only a hidden temporary file,
// which readers skip; the complete parts stay readable.
func TestCrashLeavesNoTornPart(t *testing.T) {
	root := t.TempDir()
	w, _ := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{RowsPerPart: 100, WriterID: "a"})
	r := rows(150)
	if err := w.Write(r[:100]); err != nil { // one complete part
		t.Fatal(err)
	}
	if err := w.Write(r[100:]); err != nil { // one open part
		t.Fatal(err)
	}
	// abandon w without Close
	got, err := ReadAll[tps.StepRecord](filepath.Join(root, "j", RankSteps))
	if err != nil {
		t.Fatalf("complete parts unreadable: %v", err)
	}
	if len(got) != 100 {
		t.Errorf("got %d rows, want the 100 of the complete part", len(got))
	}
}

func TestUnwritableDirectory(t *testing.T) {
	if os.Geteuid() == 0 {
		// root ignores permission bits; use a path under a regular file instead.
		f := filepath.Join(t.TempDir(), "file")
		os.WriteFile(f, nil, 0o644)
		if _, err := NewPartWriter[tps.StepRecord](f, "j", RankSteps, WriterOptions{}); err == nil {
			t.Fatal("writer under a regular file accepted")
		}
		return
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o500)
	defer os.Chmod(dir, 0o700)
	if _, err := NewPartWriter[tps.StepRecord](dir, "j", RankSteps, WriterOptions{}); err == nil {
		t.Fatal("writer in a read-only directory accepted")
	}
}

// Empty, garbage and truncated parts are skipped with their names; the
// readable parts are read (parquet-go panicked on such files).
func TestUnreadablePartsSkipped(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]tps.StepRecord{{Job: "j", Step: 1, Tokens: 5}, {Job: "j", Step: 2, Tokens: 6}})
	w.Close()
	dir := filepath.Join(root, "j", RankSteps)
	good := w.Parts()[0]
	b, _ := os.ReadFile(good)
	os.WriteFile(filepath.Join(dir, "part-x-empty.parquet"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "part-x-garbage.parquet"), []byte("not parquet at all\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "part-x-truncated.parquet"), b[:len(b)/2], 0o644)
	rows, err := ReadAll[tps.StepRecord](dir)
	var u *UnreadableParts
	if !errors.As(err, &u) || len(u.Paths) != 3 || len(rows) != 2 || !IsUnreadable(err) {
		t.Fatalf("rows %d, err %v", len(rows), err)
	}
	n := 0
	err = EachColumns(dir, []string{"step", "tokens"}, "", func(c *Columns) error { n += c.Rows; return nil })
	if !errors.As(err, &u) || len(u.Paths) != 3 || n != 2 {
		t.Fatalf("columns: %d rows, err %v", n, err)
	}
	if _, err := ReadFile[tps.StepRecord](filepath.Join(dir, "part-x-empty.parquet")); !IsUnreadable(err) {
		t.Errorf("ReadFile of an empty part: %v", err)
	}
	// A rank_steps part placed in cluster_steps is not read as cluster rows.
	cw, _ := NewPartWriter[tps.ClusterStep](root, "j", ClusterSteps, WriterOptions{WriterID: "a"})
	cw.Write([]tps.ClusterStep{{Job: "j", Step: 1, Tokens: 11}})
	cw.Close()
	cdir := filepath.Join(root, "j", ClusterSteps)
	os.WriteFile(filepath.Join(cdir, "part-x-rank.parquet"), b, 0o644)
	crows, err := ReadAll[tps.ClusterStep](cdir)
	if !errors.As(err, &u) || len(u.Paths) != 1 || !strings.Contains(err.Error(), "a rank_steps part in the cluster_steps folder") || len(crows) != 1 || crows[0].Tokens != 11 {
		t.Errorf("a rank part among cluster parts: rows %+v, err %v", crows, err)
	}
}

// A part whose columns have other types than the table's (written by
// another program under the table's name) is skipped and named; the other
// parts are read (it used to fail the whole report).
func TestWrongTypedPartSkipped(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]tps.StepRecord{{Job: "j", Step: 1, Tokens: 5}, {Job: "j", Step: 2, Tokens: 6}})
	w.Close()
	dir := filepath.Join(root, "j", RankSteps)
	type lying struct {
		Job    string `parquet:"job"`
		Step   string `parquet:"step"`
		Tokens string `parquet:"tokens"`
	}
	f, err := os.Create(filepath.Join(dir, "part-x-lying.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	pw := parquet.NewGenericWriter[lying](f)
	pw.Write([]lying{{Job: "j", Step: "three", Tokens: "many"}})
	pw.Close()
	f.Close()
	rows, err := ReadAll[tps.StepRecord](dir)
	var u *UnreadableParts
	if !errors.As(err, &u) || len(u.Paths) != 1 || len(rows) != 2 || !strings.Contains(err.Error(), "column step is BYTE_ARRAY, want INT64") {
		t.Fatalf("rows %+v, err %v", rows, err)
	}
	n := 0
	err = EachColumns(dir, []string{"step", "tokens"}, "", func(c *Columns) error { n += c.Rows; return nil })
	if !errors.As(err, &u) || len(u.Paths) != 1 || n != 2 {
		t.Fatalf("columns: %d rows, err %v", n, err)
	}
}

// A part's first rows wait in memory (no Parquet writer, no file) until
// there are enough of them or the part rotates; a rotation or close writes
// them, its age counts from its first row, and nothing is lost.
func TestStagedRows(t *testing.T) {
	root := t.TempDir()
	w, _ := NewPartWriter[tps.StepRecord](root, "j", RankSteps, WriterOptions{WriterID: "a", PartAge: time.Hour})
	r := rows(3)
	if err := w.Write(r[:1]); err != nil {
		t.Fatal(err)
	}
	r[0].Tokens = -1 // the caller may reuse its slice: the row was copied
	if w.w != nil || w.f != nil || w.Pending() != 1 {
		t.Fatalf("one row opened a file: writer %v, pending %d", w.w != nil, w.Pending())
	}
	if w.Due(time.Now().Add(59*time.Minute)) || !w.Due(time.Now().Add(61*time.Minute)) {
		t.Error("the staged part's age does not run from its first row")
	}
	w.Write(r[1:])
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := ReadAll[tps.StepRecord](filepath.Join(root, "j", RankSteps))
	if err != nil || len(got) != 3 || got[0].Tokens < 0 || w.Rows() != 3 {
		t.Fatalf("%d rows (%v), first %+v", len(got), err, got[0])
	}
	// past stageRows the writer is made and the rows follow in order
	big := rows(stageRows + 10)
	w2, _ := NewPartWriter[tps.StepRecord](root, "k", RankSteps, WriterOptions{WriterID: "a"})
	w2.Write(big[:5])
	w2.Write(big[5:])
	if w2.w == nil {
		t.Fatal("no Parquet writer past stageRows")
	}
	w2.Close()
	got, _ = ReadAll[tps.StepRecord](filepath.Join(root, "k", RankSteps))
	if len(got) != len(big) || got[0].Step != big[0].Step || got[len(got)-1].Step != big[len(big)-1].Step {
		t.Fatalf("%d rows", len(got))
	}
}
