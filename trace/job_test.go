package trace

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// A job opened once: its reads share one meter and the parts' footers
// (a second read of the same part reads no footer again); a file or a
// missing folder is refused.
func TestJob(t *testing.T) {
	root := t.TempDir()
	w, err := NewPartWriter[tps.GPUSample](root, "j", GPUSamples, WriterOptions{WriterID: "g"})
	if err != nil {
		t.Fatal(err)
	}
	u := 50.0
	for i := range int64(100) {
		if err := w.Write([]tps.GPUSample{{Job: "j", Node: "n", UnixNs: 1_760_000_000_000_000_000 + i*1e9, GPUUtilPct: &u}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	j, err := OpenJob(filepath.Join(root, "j"))
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	rows, err := ReadAll[tps.GPUSample](j.Table(GPUSamples), j.Read())
	if err != nil || len(rows) != 100 {
		t.Fatalf("%d rows, %v", len(rows), err)
	}
	first := j.BytesRead()
	if first <= 0 {
		t.Fatal("the read was not metered")
	}
	if _, err := ReadAll[tps.GPUSample](j.Table(GPUSamples), j.Read()); err != nil {
		t.Fatal(err)
	}
	if again := j.BytesRead() - first; again <= 0 || again >= first {
		t.Errorf("the second read took %d bytes after %d: want fewer (its footer kept), more than none", again, first)
	}
	f := filepath.Join(root, "file")
	os.WriteFile(f, []byte("x"), 0o600)
	for _, bad := range []string{f, filepath.Join(root, "none")} {
		if _, err := OpenJob(bad); err == nil {
			t.Errorf("%s opened as a job", bad)
		}
	}
}
