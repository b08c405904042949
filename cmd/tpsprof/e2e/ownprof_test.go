package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/capture"
	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/cli"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/natsconn"
)

// A job that runs its own scheduled torch.profiler the whole time survives
// 20 capture requests, on both torches: each capture answers busy for
// every rank (a second profiler session beside the job's crashed the
// process on torch 2.14, 2 of 2 runs, and emptied the job's trace on a
// plain profile()), the job's own traces all have their events, the job
// exits 0, and the refusals never switch the package off (its step
// records keep coming).
func TestOwnProfilerSurvivesCaptures(t *testing.T) {
	t.Run("torch1", func(t *testing.T) { ownProfilerRun(t, torchPython(t)) })
	t.Run("torch2", func(t *testing.T) { ownProfilerRun(t, modernTorchPython(t)) })
}

func ownProfilerRun(t *testing.T, py string) {
	srv, col, out, sock := launchEnv(t)
	defer col.Close()
	dir := t.TempDir()
	stop, traces, truth := filepath.Join(dir, "stop"), filepath.Join(dir, "traces"), filepath.Join(dir, "truth")
	job := "ownprof-" + strconv.Itoa(torchMajor(py))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	j, nc := startJob(ctx, t, srv.URL(), 2, stop, launch.Config{Job: job, PythonDir: t.TempDir(),
		Agent: agent.Config{Socket: sock, NATS: natsconn.Options{URL: srv.URL()}, Node: "own-node", CaptureGap: -1},
		Command: torchrun(py, 2, filepath.Join(repoRoot(t), "examples", "pytorch", "own_profiler_train.py"),
			"--stop", stop, "--traces", traces, "--truth", truth, "--max-steps", "1000000")})
	defer nc.Close()
	log := &j.log
	busy := 0
	var other []string // the answers that were not busy
	for i := range 20 {
		var o, e bytes.Buffer
		cli.Main([]string{"trace", job, "--nats", srv.URL(), "--steps", "1", "--json", "--timeout", "20s"}, &o, &e)
		var v capture.View
		if err := json.Unmarshal(o.Bytes(), &v); err != nil {
			t.Fatalf("capture %d: %v\n%s\n%s", i, err, o.String(), e.String())
		}
		for _, m := range v.Missing {
			if strings.Contains(m.Why, "busy: the job's own profiler") {
				busy++
			} else {
				other = append(other, fmt.Sprintf("capture %d, rank %d: %s", i, m.Rank, m.Why))
			}
		}
		if len(v.Ranks) > 0 {
			t.Errorf("capture %d traced beside the job's own profiler: %+v", i, v.Ranks)
		}
	}
	if code, lerr := j.end(); lerr != nil || code != 0 {
		t.Fatalf("the job did not survive the captures: exit %d, %v\n%s", code, lerr, log.String())
	}
	if busy != 40 {
		t.Errorf("%d of 40 rank answers said busy; the others: %q", busy, other)
	}
	type own struct {
		Rank   int64  `json:"rank"`
		Trace  string `json:"trace"`
		Events int    `json:"events"`
	}
	exported := readTruthLines[own](t, truth)
	if len(exported) < 4 {
		t.Fatalf("the job exported %d traces of its own\n%s", len(exported), log.String())
	}
	lastTrace := map[int64]string{} // each rank's last trace (its log is in export order): stop() exports the cycle it cut short
	for _, x := range exported {
		lastTrace[x.Rank] = x.Trace
	}
	for _, x := range exported {
		if x.Trace == lastTrace[x.Rank] {
			continue
		}
		b, err := os.ReadFile(x.Trace)
		if x.Events < 50 || err != nil || !bytes.Contains(b, []byte("ProfilerStep#")) {
			t.Errorf("the job's own trace %s: %d events, %d bytes, %v", x.Trace, x.Events, len(b), err)
		}
	}
	// the package stayed on: the job's steps reached Parquet to the end
	col.Sync(10 * time.Second)
	col.Close()
	rows := rankRows(t, filepath.Join(out, job))
	var last int64
	for _, r := range rows {
		last = max(last, r.Step)
	}
	if len(rows) < 2*20 || last < int64(len(rows)/2-2) {
		t.Errorf("%d rank rows, last step %d: the package switched itself off?", len(rows), last)
	}
}
