package fleet

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
	"github.com/tpsprof/tpsprof/trace/tracetest"
)

// A node table that cannot be written (a full disk; here a file where its
// folder goes) no longer empties the view: the pass publishes every job's
// rows, the failed keeps counted (39 hosts and a drain candidate became 2
// hosts and none until space came back).
func TestFailedKeepKeepsTheView(t *testing.T) {
	out := t.TempDir()
	for _, j := range []string{"a", "b", "c"} {
		if _, err := tracetest.Write(out, j, tracetest.Run{World: 2, Steps: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(out, Table), []byte("not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := ScanDir(out, true)
	if err != nil {
		t.Fatal(err)
	}
	if s.Jobs != 3 || len(s.Rows) != 3 || s.KeepFailed == 0 || s.KeepErr == "" {
		t.Errorf("%d jobs, %d rows, %d failed keeps (%q): want 3, 3 and the failure counted", s.Jobs, len(s.Rows), s.KeepFailed, s.KeepErr)
	}
}

// Old temporaries of an interrupted keep are removed at the next pass that
// writes; a young one (a keep under way elsewhere) stays. Retention leaves
// out old jobs and removes their kept rows.
func TestTemporariesAndRetention(t *testing.T) {
	out := t.TempDir()
	for _, j := range []string{"old", "new"} {
		if _, err := tracetest.Write(out, j, tracetest.Run{World: 2, Steps: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ScanDir(out, true); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(out, Table)
	stale, young := filepath.Join(dir, ".old.parquet.123.tmp"), filepath.Join(dir, ".new.parquet.456.tmp")
	os.WriteFile(stale, []byte("x"), 0o644)
	os.WriteFile(young, []byte("x"), 0o644)
	long := time.Now().Add(-2 * time.Hour)
	os.Chtimes(stale, long, long)
	// "old" last changed 10 days ago
	ago := time.Now().Add(-240 * time.Hour)
	for _, p := range []string{"", "cluster_steps", "rank_steps", "events", "gpu_samples"} {
		os.Chtimes(filepath.Join(out, "old", p), ago, ago)
	}
	s, err := ScanDirWith(out, ScanOptions{Write: true, Retention: 168 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("the stale temporary is still there")
	}
	if _, err := os.Stat(young); err != nil {
		t.Error("the young temporary was removed")
	}
	if s.Jobs != 1 || s.Removed != 2 {
		t.Errorf("%d jobs, %d removed: want the new job, and the temporary and the old job's rows removed", s.Jobs, s.Removed)
	}
	if _, err := os.Stat(filepath.Join(dir, "old.parquet")); err == nil {
		t.Error("the old job's node rows are still kept")
	}
}

// A kept row with NaN or an absurd figure makes its file unreadable (it
// is recomputed), never a NaN in the view.
func TestNodeRowChecked(t *testing.T) {
	good := JobNode{Job: "j", Key: "host:a", Host: "a", Ranks: 1, WorldSize: 2, Steps: 3, OwnNs: 1, MedianOwnNs: 1}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*JobNode){
		func(n *JobNode) { n.Excess = nan() },
		func(n *JobNode) { n.CostGPUHours = 1e300 },
		func(n *JobNode) { n.ThrottledSamples = 5 },
		func(n *JobNode) { n.Steps = -1 },
		func(n *JobNode) { n.Key = "" },
	} {
		n := good
		bad(&n)
		if err := n.Check(); err == nil {
			t.Errorf("%+v passed", n)
		}
	}
	out := t.TempDir()
	if _, err := tracetest.Write(out, "j", tracetest.Run{World: 2, Steps: 10}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(out, Table), 0o755)
	n := good
	n.Excess = nan()
	path := filepath.Join(out, Table, "j.parquet")
	if err := writeRows(path, []JobNode{n}); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Minute)
	os.Chtimes(path, future, future)
	s, err := ScanDir(out, false)
	if err != nil || !strings.Contains(s.Unreadable["j"], "excess") || s.Computed != 1 {
		t.Errorf("%+v, %v: want the NaN row's file named and the job recomputed", s, err)
	}
	for _, r := range s.Rows {
		if r.Check() != nil {
			t.Errorf("a bad row in the view: %+v", r)
		}
	}
}

func nan() float64 { return math.NaN() }

// A fast job on a slow host cannot hide it (one forged fast job pulled a
// slow host's score to -0.371): its excess counts as 0 in the score.
func TestFastJobCannotHideASlowHost(t *testing.T) {
	at := time.Unix(1_760_000_000, 0)
	row := func(job string, excess float64, k int) JobNode {
		return JobNode{Job: job, Key: "host:h", Host: "h", Excess: excess, EndUnixNs: at.Add(time.Duration(k) * time.Hour).UnixNano()}
	}
	rows := []JobNode{row("s1", 0.05, 1), row("s2", 0.05, 2), row("s3", 0.05, 3), row("fast", -0.9, 4)}
	n := Health(rows, DefaultOptions())
	if len(n) != 1 || !n[0].Drain || n[0].Score < 0.02 {
		t.Errorf("%+v: want the slow host still a drain candidate", n)
	}
}

// A node's GPU-hours count the ranks that reported its steps, not the
// world size its records claim (4 Mi ranks charged 1,630 GPU-hours for 3 s).
func TestCostCountsTheRanksThatReported(t *testing.T) {
	out := t.TempDir()
	writeRankSteps(t, out, "w", 12, func(s, at int64) []tps.StepRecord {
		return []tps.StepRecord{
			{Job: "w", Step: s, Rank: 0, WorldSize: 1 << 22, Node: "a", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 8e8},
			{Job: "w", Step: s, Rank: 1, WorldSize: 1 << 22, Node: "b", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 9e8},
		}
	})
	rows, err := JobNodes(filepath.Join(out, "w"), "w")
	if err != nil {
		t.Fatal(err)
	}
	var cost float64
	for _, r := range rows {
		cost += r.CostGPUHours
	}
	// 10 steps past the warm-up, 0.1 s over the other host, 2 ranks waiting
	if want := 10 * 0.1 * 2 / 3600; math.Abs(cost-want) > 1e-9 {
		t.Errorf("%.6f GPU-hours, want %.6f (the 2 ranks that reported)", cost, want)
	}
}

// A job that ran on one host compares that host with nobody: no excess,
// never a slow job (single-host jobs drained their host against itself).
func TestSingleHostJobIsNoEvidenceOfSlowness(t *testing.T) {
	out := t.TempDir()
	writeRankSteps(t, out, "one", 12, func(s, at int64) []tps.StepRecord {
		return []tps.StepRecord{
			{Job: "one", Step: s, Rank: 0, WorldSize: 2, Node: "h", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 5e8},
			{Job: "one", Step: s, Rank: 1, WorldSize: 2, Node: "h", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 9e8},
		}
	})
	rows, err := JobNodes(filepath.Join(out, "one"), "one")
	if err != nil || len(rows) != 1 || rows[0].Excess != 0 {
		t.Fatalf("%+v, %v: want one row of excess 0", rows, err)
	}
}

// One user's slow jobs alone do not drain a host another user's jobs ran
// well on meanwhile (three jobs whose rank slept drained healthy-17);
// slow jobs of two users do, as do one user's where nobody else ran, or
// where no agent said whose the jobs were.
func TestOneUsersSlowJobsDoNotDrain(t *testing.T) {
	at := time.Unix(1_760_000_000, 0)
	row := func(job string, excess float64, k int, users string) JobNode {
		return JobNode{Job: job, Key: "host:h", Host: "h", Excess: excess, Users: users, EndUnixNs: at.Add(time.Duration(k) * time.Hour).UnixNano()}
	}
	for _, c := range []struct {
		name  string
		rows  []JobNode
		drain bool
	}{
		{"one user's slow jobs, another's good ones between", []JobNode{row("f1", 0.3, 1, "1000"), row("ok1", 0, 2, "1001"), row("f2", 0.3, 3, "1000"), row("f3", 0.3, 4, "1000")}, false},
		{"two users' slow jobs", []JobNode{row("a1", 0.3, 1, "1000"), row("ok1", 0, 2, "1001"), row("b1", 0.3, 3, "1001"), row("a2", 0.3, 4, "1000")}, true},
		{"one user's, nobody else since", []JobNode{row("ok0", 0, 0, "1001"), row("a1", 0.3, 1, "1000"), row("a2", 0.3, 2, "1000"), row("a3", 0.3, 3, "1000")}, true},
		{"users not said", []JobNode{row("a1", 0.3, 1, ""), row("ok1", 0, 2, ""), row("a2", 0.3, 3, ""), row("a3", 0.3, 4, "")}, true},
	} {
		n := Health(c.rows, DefaultOptions())
		if len(n) != 1 || n[0].Drain != c.drain || (n[0].Held != "") == c.drain {
			t.Errorf("%s: %+v: want drain %v, held said where not", c.name, n, c.drain)
		}
	}
	// JobNodes takes the users from the agents' rank_user events, by node
	out := t.TempDir()
	writeRankSteps(t, out, "u", 12, func(s, at int64) []tps.StepRecord {
		return []tps.StepRecord{
			{Job: "u", Step: s, Rank: 0, WorldSize: 2, Node: "a", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 5e8},
			{Job: "u", Step: s, Rank: 1, WorldSize: 2, Node: "b", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 9e8},
		}
	})
	ew, err := trace.NewPartWriter[tps.Event](out, "u", trace.Events, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ew.Write([]tps.Event{
		{Job: "u", Kind: tps.EventRankUser, Node: "a", StartUnixNs: tracetest.T0, EndUnixNs: tracetest.T0, Detail: tps.RankUserDetail(1000)},
		{Job: "u", Kind: tps.EventRankUser, Node: "b", Rank: 1, StartUnixNs: tracetest.T0, EndUnixNs: tracetest.T0, Detail: tps.RankUserDetail(1001)},
		{Job: "u", Kind: tps.EventRankUser, Node: "b", Rank: 1, StartUnixNs: tracetest.T0, EndUnixNs: tracetest.T0, Detail: "uid=x"},
	})
	if err := ew.Close(); err != nil {
		t.Fatal(err)
	}
	rows, err := JobNodes(filepath.Join(out, "u"), "u")
	if err != nil || len(rows) != 2 || rows[0].Users != "1000" || rows[1].Users != "1001" {
		t.Fatalf("%+v, %v: want host a of user 1000, b of 1001", rows, err)
	}
}

// A job whose steps are numbered far apart (a sample count) is held by
// step as one numbered by the loop: the same rows either way.
func TestSparseStepNumbersSameRows(t *testing.T) {
	rowsOf := func(every int64) []JobNode {
		out := t.TempDir()
		writeRankSteps(t, out, "s", 40, func(s, at int64) []tps.StepRecord {
			return []tps.StepRecord{
				{Job: "s", Step: s * every, Rank: 0, WorldSize: 3, Node: "a", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 5e8 + (s%3)*1e8},
				{Job: "s", Step: s * every, Rank: 1, WorldSize: 3, Node: "b", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 6e8},
				{Job: "s", Step: s * every, Rank: 2, WorldSize: 3, Node: "c", StartUnixNs: at, EndUnixNs: at + 9e8, DurationNs: 9e8 - (s%5)*1e8},
			}
		})
		rows, err := JobNodes(filepath.Join(out, "s"), "s")
		if err != nil || len(rows) != 3 {
			t.Fatalf("%+v, %v", rows, err)
		}
		return rows
	}
	dense, sparse := rowsOf(1), rowsOf(100_000)
	for i := range dense {
		if dense[i].CostGPUHours != sparse[i].CostGPUHours || dense[i].OwnNs != sparse[i].OwnNs || dense[i].CostGPUHours == 0 && i == 2 {
			t.Errorf("host %s: dense %+v, sparse %+v", dense[i].Host, dense[i], sparse[i])
		}
	}
}

// writeRankSteps writes job's rank_steps under out, rows(s, at) for each
// of steps steps (at: the step's start, a second apart).
func writeRankSteps(t *testing.T, out, job string, steps int, rows func(s, at int64) []tps.StepRecord) {
	t.Helper()
	w, err := trace.NewPartWriter[tps.StepRecord](out, job, trace.RankSteps, trace.WriterOptions{WriterID: "t"})
	if err != nil {
		t.Fatal(err)
	}
	for s := range int64(steps) {
		w.Write(rows(s, tracetest.T0+s*1e9))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
