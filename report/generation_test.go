package report

import (
	"math"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// Two runs whose tokenizers differ: the comparison says step TPS does not
// compare and gives text bytes/s instead.
func TestCompareByBytesWhenTokenizersDiffer(t *testing.T) {
	mk := func(job string, tps_, bps, tpb float64) *Report {
		return &Report{Job: job, Summary: tps.Summary{SteadySteps: 10, WorldSize: 8, TPS: tps.Dist{Mean: tps_, P50: tps_}, Tokens: 1000},
			Text: &TextRate{Steps: 10, BytesPerSecond: bps, TokensPerByte: tpb}}
	}
	// B's tokenizer packs more text per token: fewer tokens/s, more text/s.
	a, b := mk("a", 400e3, 1.6e6, 0.25), mk("b", 360e3, 1.8e6, 0.20)
	c := Compare(a, b)
	var notes = strings.Join(c.Notes, "\n")
	if !strings.Contains(notes, "tokenizers differ (0.250 and 0.200 tokens per byte") || !strings.Contains(notes, "+12.5%") {
		t.Errorf("notes:\n%s", notes)
	}
	found := false
	for _, r := range c.Rows {
		if r.Name == "text bytes/s" {
			found = true
			if r.DeltaPct == nil || math.Abs(*r.DeltaPct-12.5) > 1e-9 {
				t.Errorf("bytes/s row %+v", r)
			}
		}
	}
	if !found {
		t.Error("no text bytes/s row")
	}
	// Same tokenizer: no such note.
	if c := Compare(a, mk("c", 380e3, 1.52e6, 0.25)); strings.Contains(strings.Join(c.Notes, " "), "tokenizers") {
		t.Errorf("a note about tokenizers for one tokenizer: %v", c.Notes)
	}
}
