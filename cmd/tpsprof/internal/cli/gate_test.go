package cli

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/report"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

// writeJitteredJob writes a 4-rank job of 200 steps whose step times are
// base × (1 ± 3% uniform jitter, seeded) with a 5-step slow phase of +10%
// every 50 steps (slow phases are noise too), 70% of each step computing.
func writeJitteredJob(t *testing.T, root, job string, base float64, seed uint64) string {
	t.Helper()
	ranks, err := trace.NewPartWriter[tps.StepRecord](root, job, trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := trace.NewPartWriter[tps.ClusterStep](root, job, trace.ClusterSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	now, prev := int64(1.7e18), int64(0)
	recs := make([]tps.StepRecord, 4)
	for s := range 200 {
		d := base * (1 + 0.06*(rng.Float64()-0.5))
		if s%50 >= 45 {
			d *= 1.10
		}
		for r := range recs {
			recs[r] = tps.StepRecord{Job: job, Step: int64(s), Rank: int64(r), WorldSize: 4, Node: "n0",
				StartUnixNs: now, EndUnixNs: now + int64(d), DurationNs: int64(d), Tokens: 1000, ExposedCommNs: int64(0.3 * d), CommNs: int64(0.3 * d)}
		}
		acc, err := tps.NewStepAccumulator(job, 0, int64(s), 4, tps.AccumulatorConfig{})
		if err != nil {
			t.Fatal(err)
		}
		for r := range recs {
			if _, err := acc.Add(&recs[r]); err != nil {
				t.Fatal(err)
			}
		}
		c := acc.ResultIn(tps.StepContext{PrevEndUnixNs: prev})
		ranks.Write(recs)
		cluster.Write([]tps.ClusterStep{c})
		prev = now + int64(d)
		now = prev
	}
	if err := ranks.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Close(); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, job)
}

// The comparison as a CI gate: a run 6% slower fails --fail-above 5 in 5
// of 5 seeds; two runs of the same job (other seeds of the same jitter)
// pass in 5 of 5; --keep-baseline and --baseline compare against a run
// kept under a name.
func TestCompareGate(t *testing.T) {
	t.Setenv("TPSPROF_BASELINES", filepath.Join(t.TempDir(), "baselines.json"))
	root := t.TempDir()
	run := func(args ...string) (int, string) {
		var o, e bytes.Buffer
		rc := Main(append([]string{"report", "--no-plots"}, args...), &o, &e)
		return rc, o.String() + e.String()
	}
	for seed := range uint64(5) {
		a := writeJitteredJob(t, root, "a"+string(rune('0'+seed)), 100e6, 10*seed+1)
		same := writeJitteredJob(t, root, "same"+string(rune('0'+seed)), 100e6, 10*seed+2)
		slow := writeJitteredJob(t, root, "slow"+string(rune('0'+seed)), 106e6, 10*seed+3)
		rc, out := run("--compare", "--fail-above", "5", a, slow)
		if seed == 0 {
			t.Logf("%s", grepVerdict(out))
		}
		if rc != exitGate || !strings.Contains(out, "slower than") {
			t.Errorf("seed %d: a 6%% slower run: exit %d\n%s", seed, rc, out)
		}
		rc, out = run("--compare", "--fail-above", "5", a, same)
		if seed == 0 {
			t.Logf("%s", grepVerdict(out))
		}
		if rc != exitOK || !strings.Contains(out, "gate: pass") {
			t.Errorf("seed %d: the same job again: exit %d\n%s", seed, rc, out)
		}
	}
	a0, slow0 := filepath.Join(root, "a0"), filepath.Join(root, "slow0")
	if rc, out := run("--keep-baseline", "main", a0); rc != exitOK || !strings.Contains(out, `baseline "main"`) {
		t.Fatalf("keep: exit %d\n%s", rc, out)
	}
	if rc, out := run("--baseline", "main", "--fail-above", "5", slow0); rc != exitGate || !strings.Contains(out, "verdict: slow0 is ") {
		t.Errorf("against the baseline: exit %d\n%s", rc, out)
	}
	if rc, out := run("--baseline", "nope", slow0); rc != exitUsage || !strings.Contains(out, `no baseline "nope"`) {
		t.Errorf("an unknown baseline: exit %d\n%s", rc, out)
	}
	if rc, out := run("--fail-above", "5", slow0); rc != exitUsage || !strings.Contains(out, "gates a comparison") {
		t.Errorf("--fail-above without a comparison: exit %d\n%s", rc, out)
	}
}

// grepVerdict is the verdict and gate lines of a comparison's output.
func grepVerdict(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "verdict:") || strings.HasPrefix(l, "gate:") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// A baseline is the run kept, not whatever lies at its path: a run put
// there later (another user's, or the folder swapped) is refused, with
// how to keep it again; a FIFO named as the baselines file is refused,
// not waited on; a file of the older form (names to folders) still reads.
func TestBaselineFingerprint(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "baselines.json")
	t.Setenv("TPSPROF_BASELINES", file)
	root := t.TempDir()
	run := func(args ...string) (int, string) {
		var o, e bytes.Buffer
		rc := Main(append([]string{"report", "--no-plots"}, args...), &o, &e)
		return rc, o.String() + e.String()
	}
	kept := writeJitteredJob(t, root, "kept", 100e6, 1)
	other := writeJitteredJob(t, t.TempDir(), "kept", 80e6, 2)
	if rc, out := run("--keep-baseline", "main", kept); rc != exitOK {
		t.Fatalf("keep: exit %d\n%s", rc, out)
	}
	if err := os.RemoveAll(kept); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, kept); err != nil {
		t.Fatal(err)
	}
	probe := writeJitteredJob(t, root, "probe", 100e6, 3)
	if rc, out := run("--baseline", "main", "--fail-above", "5", probe); rc == exitOK || !strings.Contains(out, "changed since it was kept") {
		t.Errorf("a run swapped in at the kept path: exit %d\n%s", rc, out)
	}
	// the older form: a name to a folder
	if err := os.WriteFile(file, []byte(`{"old": "`+kept+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if rc, out := run("--baseline", "old", probe); rc != exitOK || !strings.Contains(out, "verdict:") {
		t.Errorf("a baselines file of the older form: exit %d\n%s", rc, out)
	}
	os.Remove(file)
	if err := syscall.Mkfifo(file, 0o600); err != nil {
		t.Skip("no FIFO here:", err)
	}
	done := make(chan string, 1)
	go func() { _, out := run("--baseline", "main", probe); done <- out }()
	select {
	case out := <-done:
		if !strings.Contains(out, "not a regular file") {
			t.Errorf("a FIFO as the baselines file: %s", out)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the report hangs on a FIFO named as the baselines file")
	}
}

// The gate decides or says it cannot, never passing what it cannot
// decide: a run that counted no token ("pass: no verdict" exited 0), a
// difference inside noise wider than the threshold ("no difference
// beyond the runs' own noise: -6.0% (noise ±12.6%)" passed a 5% gate)
// exit 4; a threshold that is no percentage is a usage error.
func TestGateInconclusive(t *testing.T) {
	root := t.TempDir()
	run := func(args ...string) (int, string) {
		var o, e bytes.Buffer
		rc := Main(append([]string{"report", "--no-plots"}, args...), &o, &e)
		return rc, o.String() + e.String()
	}
	a := writeJitteredJob(t, root, "a", 100e6, 1)
	same := writeJitteredJob(t, root, "same", 100e6, 2)
	if rc, out := run("--compare", "--fail-above", "0.1", a, same); rc != exitInconclusive || !strings.Contains(out, "gate: INCONCLUSIVE") {
		t.Errorf("noise wider than a 0.1%% gate: exit %d\n%s", rc, grepVerdict(out)+lastLines(out))
	}
	if rc, out := run("--compare", "--fail-above", "5", a, same); rc != exitOK {
		t.Errorf("the same job again against a 5%% gate: exit %d\n%s", rc, lastLines(out))
	}
	for _, bad := range []string{"NaN", "-5", "+Inf"} {
		if rc, _ := run("--compare", "--fail-above", bad, a, same); rc != exitUsage {
			t.Errorf("--fail-above %s: exit %d, want a usage error", bad, rc)
		}
	}
	v := report.CompareVerdict(&report.Report{}, &report.Report{})
	var e bytes.Buffer
	if rc := gate(v, 5, &e); rc != exitInconclusive || !strings.Contains(e.String(), "no throughput") {
		t.Errorf("runs without throughput: exit %d: %s", rc, e.String())
	}
}

func lastLines(out string) string {
	l := strings.Split(strings.TrimSpace(out), "\n")
	return strings.Join(l[max(0, len(l)-3):], "\n")
}
