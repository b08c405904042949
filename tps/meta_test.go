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

// The hook families the Python package installed: the latest record
// whole; those off listed with why; too many or unprintable refused.
func TestHooksRecord(t *testing.T) {
	var m RunMeta
	m.Merge(RunMeta{Hooks: map[string]string{"communication": "functions", "loss": "on"}})
	m.Merge(RunMeta{TokenSource: "loader"})
	if m.Hooks["communication"] != "functions" || len(m.HooksOff()) != 0 || m.CheckUnmeasured() != nil {
		t.Fatalf("%+v", m)
	}
	m.Merge(RunMeta{Hooks: map[string]string{"communication": "off: RuntimeError: no dispatcher", "loss": "on", "pipelining": "off: not available"}})
	if off := m.HooksOff(); len(off) != 2 || off[0] != "communication: RuntimeError: no dispatcher" || off[1] != "pipelining: not available" {
		t.Errorf("off %q", off)
	}
	many := map[string]string{}
	for i := range maxHookFamilies + 1 {
		many[strings.Repeat("x", i+1)] = "on"
	}
	for _, bad := range []map[string]string{many, {"loss": "a\x00b"}, {"": "on"}, {"loss": strings.Repeat("x", MaxUnmeasuredWhy+1)}} {
		if (&RunMeta{Hooks: bad}).CheckUnmeasured() == nil {
			t.Errorf("%d hooks accepted", len(bad))
		}
	}
}
