package cli

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/tpsprof/tpsprof/fleet"
	"github.com/tpsprof/tpsprof/report"
)

func runNodes(args []string, stdout, stderr io.Writer) int {
	const cmd = "nodes"
	fs := newFlagSet(cmd, "nodes [flags] OUT_DIR", `  tpsprof nodes traces                 # hosts ranked: drain candidates first, then by GPU-hours lost
  tpsprof nodes --since 168h traces    # the jobs of the last week only
  tpsprof nodes --json traces | jq '.nodes[] | select(.drain_candidate)'
  tpsprof nodes --markdown traces >> fleet-review.md
`, stderr)
	asJSON := fs.Bool("json", false, "print JSON (every node, with its evidence)")
	asMD := fs.Bool("markdown", false, "print a Markdown table")
	since := fs.String("since", "", "only jobs that ended at or after this time (RFC 3339, or a duration before now: 168h)")
	top := fs.Int("top", 20, "hosts listed in text and Markdown beyond the drain candidates (JSON lists all)")
	noKeep := fs.Bool("no-keep", false, "do not keep the jobs' node rows in OUT_DIR/nodes/ (a read-only folder; every job is read again)")
	dirs, code, ok := parseWithFolders(fs, args, stderr)
	if !ok {
		return code
	}
	if len(dirs) != 1 {
		return usageErr(stderr, cmd, "give one output folder (the collector's --out), got %d", len(dirs))
	}
	if *asJSON && *asMD {
		return usageErr(stderr, cmd, "--json and --markdown: give one")
	}
	if *top < 0 {
		return usageErr(stderr, cmd, "--top: 0 or more hosts")
	}
	opt := fleet.DefaultOptions()
	if *since != "" {
		t, err := report.ParseTime(*since, time.Now())
		if err != nil {
			return usageErr(stderr, cmd, "--since: %s", err)
		}
		opt.Since = t
	}
	out := dirs[0]
	if report.IsJobDir(out) {
		return usageErr(stderr, cmd, "%s is a job's folder: give the output folder that holds the jobs (its parent)", out)
	}
	s, err := fleet.ScanDir(out, !*noKeep)
	if err != nil && s != nil && !*noKeep {
		fmt.Fprintf(stderr, "tpsprof nodes: %v; going on without keeping them (--no-keep)\n", err)
		s, err = fleet.ScanDir(out, false)
	}
	if err != nil {
		failErr(stderr, cmd, err)
		return exitError
	}
	if s.Jobs == 0 && s.Running == 0 && len(s.Failed) == 0 {
		failErr(stderr, cmd, fmt.Errorf("no job folders in %s (the collector's --out holds one folder per job)", out))
		return exitError
	}
	nodes := fleet.Health(s.Rows, opt)
	for job, why := range s.Failed {
		fmt.Fprintf(stderr, "tpsprof nodes: job %s left out: %s\n", job, why)
	}
	for job, why := range s.Unreadable {
		fmt.Fprintf(stderr, "tpsprof nodes: job %s's kept node rows unreadable, read again from its folder: %s\n", job, why)
	}
	if s.KeepFailed > 0 {
		fmt.Fprintf(stderr, "tpsprof nodes: %d job(s)' node rows not kept: %s\n", s.KeepFailed, s.KeepErr)
	}
	switch {
	case *asJSON:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err := enc.Encode(struct {
			Out     string            `json:"out"`
			Jobs    int               `json:"jobs"`
			Running int               `json:"running"`
			Failed  map[string]string `json:"failed,omitempty"`
			Rules   fleet.Options     `json:"rules"`
			Nodes   []fleet.Node      `json:"nodes"`
		}{out, s.Jobs, s.Running, s.Failed, opt, nodes})
		if err != nil {
			failErr(stderr, cmd, fmt.Errorf("encoding the nodes: %w", err))
			return exitError
		}
	case *asMD:
		writeNodesMarkdown(stdout, nodes, s, *top)
	default:
		writeNodesText(stdout, out, nodes, s, *top)
	}
	return exitOK
}

// shownNodes are the drain candidates and the next top hosts.
func shownNodes(nodes []fleet.Node, top int) []fleet.Node {
	n := 0
	for n < len(nodes) && nodes[n].Drain {
		n++
	}
	return nodes[:min(len(nodes), n+top)]
}

func drainCount(nodes []fleet.Node) int {
	n := 0
	for _, x := range nodes {
		if x.Drain {
			n++
		}
	}
	return n
}

func verdictText(n fleet.Node) string {
	if n.Drain {
		return "DRAIN: " + n.Why
	}
	if n.Held != "" {
		return "ok (held: " + n.Held + ")"
	}
	return "ok"
}

func writeNodesText(w io.Writer, out string, nodes []fleet.Node, s *fleet.Scan, top int) {
	fmt.Fprintf(w, "nodes of %s: %d hosts over %d finished jobs, %d drain candidate(s)", out, len(nodes), s.Jobs, drainCount(nodes))
	if s.Running > 0 {
		fmt.Fprintf(w, "; %d job(s) running, left for later", s.Running)
	}
	fmt.Fprintln(w)
	if len(nodes) == 0 {
		fmt.Fprintln(w, "no job with 2 or more ranks named its nodes: a node is slow only against peers")
		return
	}
	fmt.Fprintln(w, "excess: the host's slowest rank's own time (compute and data) over each job's median rank, decayed over its jobs;")
	fmt.Fprintln(w, "GPU-h lost: the other ranks' waiting for it in the steps it was the slowest (docs/nodes.md)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tJOBS\tSLOW\tEXCESS\tGPU-H LOST\tWORST GPU\tLAST JOB\tVERDICT")
	shown := shownNodes(nodes, top)
	for _, n := range shown {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%+.1f%%\t%.3f\t%s\t%s\t%s\n", n.Host, n.Jobs, n.SlowJobs, 100*n.Score, n.CostGPUHours,
			cmp.Or(n.Worst, "-"), n.LastJob, verdictText(n))
	}
	tw.Flush()
	if len(shown) < len(nodes) {
		fmt.Fprintf(w, "(%d more hosts: --top N, or --json for all)\n", len(nodes)-len(shown))
	}
}

func writeNodesMarkdown(w io.Writer, nodes []fleet.Node, s *fleet.Scan, top int) {
	fmt.Fprintf(w, "## Nodes: %d hosts over %d finished jobs, %d drain candidate(s)\n\n", len(nodes), s.Jobs, drainCount(nodes))
	fmt.Fprintln(w, "| host | jobs | slow | excess | GPU-h lost | worst GPU | last job | verdict |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---|---|---|")
	for _, n := range shownNodes(nodes, top) {
		fmt.Fprintf(w, "| %s | %d | %d | %+.1f%% | %.3f | %s | %s | %s |\n", report.MarkdownCell(n.Host), n.Jobs, n.SlowJobs, 100*n.Score, n.CostGPUHours,
			report.MarkdownCell(cmp.Or(n.Worst, "-")), report.MarkdownCell(n.LastJob), report.MarkdownCell(verdictText(n)))
	}
}
