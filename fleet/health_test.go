package fleet

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/trace"
)

func row(job, host string, end int64, excess float64) JobNode {
	return JobNode{Job: job, Key: "host:" + host, Host: host, EndUnixNs: end, Excess: excess}
}

// The drain rules of docs/nodes.md: slowness in MinJobs jobs, or one job's
// strong hardware evidence; a decayed score forgets a mended host; a GPU's
// rows fold into its host.
func TestHealthRules(t *testing.T) {
	var rows []JobNode
	add := func(r JobNode) { rows = append(rows, r) }
	// a: slow in 2 jobs, then a third
	add(row("j1", "a", 1, 0.04))
	add(row("j2", "a", 2, 0.035))
	drain := func(host string) (Node, bool) {
		for _, n := range Health(rows, DefaultOptions()) {
			if n.Host == host {
				return n, n.Drain
			}
		}
		t.Fatalf("no host %s", host)
		return Node{}, false
	}
	if n, d := drain("a"); d {
		t.Errorf("drained after 2 slow jobs: %+v", n)
	}
	add(row("j3", "a", 3, 0.03))
	if n, d := drain("a"); !d || n.SlowJobs != 3 || !strings.Contains(n.Why, "slow in 3 of its 3 jobs") {
		t.Errorf("3 slow jobs: %+v", n)
	}
	// d: slow in 3 old jobs, then 6 good ones: the decayed score is under 2%
	for i, e := range []float64{0.05, 0.05, 0.05, 0, 0, 0, 0, 0, 0} {
		add(row("d"+string(rune('0'+i)), "d", int64(10+i), e))
	}
	if n, d := drain("d"); d || n.SlowJobs != 3 || n.Score >= 0.02 {
		t.Errorf("mended host: %+v", n)
	}
	// b: one job, one GPU throttled in 30% of its samples: hardware evidence
	add(JobNode{Job: "j9", Key: "gpu:G1", Host: "b", GPU: "G1", EndUnixNs: 5, Excess: 0.01, GPUSamples: 10, ThrottledSamples: 3, ThrottleReasons: "hardware slowdown"})
	add(JobNode{Job: "j9", Key: "gpu:G2", Host: "b", GPU: "G2", EndUnixNs: 5, Excess: -0.01, GPUSamples: 10})
	if n, d := drain("b"); !d || n.Worst != "G1" || n.ThrottledJobs != 1 || !strings.Contains(n.Why, "hardware: GPU G1 throttled in 30%") || len(n.GPUs) != 2 || n.Jobs != 1 {
		t.Errorf("throttling GPU: %+v", n)
	}
	// c: an XID; e: 20% throttled (under a quarter) and not slow
	add(JobNode{Job: "j9", Key: "gpu:G3", Host: "c", GPU: "G3", EndUnixNs: 5, XIDEvents: 1})
	add(JobNode{Job: "j9", Key: "gpu:G4", Host: "e", GPU: "G4", EndUnixNs: 5, GPUSamples: 10, ThrottledSamples: 2, ThrottleReasons: "software power cap"})
	if n, d := drain("c"); !d || !strings.Contains(n.Why, "1 XID event") {
		t.Errorf("XID: %+v", n)
	}
	if n, d := drain("e"); d {
		t.Errorf("20%% throttled, not slow: %+v", n)
	}
	// drain candidates first
	if h := Health(rows, DefaultOptions()); !h[0].Drain || h[len(h)-1].Drain {
		t.Errorf("order: %+v", h)
	}
	// --since: a's jobs before 3 left out
	o := DefaultOptions()
	o.Since = time.Unix(0, 3)
	for _, n := range Health(rows, o) {
		if n.Host == "a" && (n.Jobs != 1 || n.Drain) {
			t.Errorf("since: %+v", n)
		}
	}
}

// A scan stops between two jobs once asked (a collector closing), with
// ErrStopped; a folder without finished jobs makes no nodes/ table.
func TestScanStops(t *testing.T) {
	out := t.TempDir()
	for _, j := range []string{"a", "b"} {
		if err := os.MkdirAll(filepath.Join(out, j, trace.ClusterSteps), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	close(stop)
	if _, err := ScanDirUntil(out, true, stop); !errors.Is(err, ErrStopped) {
		t.Fatalf("stopped scan: %v", err)
	}
	s, err := ScanDir(out, true)
	if err != nil || s.Jobs != 2 || len(s.Rows) != 0 {
		t.Fatalf("scan %+v, %v", s, err)
	}
	if _, err := os.Stat(filepath.Join(out, Table)); err != nil {
		t.Errorf("nodes/: %v (two finished jobs with no node rows are kept as empty files)", err)
	}
	if s, err := ScanDir(out, true); err != nil || s.Jobs != 2 || s.Computed != 0 {
		t.Errorf("second scan %+v, %v: want both jobs read back from nodes/", s, err)
	}
}
