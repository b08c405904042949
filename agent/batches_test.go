package agent

import (
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// The identical-batches check: tensor-parallel peers (one dp_rank) may share
// batches; replicas may not, from the third identical step on, said once;
// a chance match at one step is not enough; steps past the window are not
// compared.
func TestIdenticalBatchesCheck(t *testing.T) {
	dp := func(v int32) *int32 { return &v }
	rec := func(step, rank int64, dpRank *int32) *tps.StepRecord {
		return &tps.StepRecord{Job: "j", Step: step, Rank: rank, WorldSize: 4, DPRank: dpRank}
	}
	var b batchCheck
	// ranks 0,1 one replica (tp peers), 2,3 the other: same batch within a replica only
	for s := int64(0); s < 6; s++ {
		for r := int64(0); r < 4; r++ {
			fp := map[bool]string{true: "a", false: "b"}[r < 2] + string(rune('0'+s))
			if msg := b.see(rec(s, r, dp(int32(r/2))), fp); msg != "" {
				t.Fatalf("step %d rank %d: warned for tensor-parallel peers: %s", s, r, msg)
			}
		}
	}
	// no layout: ranks 0 and 1 identical at steps 0, 2, 3 (one chance match
	// would not do); the warning comes at the third, once
	var c batchCheck
	var got []string
	for s := int64(0); s < 8; s++ {
		for r := int64(0); r < 2; r++ {
			fp := "x" + string(rune('0'+s))
			if s == 1 && r == 1 {
				fp = "other"
			}
			if msg := c.see(rec(s, r, nil), fp); msg != "" {
				got = append(got, msg)
				if s != 3 {
					t.Errorf("warned at step %d, want at step 3 (the third identical one)", s)
				}
			}
		}
	}
	if len(got) != 1 || !strings.Contains(got[0], "ranks 0 and 1 trained on identical batches at 3 of the first steps") || !strings.Contains(got[0], "declares no layout") {
		t.Errorf("warnings %q", got)
	}
	// past the window nothing is compared, and what was held is let go
	var d batchCheck
	d.see(rec(100, 0, nil), "first")
	for s := int64(100 + batchSteps); s < 100+batchSteps+4; s++ {
		for r := int64(0); r < 2; r++ {
			if msg := d.see(rec(s, r, nil), "same"); msg != "" {
				t.Errorf("step %d compared past the window: %s", s, msg)
			}
		}
	}
	if j := d.jobs[batchKey{"j", 0}]; j.steps != nil {
		t.Errorf("the window's fingerprints still held past it")
	}
}
