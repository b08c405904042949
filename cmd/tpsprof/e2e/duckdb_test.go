package e2e

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/demo"
	"github.com/tpsprof/tpsprof/report"
)

// duckdbModules returns a node_modules folder holding @duckdb/node-api:
// $TPSPROF_DUCKDB_NODE_MODULES, or the repository's .cache, installing it
// there from the npm registry when missing.
func duckdbModules(t testing.TB) string {
	if d := os.Getenv("TPSPROF_DUCKDB_NODE_MODULES"); d != "" {
		return d
	}
	cache := filepath.Join(repoRoot(t), ".cache", "duckdb-node")
	mods := filepath.Join(cache, "node_modules")
	if _, err := os.Stat(filepath.Join(mods, "@duckdb", "node-api")); err == nil {
		return mods
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatalf("DuckDB check needs node and npm: %v", err)
	}
	os.MkdirAll(cache, 0o755)
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--prefix", cache, "@duckdb/node-api@1.5.6-r.1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install @duckdb/node-api: %v\n%s", err, out)
	}
	return mods
}

// duckdbScript stages testdata/name where Node finds @duckdb/node-api (a
// folder of its own, the modules linked beside it: Node resolves packages
// from the script's folder upwards) and returns the script's path.
func duckdbScript(tb testing.TB, name string) string {
	tb.Helper()
	mods := duckdbModules(tb)
	src, err := os.ReadFile(filepath.Join(repoRoot(tb), "cmd", "tpsprof", "e2e", "testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	work := tb.TempDir()
	os.Symlink(mods, filepath.Join(work, "node_modules"))
	script := filepath.Join(work, name)
	if err := os.WriteFile(script, src, 0o644); err != nil {
		tb.Fatal(err)
	}
	return script
}

// DuckDB reads the demo's Parquet as documented, and its figures match.
func TestDuckDBReadsTraces(t *testing.T) {
	script := duckdbScript(t, "duckdb_check.mjs")
	cfg := demo.Defaults()
	cfg.Out, cfg.Steps, cfg.StepInterval = t.TempDir(), 30, 0
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("node", script, res.JobDir).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got struct {
		Cluster struct {
			N, Tokens     string
			RanksReported string `json:"ranks_reported"`
		} `json:"cluster"`
		Ranks struct {
			N, Ranks string
			NullDP   string `json:"null_dp"`
		} `json:"ranks"`
		TokensFromRanks struct{ Tokens string } `json:"tokens_from_ranks"`
		Events          struct{ N string }      `json:"events"`
		Meta            struct{ V string }      `json:"meta"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	num := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	wantTokens := int64(30 * 4 * 16 * 8192)
	if num(got.Cluster.N) != 30 || num(got.Cluster.Tokens) != wantTokens || num(got.Cluster.RanksReported) != 30*64 {
		t.Errorf("cluster_steps through DuckDB: %+v", got.Cluster)
	}
	if num(got.Ranks.N) != 30*64 || num(got.Ranks.Ranks) != 64 || num(got.Ranks.NullDP) != 0 {
		t.Errorf("rank_steps through DuckDB: %+v", got.Ranks)
	}
	if num(got.TokensFromRanks.Tokens) != wantTokens {
		t.Errorf("tokens recomputed from rank_steps: %s, want %d", got.TokensFromRanks.Tokens, wantTokens)
	}
	if got.Meta.V != "1" {
		t.Errorf("schema version metadata: %q", got.Meta.V)
	}
}

// The report's figures computed by DuckDB from the same folders with the
// SQL docs/parquet.md gives agree with the report's: the headline (tokens
// over step time), the steps' rate quantiles, median step time, the time
// breakdown and MFU weighted by step time, and
// the slowest rank's straggler score.
func TestDuckDBAgreesWithReport(t *testing.T) {
	script := duckdbScript(t, "duckdb_report.mjs")
	cfg := demo.Defaults()
	cfg.Out, cfg.Steps, cfg.StepInterval = t.TempDir(), 60, 0
	res, err := demo.Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := report.Analyze(res.JobDir, report.Options{Warmup: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	out, err := exec.Command("node", script, res.JobDir).CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, out)
	}
	var got map[string]map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	num := func(table, key string) float64 {
		switch v := got[table][key].(type) {
		case float64:
			return v
		case string:
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
		t.Fatalf("%s.%s: %v in %s", table, key, got[table][key], out)
		return 0
	}
	s, bd := rep.Summary, rep.Breakdown
	for _, c := range []struct {
		name       string
		duck, ours float64
	}{
		{"TPS p50", num("tps", "p50"), s.TPS.P50}, {"TPS p95", num("tps", "p95"), s.TPS.P95},
		{"step time p50", num("tps", "step_p50"), s.StepTimeS.P50}, {"aggregate TPS", num("tps", "aggregate_tps"), s.AggregateTPS},
		{"compute", num("breakdown", "compute"), bd.Compute}, {"exposed comm", num("breakdown", "exposed_comm"), bd.ExposedComm},
		{"waiting", num("breakdown", "waiting"), bd.WaitingForPeers}, {"bubble", num("breakdown", "bubble"), bd.Bubble},
		{"data stall", num("breakdown", "data_stall"), bd.DataStall}, {"MFU", num("breakdown", "mfu"), *s.MFU},
		{"slowest rank's score", num("straggler", "score"), rep.Stragglers[0].Score},
		{"slowest rank", num("straggler", "rank"), float64(rep.Stragglers[0].Rank)},
	} {
		t.Logf("%s: DuckDB %.6g, report %.6g", c.name, c.duck, c.ours)
		if math.Abs(c.duck-c.ours) > 1e-9*math.Max(1, math.Abs(c.ours)) {
			t.Errorf("%s: DuckDB %.12g, the report %.12g", c.name, c.duck, c.ours)
		}
	}
}
