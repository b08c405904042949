package e2e

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
)

// promtool is Debian's prometheus package's; .ci/run installs it.
func promtool(t *testing.T) string {
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (bash .ci/run does)")
	}
	return p
}

// The example rules load and pass their unit tests.
func TestPrometheusRules(t *testing.T) {
	bin := promtool(t)
	dir := filepath.Join("..", "..", "..", "examples", "prometheus")
	for _, args := range [][]string{{"check", "rules", "tpsprof-rules.yml"}, {"test", "rules", "tpsprof-rules_test.yml"}} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// The collector's and an agent's /metrics pass promtool's linter, with
// steps flowing (every metric present).
func TestMetricsPassPromtool(t *testing.T) {
	bin := promtool(t)
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	col, err := collector.New(collector.Config{OutDir: t.TempDir(), NATS: natsconn.Options{URL: srv.URL()}, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	dir, _ := os.MkdirTemp("", "tpsprof-prom")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, FlushInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for s := int64(0); s < 3; s++ {
		for r := int64(0); r < 2; r++ {
			a.SubmitStep(stepRec("prom", s, r, 2, 100, 1e9))
		}
	}
	a.Flush(5 * time.Second)
	col.Sync(5 * time.Second)
	for name, h := range map[string]http.Handler{"collector": col.Handler(), "agent": a.Handler()} {
		body := metricsOf(t, h)
		if !bytes.Contains(body, []byte("tpsprof_")) {
			t.Fatalf("%s: no tpsprof metrics", name)
		}
		cmd := exec.Command(bin, "check", "metrics")
		cmd.Stdin = bytes.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s /metrics: promtool check metrics: %v\n%s", name, err, out)
		}
	}
}

// metricsOf is what a handler serves at /metrics.
func metricsOf(t *testing.T, h http.Handler) []byte {
	t.Helper()
	s := httptest.NewServer(h)
	defer s.Close()
	resp, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return body
}
