package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
)

// Every metric the Grafana dashboard queries is one the collector or the
// agent exposes, so the dashboard imports and shows data as it is.
func TestGrafanaDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", "grafana", "tpsprof-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	col, err := collector.New(collector.Config{OutDir: t.TempDir(), NATS: natsconn.Options{URL: srv.URL()}})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	dir, _ := os.MkdirTemp("", "tpsprof-graf")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: natsconn.Options{URL: srv.URL()}, FlushInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	known := map[string]bool{}
	for _, r := range []*prometheus.Registry{col.Registry(), a.Registry()} {
		mfs, _ := r.Gather()
		for _, mf := range mfs {
			known[mf.GetName()] = true
		}
	}
	// Gather returns only metrics with values; add the described ones.
	for _, d := range describe(col.Registry(), a.Registry()) {
		known[d] = true
	}
	// Series with a colon are recorded by examples/prometheus/tpsprof-rules.yml.
	rules, err := os.ReadFile(filepath.Join(repoRoot(t), "examples", "prometheus", "tpsprof-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`record:\s*(\S+)`).FindAllStringSubmatch(string(rules), -1) {
		known[m[1]] = true
	}
	re := regexp.MustCompile(`[a-z_:]*tpsprof_[a-z_0-9:]+`)
	n, recorded := 0, 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range re.FindAllString(tg.Expr, -1) {
				n++
				if strings.Contains(name, ":") {
					recorded++
				}
				if !known[name] {
					t.Errorf("panel %q queries %s, which nothing exposes or records", p.Title, name)
				}
			}
		}
	}
	if recorded < 4 {
		t.Errorf("only %d recorded series in the dashboard (the SLO and communication panels use them)", recorded)
	}
	if n < 15 {
		t.Errorf("only %d metric references found in the dashboard", n)
	}
}

var descName = regexp.MustCompile(`fqName: "([a-z_]+)"`)

func describe(regs ...*prometheus.Registry) []string {
	var out []string
	for _, r := range regs {
		ch := make(chan *prometheus.Desc, 1024)
		// A registry is a Collector of its collectors.
		go func() { r.Describe(ch); close(ch) }()
		for d := range ch {
			if m := descName.FindStringSubmatch(d.String()); m != nil && strings.HasPrefix(m[1], "tpsprof_") {
				out = append(out, m[1])
			}
		}
	}
	return out
}
