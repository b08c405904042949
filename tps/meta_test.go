package tps

import (
	"strings"
	"testing"
)

// The measures a job could not take: merged as they are said, one by one;
// unknown measures and unprintable or long reasons refused.
func TestUnmeasured(t *testing.T) {
	var m RunMeta
	m.Merge(RunMeta{Unmeasured: map[string]string{"counted_flops": "torch 1.13.1 has no FlopCounterMode"}})
	m.Merge(RunMeta{TokenSource: "loader"})
	m.Merge(RunMeta{Unmeasured: map[string]string{"memory": "no CUDA"}})
	if len(m.Unmeasured) != 2 || m.TokenSource != "loader" || m.CheckUnmeasured() != nil {
		t.Fatalf("%+v", m)
	}
	if w, ok := UnmeasuredText("counted_flops"); !ok || w == "" {
		t.Error("no words for counted_flops")
	}
	for _, bad := range []map[string]string{{"nonsense": "x"}, {"memory": "a\x00b"}, {"memory": strings.Repeat("x", MaxUnmeasuredWhy+1)}} {
		if (&RunMeta{Unmeasured: bad}).CheckUnmeasured() == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
