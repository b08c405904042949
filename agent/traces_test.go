package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/internal/natsconn"
)

// Only regular files directly in the trace folder are analysed: a path
// elsewhere, a relative one, a link or a folder is refused and counted.
func TestTraceNotesAreChecked(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	dir, _ := os.MkdirTemp("", "tpsprof-tr")
	defer os.RemoveAll(dir)
	a, err := Start(Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	td := DefaultTraceDir(filepath.Join(dir, "a.sock"))
	if fi, err := os.Stat(td); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("trace folder %s: %v %v", td, fi, err)
	}
	outside := filepath.Join(dir, "x.json")
	os.WriteFile(outside, []byte("{}"), 0o600)
	link := filepath.Join(td, "link.json")
	os.Symlink(outside, link)
	os.Mkdir(filepath.Join(td, "sub.json"), 0o700)
	for _, p := range []string{outside, "rel.json", link, filepath.Join(td, "sub.json"), filepath.Join(td, "missing.json"),
		filepath.Join(td, "..", "x.json")} {
		if err := a.SubmitTrace(TraceNote{Job: "j", Path: p}); err == nil {
			t.Errorf("%s: accepted", p)
		}
	}
	if n := a.Stats().Rejected["trace:path"]; n != 6 {
		t.Errorf("trace:path rejections %d, want 6", n)
	}
	if err := a.SubmitTrace(TraceNote{Job: "bad job", Path: filepath.Join(td, "a.json")}); err == nil {
		t.Error("invalid job accepted")
	}
	// An unreadable trace in the folder is analysed, counted and deleted.
	bad := filepath.Join(td, "j.0.0.1.pt.trace.json")
	os.WriteFile(bad, []byte(`{"traceEvents":[{"ph":"X"`), 0o600)
	if err := a.SubmitTrace(TraceNote{Job: "j", Step: 1, Path: bad}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.Stats().Rejected["trace:unreadable"] != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("unreadable trace not counted: %v", a.Stats().Rejected)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("the unreadable trace was not deleted: %v", err)
	}
}
