package trace_test

import (
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// A part of many small row groups whose footer claims 4 Mi rows each
// (MaxGroupRows: no group alone is past the bound), its column chunks as
// many values, asked ReadAll to size 268 M rows (the collector's first
// second: "fatal error: runtime: out of memory"). The bytes its chunks
// take show the lie: the part is skipped, named, the others read, in
// bounded memory, by every reader.
func TestFooterClaimingMoreRowsThanItsBytes(t *testing.T) {
	root := t.TempDir()
	w, err := trace.NewPartWriter[tps.Event](root, "j", trace.Events, trace.WriterOptions{RowsPerGroup: 4, WriterID: "ok"})
	if err != nil {
		t.Fatal(err)
	}
	ev := make([]tps.Event, 256)
	for i := range ev {
		ev[i] = tps.Event{Job: "j", Kind: tps.EventCheckpointSave, Step: int64(i), StartUnixNs: 1e18 + int64(i), EndUnixNs: 1e18 + int64(i) + 5}
	}
	if err := w.Write(ev[:128]); err != nil {
		t.Fatal(err)
	}
	if err := w.Rotate(); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ev[128:]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "j", trace.Events)
	parts, _ := trace.PartFiles(dir)
	if len(parts) != 2 {
		t.Fatalf("%d parts, want 2", len(parts))
	}
	for _, values := range []bool{false, true} {
		if err := tracetest.LieRows(parts[1], trace.MaxGroupRows, values); err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		all, err := trace.ReadAll[tps.Event](dir)
		if !trace.IsUnreadable(err) || !strings.Contains(err.Error(), filepath.Base(parts[1])) {
			t.Errorf("values %v: ReadAll: %v, want the lying part named", values, err)
		}
		if len(all) != 128 {
			t.Errorf("values %v: ReadAll read %d rows, want the other part's 128", values, len(all))
		}
		n := 0
		err = trace.Each(dir, func(rows []tps.Event) error { n += len(rows); return nil })
		if !trace.IsUnreadable(err) || n != 128 {
			t.Errorf("values %v: Each: %d rows, %v", values, n, err)
		}
		if _, err := trace.ReadFile[tps.Event](parts[1]); !trace.IsUnreadable(err) {
			t.Errorf("values %v: ReadFile of the lying part: %v", values, err)
		}
		if got := trace.RowCount(dir); got != 128 {
			t.Errorf("values %v: RowCount %d, want 128", values, got)
		}
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("values %v: the reads allocated %d MiB", values, grew>>20)
		}
	}
}
