package report

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// Every Analyze in this package's tests is run a second time with the
// cluster rows streamed three steps at a time, and the two reports must
// be the same, byte for byte in JSON, but for the bytes read (the
// streamed one reads the spine, then the rows, then the episodes' rows
// again). Every fixture of every test is so a case of the streamed pass.
var (
	streamMu    sync.Mutex
	streamDiffs []string
	streamRuns  int
)

func TestMain(m *testing.M) {
	checkStreamed = func(dir string, held, streamed *Report, err error) {
		streamMu.Lock()
		defer streamMu.Unlock()
		streamRuns++
		if err != nil {
			streamDiffs = append(streamDiffs, fmt.Sprintf("%s: streamed: %v", dir, err))
			return
		}
		if d := reportDiff(held, streamed); d != "" {
			streamDiffs = append(streamDiffs, fmt.Sprintf("%s: held and streamed reports differ:\n%s", dir, d))
		}
	}
	code := m.Run()
	if len(streamDiffs) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d of %d streamed reports differ from the held ones:\n%s\n", len(streamDiffs), streamRuns, strings.Join(streamDiffs, "\n"))
		code = 1
	}
	os.Exit(code)
}

// reportDiff is the lines that differ between two reports' JSON, bytes
// read aside ("" when none).
func reportDiff(a, b *Report) string {
	ja, jb := reportJSON(a), reportJSON(b)
	if ja == jb {
		return ""
	}
	return lineDiff(ja, jb)
}

func reportJSON(r *Report) string {
	c := *r
	c.BytesRead = 0
	out, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return err.Error()
	}
	return string(out)
}

// A run longer than a chunk is streamed by Analyze itself (and held by
// AnalyzeWithPlots): 3 chunks of cluster rows, two attempts (the second
// resuming 1,000 steps back), rank_steps as the per-rank source. The
// reports are the same, and the streamed one held less: its peak live
// heap is below the held one's.
func TestStreamedReportEqualsInMemory(t *testing.T) {
	old := clusterChunk
	clusterChunk = 4096
	defer func() { clusterChunk = old }()
	root := t.TempDir()
	dir, err := tracetest.Write(root, "s", tracetest.Run{World: 4, Steps: 10_000, Jitter: true, ClusterRowsPerGroup: 1000, Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	var held, streamed *Report
	heldPeak := heapPeak(func() { held, _, err = AnalyzeWithPlots(dir, Options{Warmup: tps.AutoWarmup}) })
	if err != nil {
		t.Fatal(err)
	}
	streamedPeak := heapPeak(func() { streamed, err = analyze1(dir, Options{Warmup: tps.AutoWarmup}) })
	if err != nil {
		t.Fatal(err)
	}
	if d := reportDiff(held, streamed); d != "" {
		t.Fatalf("held and streamed reports differ:\n%s", d)
	}
	if held.Summary.Steps != 20_000 || held.Summary.Attempts != 2 || held.Goodput.RedoneSteps == 0 {
		t.Fatalf("fixture: %d steps, %d attempts, %d redone; want 20,000, 2 and some", held.Summary.Steps, held.Summary.Attempts, held.Goodput.RedoneSteps)
	}
	t.Logf("peak live heap: held %.1f MiB, streamed %.1f MiB", float64(heldPeak)/(1<<20), float64(streamedPeak)/(1<<20))
}

// analyze1 is Analyze without the second, checking run.
func analyze1(dir string, opt Options) (*Report, error) {
	rep, _, err := analyze(dir, opt, false)
	return rep, err
}
