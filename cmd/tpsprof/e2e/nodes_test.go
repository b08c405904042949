package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/cli"
	"github.com/tpsprof/tpsprof/fleet"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/report"
)

// Three real torchrun jobs in a row, each on three "nodes" (three
// torchrun processes with --nnodes 3, each under its own tpsprof launch
// and agent named node-a, node-b, node-c, as on three hosts), node-b's rank
// 30 ms late in its data loading every step of every job: `tpsprof nodes`
// names node-b a drain candidate (slow in 3 of 3 jobs), and no other host,
// with the GPU-hours its lateness cost: by the jobs' own account, each step
// the two other ranks and its own wait its 30 ms (the test holds tpsprof's
// figure within 30% of 3 ranks × 30 ms × the steps counted). The collector's
// own node pass (/api/nodes) agrees. (On torch 1.13 in CI; nothing in it
// depends on the torch version; TPSPROF_TORCH_PYTHON=.ci/sid-python runs
// it on current torch, met at a file rendezvous.)
func TestNodesAcrossRealJobs(t *testing.T) {
	py := torchPython(t)
	srv, col, out, _ := launchEnv(t)
	defer col.Close()
	const steps, sleep = 24, 0.030
	script := filepath.Join(repoRoot(t), "examples", "pytorch", "train.py")
	for j := 1; j <= 3; j++ {
		job := fmt.Sprintf("nodes-%d", j)
		launchNodes(t, py, srv.URL(), job, []string{"node-a", "node-b", "node-c"}, func(name string, cfg *launch.Config) []string {
			ds := "0"
			if name == "node-b" {
				ds = strconv.FormatFloat(sleep, 'f', -1, 64)
			}
			return []string{script, "--steps", strconv.Itoa(steps), "--batch", "2", "--seq", "16", "--vocab", "128", "--dim", "32", "--data-sleep", ds}
		})
		if err := col.Sync(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		waitFinal(t, out, job, 3*steps)
	}
	if !col.RefreshNodes(time.Minute) {
		t.Fatal("no node pass")
	}
	live := col.Nodes()
	var stdout, stderr bytes.Buffer
	if code := cli.Main([]string{"nodes", "--json", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("tpsprof nodes: exit %d\n%s", code, stderr.String())
	}
	var got struct {
		Jobs  int          `json:"jobs"`
		Nodes []fleet.Node `json:"nodes"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Jobs != 3 || len(got.Nodes) != 3 {
		t.Fatalf("%d jobs, %d hosts: %s", got.Jobs, len(got.Nodes), stdout.String())
	}
	b := got.Nodes[0]
	if b.Host != "node-b" || !b.Drain || b.SlowJobs != 3 || got.Nodes[1].Drain || got.Nodes[2].Drain {
		t.Fatalf("want node-b alone a drain candidate, slow in 3 jobs:\n%s", stdout.String())
	}
	counted := float64(3 * (steps - fleet.WarmSteps))
	want := 3 * sleep * counted / 3600
	if b.CostGPUHours < 0.7*want || b.CostGPUHours > 1.3*want {
		t.Errorf("node-b cost %.6f GPU-hours, the jobs' own account %.6f (3 ranks × %.0f ms × %.0f steps)", b.CostGPUHours, want, 1e3*sleep, counted)
		for _, r := range rankRows(t, filepath.Join(out, "nodes-1")) {
			t.Logf("nodes-1 step %d rank %d %s: duration %.1f ms, data %.1f, exposed comm %.1f, compute %.1f", r.Step, r.Rank, r.Node,
				float64(r.DurationNs)/1e6, float64(r.DataWaitNs)/1e6, float64(r.ExposedCommNs)/1e6, float64(r.ComputeNs())/1e6)
		}
	}
	if i := slices.IndexFunc(live.Nodes, func(n fleet.Node) bool { return n.Host == "node-b" }); i != 0 || live.Jobs != 3 ||
		live.Nodes[0].CostGPUHours != b.CostGPUHours || !live.Nodes[0].Drain {
		t.Errorf("the collector's view disagrees: %+v", live)
	}
	// the text names it with its cost and why
	stdout.Reset()
	if code := cli.Main([]string{"nodes", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("tpsprof nodes: exit %d\n%s", code, stderr.String())
	}
	if !bytes.Contains(stdout.Bytes(), []byte("DRAIN: slow in 3 of its 3 jobs")) || !bytes.Contains(stdout.Bytes(), []byte(fmt.Sprintf("%.3f", b.CostGPUHours))) {
		t.Errorf("text:\n%s", stdout.String())
	}
	t.Logf("%s", stdout.String())
	// Markdown; --since leaves older jobs out
	stdout.Reset()
	if code := cli.Main([]string{"nodes", "--markdown", "--since", "1h", out}, &stdout, &stderr); code != 0 || !bytes.Contains(stdout.Bytes(), []byte("| node-b | 3 | 3 |")) {
		t.Errorf("--markdown: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := cli.Main([]string{"nodes", "--json", "--since", time.Now().Add(time.Hour).Format(time.RFC3339), out}, &stdout, &stderr); code != 0 || !bytes.Contains(stdout.Bytes(), []byte(`"nodes": []`)) {
		t.Errorf("--since an hour ahead: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if _, err := os.Stat(filepath.Join(out, fleet.Table, "nodes-1.parquet")); err != nil {
		t.Error(err)
	}
	// docs/nodes.md's SQL in DuckDB over OUT/nodes/: the same hosts, slow
	// jobs and GPU-hours
	raw, err := exec.Command("node", duckdbScript(t, "duckdb_nodes.mjs"), filepath.Join(repoRoot(t), "docs", "nodes.md"), out).CombinedOutput()
	if err != nil {
		t.Fatalf("DuckDB: %v\n%s", err, raw)
	}
	var sql []struct {
		Host     string `json:"host"`
		Jobs     string `json:"jobs"`
		SlowJobs string `json:"slow_jobs"`
		Lost     any    `json:"gpu_hours_lost"`
	}
	if err := json.Unmarshal(raw, &sql); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	lost, _ := strconv.ParseFloat(fmt.Sprint(sql[0].Lost), 64)
	if len(sql) != 3 || sql[0].Host != "node-b" || sql[0].Jobs != "3" || sql[0].SlowJobs != "3" || math.Abs(lost-b.CostGPUHours) > 1e-9 {
		t.Errorf("DuckDB over OUT/nodes/: %s; tpsprof nodes: node-b %d jobs, %d slow, %v GPU-hours", raw, b.Jobs, b.SlowJobs, b.CostGPUHours)
	}
}

// waitFinal waits (at most a minute) until job's folder under out is final
// (no part being written, no attempt open) and holds rows rank rows.
func waitFinal(t *testing.T, out, job string, rows int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		js, _ := report.Jobs(out)
		i := slices.IndexFunc(js, func(j report.JobInfo) bool { return j.Name == job })
		if i >= 0 && !js[i].Running && len(rankRows(t, js[i].Dir)) == rows {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not final after a minute: %+v", job, js)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An elastic job relaunched 4 → 2 → 4 ranks under one job id (three
// `tpsprof launch` runs of torchrun, --synthetic workers: the world sizes
// are torchrun's): three attempts with their world sizes, the 2-rank one
// named a scale-down with the capacity it lost (its wall time × half), the
// last a scale-up, and the goodput's parts adding up to the elapsed time
// (report.Invariants).
func TestElasticRelaunchWorldSizes(t *testing.T) {
	py := torchPython(t)
	srv, col, out, sock := launchEnv(t)
	defer col.Close()
	for i, n := range []int{4, 2, 4} {
		var log bytes.Buffer
		cmd := append(torchrun(py, n, filepath.Join(repoRoot(t), "examples", "pytorch", "train.py")), "--steps", "8", "--synthetic", "--data-sleep", "0.02")
		code, err := launch.Run(context.Background(), launch.Config{Job: "elastic", ChooseAttempt: true, PythonDir: t.TempDir(),
			Agent:   agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "n0"},
			Command: cmd, Stdout: &log, Stderr: &log})
		if err != nil || code != 0 {
			t.Fatalf("launch %d (%d ranks): %d %v\n%s", i, n, code, err, log.String())
		}
		if err := col.Sync(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
	waitFinal(t, out, "elastic", 8*(4+2+4))
	rep, err := report.Analyze(filepath.Join(out, "elastic"), report.Options{Warmup: -1})
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, rep)
	if len(rep.Attempts) != 3 {
		t.Fatalf("%d attempts: %+v", len(rep.Attempts), rep.Attempts)
	}
	var sizes []int64
	for _, a := range rep.Attempts {
		sizes = append(sizes, a.WorldSize)
	}
	a1, a2 := rep.Attempts[1], rep.Attempts[2]
	if !slices.Equal(sizes, []int64{4, 2, 4}) || a1.Change != "scale-down 4→2" || a2.Change != "scale-up 2→4" ||
		math.Abs(a1.CapacityLostS-a1.WallS/2) > 1e-6*a1.WallS || a1.WallS <= 0 || rep.Attempts[0].CapacityLostS != 0 || a2.CapacityLostS != 0 {
		t.Errorf("attempts %+v", rep.Attempts)
	}
	g := rep.Goodput
	t.Logf("attempts %v, %s; goodput %+v", sizes, a1.Change, g)
}

// launchNodes runs one torchrun job as len(nodes) "nodes" of one rank
// each (torchrun --nnodes, node ranks in the order given: a static
// rendezvous on torch 1.13, a file one on current torch), each under its
// own tpsprof launch with its own agent named after its node, reporting to
// the NATS server at natsURL; setup gives a node's script and its
// arguments and may change its launch (zero-code mode, its GPUs). It
// returns when every node has exited, failing the test on any error.
func launchNodes(t *testing.T, py, natsURL, job string, nodes []string, setup func(name string, cfg *launch.Config) []string) {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "tpsprof-nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	port, rdzv := freePort(t), ""
	if torchMajor(py) >= 2 {
		rdzv = filepath.Join(t.TempDir(), "rdzv")
	}
	var wg sync.WaitGroup
	logs := make([]bytes.Buffer, len(nodes))
	codes, errs := make([]int, len(nodes)), make([]error, len(nodes))
	for n, name := range nodes {
		cmd := []string{py, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--nnodes", strconv.Itoa(len(nodes)),
			"--redirects", "2", "--tee", "2", "--monitor_interval", "0.2"}
		if rdzv != "" {
			cmd = append(cmd, "--rdzv_backend", "c10d", "--rdzv_endpoint", rdzv, "--rdzv_conf", "store_type=file")
		} else {
			cmd = append(cmd, "--node_rank", strconv.Itoa(n), "--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port))
		}
		cfg := launch.Config{Job: job, PythonDir: t.TempDir(), Stdout: &logs[n], Stderr: &logs[n],
			Agent: agent.Config{Socket: filepath.Join(sockDir, name+".sock"), NATS: natsconn.Options{URL: natsURL}, Node: name}}
		cfg.Command = append(cmd, setup(name, &cfg)...)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			codes[n], errs[n] = launch.Run(ctx, cfg)
		})
	}
	wg.Wait()
	for n := range nodes {
		if errs[n] != nil || codes[n] != 0 {
			t.Fatalf("%s node %d: exit %d, %v\n%s", job, n, codes[n], errs[n], logs[n].String())
		}
	}
}
