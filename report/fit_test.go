package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// A fit that explains little of the TPS variance is not quoted as a cost
// per point of communication (a real run's R² 0.04 used to be).
func TestWeakFitSaysNoRelation(t *testing.T) {
	for _, c := range []struct {
		r2   float64
		want string
	}{{0.04, "no relation found"}, {0.8, "each point of exposed communication costs"}} {
		r := &Report{Job: "j", Summary: tps.Summary{Steps: 10, SteadySteps: 10}, CommFit: CommFit{Slope: -2e5, Intercept: 1e5, R2: c.r2}}
		var b bytes.Buffer
		if err := WriteText(&b, r); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("R² %.2f: %q not in\n%s", c.r2, c.want, b.String())
		}
	}
}

// Names from the run (node, model, GPU, job) are escaped in Markdown: a
// node named "<script>" renders as text, a pipe cannot break the table.
func TestMarkdownEscapesNames(t *testing.T) {
	r := &Report{Job: "j<b>", Summary: tps.Summary{Steps: 1, SteadySteps: 1},
		Meta:  &tps.RunMeta{ModelPreset: "<script>alert(1)</script>", GPU: "a|b"},
		Nodes: []tps.NodeScore{{Node: "<img src=x onerror=alert(1)>", Score: 0.5, Straggler: true}}}
	var b bytes.Buffer
	if err := WriteMarkdown(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, bad := range []string{"<script>", "<img", "<b>", "a|b"} {
		if strings.Contains(out, bad) {
			t.Errorf("%q in the Markdown:\n%s", bad, out)
		}
	}
	if !strings.Contains(out, "&lt;script&gt;") || !strings.Contains(out, `a\|b`) {
		t.Errorf("names not escaped:\n%s", out)
	}
}
